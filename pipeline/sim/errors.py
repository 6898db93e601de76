"""The simulator side's one base exception for bad inputs."""

from __future__ import annotations

from pipeline.errors import AuthpipeError


class ScorecardError(AuthpipeError):
    """An input of the scorecard (truth, decisions, alerts) is missing or malformed."""
