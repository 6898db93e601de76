"""The one validator of each check input, shared by the view's ``check`` and the HTTP
request parsers: each raises ``CheckInputError`` naming the input's HTTP parameter.

The bounds keep what a caller can make the edge hold or parse small: ``account`` as long
as ``login_attempt`` allows (320), devices and sessions 256, a peer address 64, and an
X-Forwarded-For chain of at most 64 hops of 64 characters, 2,048 in all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

from pipeline.contracts.models import TENANT_RULE, Flow, valid_tenant
from pipeline.edge.errors import CheckInputError

FLOWS = frozenset(get_args(Flow))
FLOW_RULE = "must be one of " + ", ".join(get_args(Flow))
"""The contract's ``Flow`` literal, in its order: the message cannot drift from it."""
ACCOUNT_MAX_CHARS = 320
HANDLE_MAX_CHARS = 256
IP_MAX_CHARS = 64
FORWARDED_MAX_HOPS = 64
FORWARDED_MAX_CHARS = 2048
FORWARDED_MAX_HOP_CHARS = 64


def require_tenant(tenant: object, parameter: str = "tenant") -> str:
    """``tenant`` if it is valid (``contracts.models.valid_tenant``, the one rule)."""
    if not valid_tenant(tenant):
        raise CheckInputError(parameter, TENANT_RULE)
    return tenant  # type: ignore[return-value]


def require_flow(flow: object, parameter: str = "flow") -> str:
    """``flow`` if it is one of the attempt flows."""
    if flow not in FLOWS:
        raise CheckInputError(parameter, f"{parameter} {FLOW_RULE}")
    return flow  # type: ignore[return-value]


def require_trusted(trusted: object, parameter: str = "trusted") -> bool:
    """``trusted`` if it is a boolean (the query text ``true``/``false`` is read as one
    first)."""
    if trusted.__class__ is not bool:
        raise CheckInputError(parameter, f"{parameter} must be true or false")
    return trusted


def require_account(account: object) -> str:
    """The account as typed: 1 to 320 characters (normalisation may still find it blank)."""
    if not isinstance(account, str) or not 1 <= len(account) <= ACCOUNT_MAX_CHARS:
        raise CheckInputError("account", "account must be a string of 1 to 320 characters")
    return account


def require_ip(source_ip: object) -> str:
    """The peer's address text: 1 to 64 characters (parsed by the normaliser)."""
    if not isinstance(source_ip, str) or not source_ip or len(source_ip) > IP_MAX_CHARS:
        raise CheckInputError("ip", "ip must be an IPv4 or IPv6 address")
    return source_ip


def require_handle(parameter: str, value: object) -> str:
    """A device or session identifier: 1 to 256 characters."""
    if not isinstance(value, str) or not 1 <= len(value) <= HANDLE_MAX_CHARS:
        raise CheckInputError(parameter, f"{parameter} must be a string of 1 to 256 characters")
    return value


def forwarded_chars(forwarded_for: str | tuple[str, ...]) -> int:
    """The length of ``forwarded_for`` as text (a tuple counted as joined by commas)."""
    if isinstance(forwarded_for, str):
        return len(forwarded_for)
    return sum(map(len, forwarded_for)) + max(0, len(forwarded_for) - 1)


def split_forwarded(forwarded_for: str | Sequence[str]) -> tuple[str, ...]:
    """``forwarded_for`` as hops: a comma-separated header value or a sequence of strings
    (header lines or hops: an entry holding commas is split on them, as the header value
    is, and as ``pipeline.core.normalise.client_address`` reads it); at most ``FORWARDED_MAX_HOPS`` hops of ``FORWARDED_MAX_HOP_CHARS`` characters each and
    ``FORWARDED_MAX_CHARS`` in all (a caller cannot make the edge keep or parse more)."""
    if isinstance(forwarded_for, str):
        total = len(forwarded_for)
        if total <= FORWARDED_MAX_CHARS:
            hops = tuple(hop.strip() for hop in forwarded_for.split(",") if hop.strip())
    else:
        hops = tuple(forwarded_for)
        if not all(isinstance(hop, str) for hop in hops):
            raise CheckInputError("forwarded_for", "forwarded_for entries must be strings")
        total = forwarded_chars(hops)
        if total <= FORWARDED_MAX_CHARS and any("," in hop for hop in hops):
            hops = split_forwarded(",".join(hops))
    if total > FORWARDED_MAX_CHARS:
        raise CheckInputError(
            "forwarded_for", f"forwarded_for is longer than {FORWARDED_MAX_CHARS} characters"
        )
    if len(hops) > FORWARDED_MAX_HOPS:
        raise CheckInputError("forwarded_for", "forwarded_for has more than 64 addresses")
    if any(len(hop) > FORWARDED_MAX_HOP_CHARS for hop in hops):
        raise CheckInputError(
            "forwarded_for",
            f"a forwarded_for entry is longer than {FORWARDED_MAX_HOP_CHARS} characters",
        )
    return hops
