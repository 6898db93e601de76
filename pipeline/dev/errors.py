"""The development tooling's one base exception and its kinds."""

from __future__ import annotations

from pipeline.errors import AuthpipeError


class StackError(AuthpipeError):
    """The local Kafka broker could not be prepared, started or stopped."""


class MissingToolError(StackError):
    """``java`` or ``mvn`` is not installed (or too old)."""


class BrokerStartError(StackError):
    """The broker process exited or did not become ready in time."""
