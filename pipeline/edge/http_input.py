"""HTTP requests as the edge's inputs: query parameters and JSON bodies as a
``CheckRequest`` (shape only: the view validates values through ``pipeline.edge.inputs``)
or a block-list ``FeedQuery``. Every refusal is a ``CheckInputError`` naming the
parameter (prefixed with the check's place in a batch, ``[3].ip``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from multidict import MultiMapping

from pipeline.edge.blocklist import FORMATS, FeedQuery
from pipeline.edge.errors import CheckInputError
from pipeline.edge.inputs import require_flow, require_tenant, require_trusted

CHECK_FIELDS = frozenset(
    {"tenant", "account", "ip", "forwarded_for", "device", "session", "trusted", "flow"}
)
SESSION_FIELDS = frozenset(
    {"tenant", "account", "ip", "forwarded_for", "device", "signed_in_at_ms"}
)
FEED_FIELDS = frozenset({"format", "include", "tenant", "wait_ms"})
EVENTS_FIELDS = frozenset({"format", "include", "tenant"})
WAIT_MAX_MS = 60_000
_DIGITS = re.compile(r"[0-9]{1,5}")
_EPOCH_MS = re.compile(r"[0-9]{1,15}")
_QUERY_BOOLEANS = {"true": True, "false": False}


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """One check, validated for shape (the view validates values)."""

    tenant: str
    account: str
    ip: str
    forwarded_for: str | tuple[str, ...]
    device: str | None
    session: str | None
    trusted: bool
    flow: str


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """One session review (``GET /v1/session``), validated for shape."""

    tenant: str
    account: str
    ip: str
    forwarded_for: str
    device: str | None
    signed_in_ms: int


def _single(query: MultiMapping[str], name: str) -> str | None:
    values = query.getall(name, ())
    if len(values) > 1:
        raise CheckInputError(name, f"{name} is given {len(values)} times; give it once")
    return values[0] if values else None


def _reject_unknown(names: Iterable[str], allowed: frozenset[str], prefix: str = "") -> None:
    for name in names:
        if name not in allowed:
            label = str(name)[:40]
            raise CheckInputError(
                f"{prefix}{label}",
                f"unknown parameter {label!r}; known: {', '.join(sorted(allowed))}",
            )


def _parse_trusted(text: str | None, parameter: str = "trusted") -> bool:
    """The query's ``trusted``: absent, ``true`` or ``false``."""
    if text is None:
        return False
    return require_trusted(_QUERY_BOOLEANS.get(text, text), parameter)


def _parse_flow(text: str | None, parameter: str = "flow") -> str:
    return "login" if text is None else require_flow(text, parameter)


def _required(value: str | None, parameter: str, what: str) -> str:
    if not value:
        raise CheckInputError(parameter, f"{parameter} is required ({what})")
    return value


def parse_check_query(query: MultiMapping[str]) -> CheckRequest:
    """A check from query parameters; raises CheckInputError."""
    _reject_unknown(query.keys(), CHECK_FIELDS)
    return check_request(lambda name: _single(query, name))


def check_request(field: Callable[[str], str | None]) -> CheckRequest:
    """A check from ``field(name)``, a query parameter's value (None: not given); raises
    CheckInputError, naming the first bad parameter in the order read here."""
    tenant = field("tenant")
    return CheckRequest(
        tenant="default" if tenant is None else tenant,
        account=_required(field("account"), "account", "the identifier as typed"),
        ip=_required(field("ip"), "ip", "the TCP peer address"),
        forwarded_for=field("forwarded_for") or (),
        device=field("device") or None,
        session=field("session") or None,
        trusted=_parse_trusted(field("trusted")),
        flow=_parse_flow(field("flow")),
    )


def parse_session_query(query: MultiMapping[str]) -> SessionRequest:
    """A session review from query parameters; raises CheckInputError."""
    _reject_unknown(query.keys(), SESSION_FIELDS)
    tenant = _single(query, "tenant")
    signed_in = _required(
        _single(query, "signed_in_at_ms"), "signed_in_at_ms", "the sign-in time, epoch ms"
    )
    if not _EPOCH_MS.fullmatch(signed_in):
        raise CheckInputError(
            "signed_in_at_ms", "signed_in_at_ms must be the sign-in time in epoch milliseconds"
        )
    return SessionRequest(
        tenant="default" if tenant is None else tenant,
        account=_required(_single(query, "account"), "account", "the identifier as typed"),
        ip=_required(_single(query, "ip"), "ip", "the TCP peer address"),
        forwarded_for=_single(query, "forwarded_for") or "",
        device=_single(query, "device") or None,
        signed_in_ms=int(signed_in),
    )


def _json_text(body: Mapping[str, Any], name: str, prefix: str) -> str | None:
    value = body.get(name)
    if value is None or isinstance(value, str):
        return value
    raise CheckInputError(prefix + name, f"{prefix}{name} must be a string")


def _json_hops(value: object, parameter: str) -> str | tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(hop, str) for hop in value):
        return tuple(value)
    raise CheckInputError(parameter, f"{parameter} must be a string or a list of strings")


def parse_check_json(body: object, prefix: str = "") -> CheckRequest:
    """A check from a JSON object; ``prefix`` names its place in a batch; raises CheckInputError."""
    if not isinstance(body, dict):
        raise CheckInputError(prefix.rstrip(".") or "body", "a check must be a JSON object")
    _reject_unknown(body.keys(), CHECK_FIELDS, prefix)
    trusted = require_trusted(body.get("trusted", False), prefix + "trusted")
    tenant = _json_text(body, "tenant", prefix)
    return CheckRequest(
        tenant="default" if tenant is None else tenant,
        account=_required(_json_text(body, "account", prefix), prefix + "account", "a string"),
        ip=_required(_json_text(body, "ip", prefix), prefix + "ip", "the TCP peer address"),
        forwarded_for=_json_hops(body.get("forwarded_for"), prefix + "forwarded_for"),
        device=_json_text(body, "device", prefix) or None,
        session=_json_text(body, "session", prefix) or None,
        trusted=trusted,
        flow=_parse_flow(_json_text(body, "flow", prefix), prefix + "flow"),
    )


def parse_feed_query(query: MultiMapping[str], allowed: frozenset[str]) -> tuple[FeedQuery, int]:
    """The block-list query and the long-poll wait in ms; raises CheckInputError."""
    _reject_unknown(query.keys(), allowed)
    fmt = _single(query, "format") or "json"
    if fmt not in FORMATS:
        raise CheckInputError("format", f"format must be one of {', '.join(FORMATS)}")
    include = _single(query, "include")
    if include not in (None, "", "observe"):
        raise CheckInputError("include", "include must be 'observe' (or absent)")
    tenant = _single(query, "tenant") or None
    if tenant is not None:
        require_tenant(tenant)
    wait_text = _single(query, "wait_ms") or "0"
    if not _DIGITS.fullmatch(wait_text) or int(wait_text) > WAIT_MAX_MS:
        raise CheckInputError("wait_ms", f"wait_ms must be an integer from 0 to {WAIT_MAX_MS}")
    return FeedQuery(fmt, include == "observe", tenant), int(wait_text)


async def json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise CheckInputError("body", "the body is not valid JSON") from None
