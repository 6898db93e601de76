"""Errors of the pure core."""

from pipeline.errors import AuthpipeError


class CoreError(AuthpipeError):
    """Base of the core's errors."""


class InvalidAttempt(CoreError):
    """An attempt that cannot be normalised; ``reason`` is a stable machine-readable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class PolicyError(CoreError):
    """A policy document is invalid."""
