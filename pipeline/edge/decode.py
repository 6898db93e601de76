"""The decisions topic's messages as the view keeps them: ``decode_key`` (the Kafka key)
and ``decode_decision`` (the value). Both raise the contracts' ``DecodeError`` with a
stable ``reason`` (``bad_key``, ``bad_source``, ``not_json``, ``key_mismatch``,
``bad_value``); neither does I/O or reads the clock.

Only the fields enforcement needs are checked; a value's extra fields are ignored, so a
newer worker's decisions still apply."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any, get_args

import orjson

from pipeline.contracts.codec import DecodeError
from pipeline.contracts.models import Scope, datetime_to_ms
from pipeline.core.decisions import Active
from pipeline.core.keys import Key, parse_key
from pipeline.edge.blocklist import valid_source

SCOPES = frozenset(get_args(Scope))
ACTIONS = frozenset({"block", "observe"})


def decode_key(raw: bytes | None, ipv4_prefix: int = 32, ipv6_prefix: int = 64) -> tuple[Key, str]:
    """A Kafka key as a decision key and its text; raises DecodeError("bad_key"/"bad_source").
    A source wider than the grouping (``ipv4_prefix``/``ipv6_prefix``) is a bad source."""
    if not raw:
        raise DecodeError("bad_key", "the message has no key")
    try:
        text = raw.decode("utf-8")
        scope, tenant, account, source, device = parse_key(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecodeError("bad_key", str(exc)[:200]) from None
    if scope not in SCOPES:
        raise DecodeError("bad_key", f"unknown scope {scope[:40]!r}")
    if scope == "source" and not (source and valid_source(source, ipv4_prefix, ipv6_prefix)):
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


def _text_field(value: dict[str, Any], name: str) -> str:
    text = value.get(name)
    if not isinstance(text, str) or not text:
        raise DecodeError("bad_value", f"field {name!r} is missing or not a non-empty string")
    return text


def _expires_ms(text: str) -> int:
    """``expires_at`` (RFC 3339 with an offset) as epoch ms; DecodeError("bad_value")."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise DecodeError("bad_value", f"expires_at {text[:40]!r} is not RFC 3339") from None
    if moment.tzinfo is None:
        raise DecodeError("bad_value", f"expires_at {text[:40]!r} has no UTC offset")
    return datetime_to_ms(moment)


def decode_decision(wire_key: str, raw: bytes) -> Active:
    """A decision value as the index keeps it; raises DecodeError("bad_value"/"not_json"/
    "key_mismatch"). ``key`` must equal the Kafka key."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise DecodeError("not_json", "the value is neither JSON nor null") from None
    if not isinstance(value, dict):
        raise DecodeError("not_json", "the value is not a JSON object")
    if value.get("key") != wire_key:
        raise DecodeError("key_mismatch", "the value's key differs from the message key")
    action = value.get("action")
    decision_id = value.get("decision_id")
    expires_at = value.get("expires_at")
    rule = value.get("rule")
    # The common case in one test; any miss re-checks field by field for the message.
    if not (
        action.__class__ is str
        and action in ACTIONS
        and decision_id.__class__ is str
        and decision_id
        and expires_at.__class__ is str
        and expires_at
        and rule.__class__ is str
        and rule
    ):
        action = _text_field(value, "action")
        if action not in ACTIONS:
            raise DecodeError("bad_value", f"action {action[:20]!r} is neither block nor observe")
        decision_id = _text_field(value, "decision_id")
        expires_at = _text_field(value, "expires_at")
        rule = _text_field(value, "rule")
    return Active(decision_id, action, _expires_ms(expires_at), rule)
