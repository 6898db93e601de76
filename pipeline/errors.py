"""The one base exception of the authpipe package."""


class AuthpipeError(Exception):
    """Base of every error authpipe raises on purpose.

    Messages say what was wrong and what to do about it.
    """


class ConfigError(AuthpipeError):
    """A settings file, environment variable or policy file is invalid."""
