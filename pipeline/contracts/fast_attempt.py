"""The msgspec twin of ``LoginAttempt``: the fast path of ``codec.decode_attempt``.

Invariant: an event ``decode_fast`` returns is one the pydantic model ``LoginAttempt``
accepts, with the same field values (so the same normalised attempt); for anything else it
returns None and the codec runs the model, which accepts the event or names its
dead-letter reason as it always did. The fast path may only be narrower than the model,
never wider, and the model stays the one definition of a valid event and of the published
schema. ``tests/unit/test_contracts_msgspec_parity.py`` holds both: a Hypothesis
differential test over valid and hostile input, and the Struct's JSON schema against the
model's.

Narrower where msgspec and pydantic read JSON differently:

* ``occurred_at`` only as ``YYYY-MM-DDTHH:MM:SS[.1-6 digits](Z|+HH:MM|-HH:MM)``, read by
  ``datetime.fromisoformat``: msgspec's own parser rounds a seventh fractional digit where
  pydantic truncates it, and pydantic takes forms msgspec does not (``HH:MM``, epoch
  seconds as text), which the model then reads;
* no unknown field (``forbid_unknown_fields``): msgspec skips an unknown field's value
  without the UTF-8 and nesting-depth checks pydantic's parser makes (``bad_utf8``,
  ``not_json``), so an event carrying fields this version does not know takes the model's
  path, which ignores them;
* ``tenant`` checked here against ``TENANT_PATTERN``, as the model's validator does, and
  ``user_agent`` cut to 512 characters, as the model does.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Final

import msgspec
from msgspec import Meta, Struct

from pipeline.contracts.models import (
    USER_AGENT_MAX_CHARS,
    ChallengeKind,
    FailureReason,
    Flow,
    Outcome,
    valid_tenant,
)

_RFC3339: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?(?:Z|[+-][0-9]{2}:[0-9]{2})"
).fullmatch
_Text128 = Annotated[str, Meta(min_length=1, max_length=128)]
_Text256 = Annotated[str, Meta(min_length=1, max_length=256)]
_Tenant = Annotated[str, Meta(min_length=1, max_length=64)]
_Account = Annotated[str, Meta(min_length=1, max_length=320)]
_PeerIp = Annotated[str, Meta(min_length=2, max_length=64)]
_Forwarded = Annotated[tuple[str, ...], Meta(max_length=64)]


class LoginAttemptStruct(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
    """``LoginAttempt``'s fields, types, bounds and defaults, as a msgspec Struct."""

    event_id: _Text128
    occurred_at: Annotated[datetime, Meta(tz=True)]
    tenant: _Tenant = "default"
    service: _Text128
    flow: Flow = "login"
    account: _Account
    peer_ip: _PeerIp
    forwarded_for: _Forwarded = ()
    device_id: _Text256 | None = None
    device_trusted: bool = False
    session_id: _Text256 | None = None
    outcome: Outcome
    failure_reason: FailureReason | None = None
    challenge: ChallengeKind | None = None
    user_agent: str | None = None


class _Wire(LoginAttemptStruct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
    """What msgspec decodes: ``occurred_at`` as its text, read into a datetime by
    ``decode_fast`` (so every event it returns is a ``LoginAttemptStruct`` as declared)."""

    occurred_at: str  # type: ignore[assignment]


_decode: Final = msgspec.json.Decoder(_Wire).decode
_set: Final = msgspec.structs.force_setattr
_parse_time: Final = datetime.fromisoformat


def decode_fast(raw: bytes) -> LoginAttemptStruct | None:
    """The event, or None where the model must decide (see the module docstring)."""
    try:
        event = _decode(raw)
    except msgspec.DecodeError:
        return None
    text = event.occurred_at
    tenant = event.tenant
    if _RFC3339(text) is None or (tenant != "default" and not valid_tenant(tenant)):
        return None
    try:
        _set(event, "occurred_at", _parse_time(text))
    except ValueError:  # a day, hour or offset out of range: the model names it
        return None
    agent = event.user_agent
    if agent is not None and len(agent) > USER_AGENT_MAX_CHARS:
        _set(event, "user_agent", agent[:USER_AGENT_MAX_CHARS])
    return event
