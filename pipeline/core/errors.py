"""Errors of the pure core."""

from pipeline.errors import AuthpipeError, Rejected


class CoreError(AuthpipeError):
    """Base of the core's errors other than refused input (``InvalidAttempt``)."""


class InvalidAttempt(Rejected):
    """An attempt that cannot be normalised; ``reason`` is a stable machine-readable code
    (the shape every package's refusal of bad input shares: ``pipeline.errors.Rejected``)."""


class PolicyError(CoreError):
    """A policy document is invalid."""
