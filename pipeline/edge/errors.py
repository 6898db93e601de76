"""The edge's errors: ``EdgeError`` is the base of every error the edge raises.

A message on the decisions topic that is not a valid decision raises the contracts'
``DecodeError`` (``reason``, ``detail``), as every decoder of a wire type does; the view
counts and logs it and never applies it."""

from __future__ import annotations

from pipeline.errors import AuthpipeError


class EdgeError(AuthpipeError):
    """Base of the edge's errors."""


class CheckInputError(EdgeError):
    """A check's or a request's input is malformed; ``parameter`` is its HTTP name (``ip``,
    ``device``, ``session``, ``forwarded_for``, ``account``, ``tenant``, ``trusted``,
    ``flow``, ``format``, ``wait_ms``, ``body``; in a batch prefixed with the check's
    place, ``[3].ip``), ``message`` says what is wrong. The service answers it 400."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.message = message
