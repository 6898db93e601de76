"""The one base exception of the authpipe package."""


class AuthpipeError(Exception):
    """Base of every error authpipe raises on purpose.

    Messages say what was wrong and what to do about it.
    """


class ConfigError(AuthpipeError):
    """A settings file, environment variable or policy file is invalid."""


class Rejected(AuthpipeError):
    """Input refused with a stable machine-readable ``reason`` code (what dead letters,
    metrics and HTTP errors carry) and a human ``detail`` saying what was wrong. Every
    package's "this input is bad" error is a subclass, so callers read one shape."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
