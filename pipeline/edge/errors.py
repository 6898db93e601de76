"""The edge's errors: ``EdgeError`` is the base of every error the edge raises.

Refused input has the one shape of ``pipeline.errors.Rejected`` (``reason``, ``detail``):
a check's or request's argument is a ``CheckInputError``; a message on the decisions
topic that is not a valid decision raises the contracts' ``DecodeError``, which the view
counts and logs and never applies."""

from __future__ import annotations

from pipeline.errors import AuthpipeError, Rejected


class EdgeError(AuthpipeError):
    """Base of the edge's errors."""


class CheckInputError(EdgeError, Rejected):
    """A check's or a request's input is malformed; ``reason`` (also ``parameter``) is its
    HTTP name (``ip``, ``device``, ``session``, ``forwarded_for``, ``account``, ``tenant``,
    ``trusted``, ``flow``, ``format``, ``wait_ms``, ``body``; in a batch prefixed with the
    check's place, ``[3].ip``), ``detail`` says what is wrong. The service answers it 400
    with both."""

    @property
    def parameter(self) -> str:
        """The HTTP parameter at fault: this error's ``reason``."""
        return self.reason
