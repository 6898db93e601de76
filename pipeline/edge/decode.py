"""The decisions topic's messages as the view keeps them: ``decode_key`` (the Kafka key)
and ``decode_decision`` (the value). Both raise the contracts' ``DecodeError`` with a
stable ``reason`` (``bad_key``, ``bad_source``, ``not_json``, ``key_mismatch``,
``bad_value``); neither does I/O or reads the clock.

A value is read by the one decision decoder (every field checked, as the sink reads it);
its extra fields are ignored, so a newer worker's decisions still apply."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import get_args

from pipeline.contracts.codec import DecodeError
from pipeline.contracts.codec import decode_decision as decode
from pipeline.contracts.models import Scope
from pipeline.core.decisions import Active, evidence_since_ms
from pipeline.core.keys import Key, parse_wire_key
from pipeline.core.normalise import Network
from pipeline.edge.blocklist import valid_source

SCOPES = frozenset(get_args(Scope))


def decode_key(
    raw: bytes | None,
    ipv4_prefix: int = 32,
    ipv6_prefix: int = 64,
    nat64_prefixes: Sequence[Network] = (),
) -> tuple[Key, str]:
    """A Kafka key as a decision key and its text; raises DecodeError("bad_key"/"bad_source").
    A key whose tenant fails the one tenant validator is a bad key; a source wider than the
    grouping (``ipv4_prefix``/``ipv6_prefix``), or written in IPv6 where ingest counts IPv4
    (``nat64_prefixes`` too), is a bad source."""
    if not raw:
        raise DecodeError("bad_key", "the message has no key")
    try:
        text = raw.decode("utf-8")
        scope, tenant, account, source, device = parse_wire_key(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecodeError("bad_key", str(exc)[:200]) from None
    if scope not in SCOPES:
        raise DecodeError("bad_key", f"unknown scope {scope[:40]!r}")
    if scope == "source" and not (
        source and valid_source(source, ipv4_prefix, ipv6_prefix, nat64_prefixes)
    ):
        raise DecodeError(
            "bad_source",
            f"source {str(source)[:64]!r} is not an address or CIDR no wider than one source",
        )
    # Interned key parts: the check's keys and the index's keys then share their strings, so
    # comparing them on lookup is an identity test instead of reading two cold strings.
    intern = sys.intern
    key: Key = (
        intern(scope),
        intern(tenant),
        intern(account) if account else None,
        intern(source) if source else None,
        intern(device) if device else None,
    )
    return key, text


# The contracts decoder's reasons as the edge has always counted them (its metrics and
# logs); every field fault is ``bad_value``.
_EDGE_REASON = {
    "empty": "not_json",
    "not_json": "not_json",
    "not_object": "not_json",
    "key_mismatch": "key_mismatch",
}


def decode_decision(wire_key: str, raw: bytes, source_ok: Callable[[str], bool]) -> Active:
    """A decision value as the index keeps it, read by the one decision decoder
    (``pipeline.contracts.codec.decode_decision``, with ``key`` equal to the Kafka key);
    raises DecodeError("bad_value"/"not_json"/"key_mismatch")."""
    try:
        value = decode(raw, source_ok=source_ok, key=wire_key)
    except DecodeError as exc:
        raise DecodeError(_EDGE_REASON.get(exc.reason, "bad_value"), exc.detail) from None
    # A handful of distinct actions, rules and challenges across every record: interned,
    # each is held once, not once per decision (a familiar exempt per (account, place)
    # makes the records many: bench/README.md, "The edge's familiar exempts").
    intern = sys.intern
    challenge = value.challenge
    return Active(
        value.decision_id,
        intern(value.action),
        value.expires_at_ms,
        intern(value.rule),
        intern(challenge) if challenge else None,
        evidence_since_ms(value.scope, value.issued_at_ms, value.window_ms),
    )
