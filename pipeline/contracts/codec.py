"""The one JSON codec: decoding attempts and decisions (with a classified reason when
they are bad) and encoding every output model.

Decoding an attempt runs msgspec's decoder (``fast_attempt``) and, for what it does not
accept, the model's ``TypeAdapter`` built once, which names the reason. A bad event raises
``DecodeError`` with a stable ``reason`` code that becomes the ``error`` header of its
dead letter:

==================  ==========================================================
``too_large``       more bytes than the configured maximum (default 16 KiB)
``empty``           a null or empty value
``bad_utf8``        the bytes are not UTF-8
``not_json``        not a JSON document
``not_object``      JSON, but not an object
``missing_field``   a required field is absent
``invalid_field``   a field has the wrong type or an invalid value
``future_timestamp``  ``occurred_at`` further in the future than the allowed skew
``past_timestamp``  ``occurred_at`` older than the allowed past skew, or before 1970
``key_mismatch``    a decision's ``key`` differs from its Kafka key
==================  ==========================================================

``decode_decision`` is the one reader of the decisions topic's values (the sink, the
edge): it raises the same ``DecodeError`` with ``empty``, ``not_json``, ``not_object``,
``missing_field``, ``invalid_field`` or ``key_mismatch``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NamedTuple, get_args

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from pipeline.contracts.fast_attempt import decode_fast
from pipeline.contracts.models import (
    Action,
    AppliesTo,
    AttemptInput,
    ChallengeKind,
    Decision,
    LoginAttempt,
    Scope,
    ms_to_datetime,
    parse_utc_ms,
)
from pipeline.errors import Rejected

LOGIN_ATTEMPT: TypeAdapter[LoginAttempt] = TypeAdapter(LoginAttempt)


class DecodeError(Rejected):
    """A message that is not a valid instance of its wire type (``login_attempt`` v1, a
    decision); ``reason`` is a stable code, ``detail`` says what was wrong."""


def decode_attempt(raw: bytes | None, *, max_bytes: int = 16384, fast: bool = True) -> AttemptInput:
    """Decode and validate one event value; raises DecodeError with a reason code.

    With ``fast`` (``ingest.decoder = "msgspec"``, the default) msgspec reads the event
    first (``pipeline.contracts.fast_attempt``: it accepts only what the model accepts, with
    the same values); what it does not accept, and every event without ``fast``, the
    pydantic model validates, so a dead letter's reason and detail are always the model's.
    """
    if not raw:
        raise DecodeError("empty", "the message value is null or empty")
    if len(raw) > max_bytes:
        raise DecodeError("too_large", f"{len(raw)} bytes is over the {max_bytes}-byte maximum")
    if fast:
        event = decode_fast(raw)
        if event is not None:
            return event
    try:
        return LOGIN_ATTEMPT.validate_json(raw)
    except ValidationError as exc:
        raise _classify(raw, exc) from None


def _classify(raw: bytes, exc: ValidationError) -> DecodeError:
    errors = exc.errors(include_url=False, include_input=False)
    kinds = {err["type"] for err in errors}
    if "json_invalid" in kinds:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            return DecodeError("bad_utf8", f"byte {bad.start} is not valid UTF-8")
        return DecodeError("not_json", errors[0]["msg"][:200])
    if "model_type" in kinds:
        return DecodeError("not_object", "the JSON value is not an object")
    missing = sorted(".".join(map(str, e["loc"])) for e in errors if e["type"] == "missing")
    if missing:
        return DecodeError("missing_field", "missing " + ", ".join(missing))
    detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:5])
    return DecodeError("invalid_field", detail[:500])


UINT32_MAX: Final = 4_294_967_295
UINT64_MAX: Final = 18_446_744_073_709_551_615
SCOPES: Final = frozenset(get_args(Scope))
APPLIES_TO: Final = frozenset(get_args(AppliesTo))
ACTIONS: Final = frozenset(get_args(Action))
CHALLENGES: Final = frozenset(get_args(ChallengeKind))
OPERATOR_MAX_CHARS: Final = 128
REASON_MAX_CHARS: Final = 512


class DecisionValue(NamedTuple):
    """A valid value of the decisions topic: ``Decision``'s fields, times as epoch ms.

    Invariants (``decode_decision`` checks them all): ``decision_id``, ``key``,
    ``tenant``, ``rule`` are non-empty strings; ``scope``, ``applies_to``, ``action`` are
    values of the model's literals; ``account_digest``, ``source``, ``device_id``,
    ``operator`` (at most 128 characters), ``reason`` (at most 512) are strings or None;
    ``count`` and ``threshold`` are in 0..2**32-1, ``window_ms`` in 0..2**64-1; a
    ``source``-scope decision has a source its reader accepts (no wider than the
    grouping). A NamedTuple: the edge decodes every decision, and a tuple is the cheapest
    frozen record to build.
    """

    decision_id: str
    key: str
    tenant: str
    scope: str
    account_digest: str | None
    source: str | None
    device_id: str | None
    applies_to: str
    action: str
    rule: str
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, as on the wire
    threshold: int
    window_ms: int
    issued_at_ms: int
    expires_at_ms: int
    policy_version: str
    operator: str | None
    reason: str | None
    challenge: str | None = None
    """What a ``challenge`` decision (or its observe-mode twin) demands; None otherwise."""


def decode_decision(
    raw: bytes | None, *, source_ok: Callable[[str], bool], key: str | None = None
) -> DecisionValue:
    """Decode and validate one decision value; raises DecodeError with a reason code.

    ``source_ok`` says whether a ``source``-scope decision's source is one source (the
    grouping check of ``pipeline.core.grouping``, which this layer cannot import: pass
    ``functools.partial(within_grouping, ipv4_prefix=…, ipv6_prefix=…)``). With ``key``
    (the Kafka key's text), the value's ``key`` must equal it. Unknown fields are ignored
    (a newer worker's decisions still read). A tombstone (null value) is not a decision:
    its reader takes the fields from the key (``pipeline.core.keys.parse_key``).
    """
    if not raw:
        raise DecodeError("empty", "the message value is null or empty")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError("not_json", str(exc)[:200]) from None
    if body.__class__ is not dict:
        raise DecodeError("not_object", "the JSON value is not an object")
    get = body.get
    wire_key = get("key")
    if key is not None and wire_key != key:
        raise DecodeError("key_mismatch", "the value's key differs from the message key")
    decision_id, tenant, scope, rule = get("decision_id"), get("tenant"), get("scope"), get("rule")
    account, source, device = get("account_digest"), get("source"), get("device_id")
    applies_to, action, policy_version = get("applies_to"), get("action"), get("policy_version")
    count, threshold, window_ms = get("count"), get("threshold"), get("window_ms")
    issued_at, expires_at, operator, reason, challenge = (
        get("issued_at"),
        get("expires_at"),
        get("operator"),
        get("reason"),
        get("challenge"),
    )
    # The common case in one expression; any miss re-checks field by field for the message.
    if not (
        decision_id.__class__ is str
        and decision_id
        and wire_key.__class__ is str
        and wire_key
        and tenant.__class__ is str
        and tenant
        and rule.__class__ is str
        and rule
        and scope.__class__ is str
        and scope in SCOPES
        and applies_to.__class__ is str
        and applies_to in APPLIES_TO
        and action.__class__ is str
        and action in ACTIONS
        and policy_version.__class__ is str
        and issued_at.__class__ is str
        and expires_at.__class__ is str
        and (account is None or account.__class__ is str)
        and (source is None or source.__class__ is str)
        and (device is None or device.__class__ is str)
        and (
            operator is None or (operator.__class__ is str and len(operator) <= OPERATOR_MAX_CHARS)
        )
        and (reason is None or (reason.__class__ is str and len(reason) <= REASON_MAX_CHARS))
        and count.__class__ is int
        and 0 <= count <= UINT32_MAX
        and threshold.__class__ is int
        and 0 <= threshold <= UINT32_MAX
        and window_ms.__class__ is int
        and 0 <= window_ms <= UINT64_MAX
        and (challenge is None or (challenge.__class__ is str and challenge in CHALLENGES))
    ):
        raise _explain(body)
    if action == "challenge" and challenge is None:
        raise DecodeError("invalid_field", "a challenge decision must name its challenge")
    try:
        issued_at_ms, expires_at_ms = parse_utc_ms(issued_at), parse_utc_ms(expires_at)
    except ValueError as exc:
        raise DecodeError("invalid_field", f"issued_at or expires_at: {exc}") from None
    if scope == "source" and not (source and source_ok(source)):
        raise DecodeError("invalid_field", f"source {str(source)[:64]!r} is wider than one source")
    return DecisionValue._make(  # _make: half the cost of the keyword-capable constructor
        (
            decision_id,
            wire_key,
            tenant,
            scope,
            account,
            source,
            device,
            applies_to,
            action,
            rule,
            count,
            threshold,
            window_ms,
            issued_at_ms,
            expires_at_ms,
            policy_version,
            operator,
            reason,
            challenge,
        )
    )


_REQUIRED_TEXT: Final = ("decision_id", "key", "tenant", "rule", "policy_version")
_LITERALS: Final = (("scope", SCOPES), ("applies_to", APPLIES_TO), ("action", ACTIONS))
_NULLABLE_TEXT: Final = (
    ("account_digest", None),
    ("source", None),
    ("device_id", None),
    ("operator", OPERATOR_MAX_CHARS),
    ("reason", REASON_MAX_CHARS),
)
_COUNTS: Final = (("count", UINT32_MAX), ("threshold", UINT32_MAX), ("window_ms", UINT64_MAX))
_REQUIRED: Final = (
    *_REQUIRED_TEXT,
    *(name for name, _ in _LITERALS),
    *(name for name, _ in _COUNTS),
    "issued_at",
    "expires_at",
)


def _explain(body: dict[str, Any]) -> DecodeError:
    """The first thing wrong with a decision value that is not well typed."""
    missing = [name for name in _REQUIRED if name not in body]
    if missing:
        return DecodeError("missing_field", "missing " + ", ".join(missing))
    for name in _REQUIRED_TEXT:
        value = body[name]
        if value.__class__ is not str or (value == "" and name != "policy_version"):
            what = "a string" if name == "policy_version" else "a non-empty string"
            return DecodeError("invalid_field", f"{name} is not {what}")
    for name, allowed in _LITERALS:
        if body[name].__class__ is not str or body[name] not in allowed:
            return DecodeError(
                "invalid_field", f"{name} {str(body[name])[:40]!r} is not one of {sorted(allowed)}"
            )
    for name, limit in _NULLABLE_TEXT:
        value = body.get(name)
        if value is not None and (value.__class__ is not str or len(value) > (limit or len(value))):
            return DecodeError(
                "invalid_field",
                f"{name} is not null or a string"
                + (f" of at most {limit} characters" if limit else ""),
            )
    for name, high in _COUNTS:
        value = body[name]
        if not (value.__class__ is int and 0 <= value <= high):
            return DecodeError("invalid_field", f"{name} is not an integer in 0..{high}")
    challenge = body.get("challenge")
    if challenge is not None and (challenge.__class__ is not str or challenge not in CHALLENGES):
        return DecodeError(
            "invalid_field", f"challenge {str(challenge)[:40]!r} is not one of {sorted(CHALLENGES)}"
        )
    return DecodeError("invalid_field", "issued_at or expires_at is not a string")


def encode(model: BaseModel) -> bytes:
    """A model as compact UTF-8 JSON (the wire form of every output)."""
    return model.__pydantic_serializer__.to_json(model)


_join = b"".join


def dumps(value: Any) -> bytes:
    """Plain data (internal envelopes, changelog records) as compact JSON, in a bytes
    object of its own size.

    orjson (3.12 and later) returns the buffer it wrote into, at least 4 kB and rounded up,
    without shrinking it: a 40-byte changelog record held until its envelope's outputs are
    acknowledged then holds 4 kB of heap. The worker keeps tens of thousands of them in
    flight (two or three changed keys per event, up to four envelopes per partition), which
    was most of B3's peak RSS (bench/README.md). The copy costs about 0.3 us.
    """
    return _join((orjson.dumps(value), b""))


def loads(raw: bytes) -> Any:
    """The inverse of ``dumps``."""
    return orjson.loads(raw)


def decision_model(value: DecisionValue) -> Decision:
    """A decoded decision as the pydantic model, for readers that keep or print models
    (the scorecard, ``authpipe decisions list``): the fields ``decode_decision`` checked,
    not validated twice."""
    fields = value._asdict()
    issued_ms, expires_ms = fields.pop("issued_at_ms"), fields.pop("expires_at_ms")
    return Decision.model_construct(
        **fields, issued_at=ms_to_datetime(issued_ms), expires_at=ms_to_datetime(expires_ms)
    )
