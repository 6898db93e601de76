"""Kafka messages of the four sink topics as table rows (pure: no I/O, no clock).

Each decoder turns one message into a ``Message``: its offset and the rows it yields in
its table's column order (``pipeline.sinks.tables``). A message that cannot be written
raises ``DecodeError`` (``pipeline.contracts.codec``) with a stable reason; the sink logs,
counts and skips it, deterministically (a replay skips it again). Audit rows that no
column can hold are kept on the ``Message`` as rejects for the quarantine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline.contracts.codec import (
    UINT32_MAX,
    UINT64_MAX,
    DecisionValue,
    DecodeError,
    decode_decision,
    loads,
)
from pipeline.contracts.models import AUDIT_COLUMNS, parse_utc_ms
from pipeline.core.keys import Key, parse_wire_key
from pipeline.sinks.ratecap import MINUTE_MS, TS_MS
from pipeline.sinks.tables import UINT16_MAX, LaneKind, decision_row
from pipeline.wiring import source_check

DEFAULT_GROUPING = source_check(32, 64)
"""The grouping check of the default ``[ingest]`` settings (no NAT64 prefixes)."""


@dataclass(slots=True)
class Message:
    """One decoded message of a lane: its offset and the table rows it yields."""

    offset: int
    rows: list[list[Any]]
    max_minute: int | None = None
    bad_rows: int = 0
    bad_reason: str | None = None
    rejects: list[tuple[str, Any]] = field(default_factory=list)  # (reason, row) to quarantine


def decode_record(kind: LaneKind, record: Any, source_ok: Callable[[str], bool]) -> Message:
    """A consumer record (``topic``, ``partition``, ``offset``, ``timestamp``, ``key``,
    ``value``, ``headers``) of a lane of ``kind``; raises DecodeError. ``source_ok`` is the
    deployment's grouping check (``pipeline.wiring.grouping_check``)."""
    topic, partition, offset = record.topic, record.partition, record.offset
    if kind == "audit":
        return decode_audit(offset, record.value)
    if kind == "decisions":
        return decision_message(
            topic, partition, offset, record.timestamp, record.key, record.value, source_ok
        )
    if kind == "alerts":
        return decode_alert(topic, partition, offset, record.value)
    return decode_dead_letter(topic, partition, offset, record.timestamp, record.headers)


# -- audit batches ------------------------------------------------------------------------

_ROW_TYPES: Final = tuple(
    int
    if name in ("ts_ms", "weight", "kafka_partition", "kafka_offset")
    else bool
    if name in ("trusted", "summary")
    else str
    for name in AUDIT_COLUMNS
)
_ACCOUNT: Final = AUDIT_COLUMNS.index("account")
# The type signatures a valid row has: ``account`` is a string or null.
_ROW_SIGNATURES: Final = frozenset(
    {_ROW_TYPES, (*_ROW_TYPES[:_ACCOUNT], type(None), *_ROW_TYPES[_ACCOUNT + 1 :])}
)
WEIGHT: Final = AUDIT_COLUMNS.index("weight")
TOPIC: Final = AUDIT_COLUMNS.index("kafka_topic")
PARTITION: Final = AUDIT_COLUMNS.index("kafka_partition")
OFFSET: Final = AUDIT_COLUMNS.index("kafka_offset")
_AUDIT_COLUMN_LIST: Final = list(AUDIT_COLUMNS)


def valid_audit_row(row: Any) -> bool:
    """True when ``row`` is a list of AUDIT_COLUMNS values the attempts table accepts."""
    return (
        type(row) is list
        and tuple(map(type, row)) in _ROW_SIGNATURES
        and 0 <= row[TS_MS] <= UINT64_MAX
        and 1 <= row[WEIGHT] <= UINT32_MAX
        and 0 <= row[PARTITION] <= UINT16_MAX
        and 0 <= row[OFFSET] <= UINT64_MAX
    )


def decode_audit(offset: int, value: bytes | None) -> Message:
    """An audit batch ``{"v": 1, "columns": AUDIT_COLUMNS, "rows": [...]}``; bad rows skipped."""
    body = _json_object(value)
    if body.get("v") != 1:
        raise DecodeError("bad_version", f"v is {body.get('v')!r}, expected 1")
    rows = body.get("rows")
    if type(rows) is not list:
        raise DecodeError("bad_shape", "rows is not a list")
    columns = body.get("columns")
    if columns != _AUDIT_COLUMN_LIST:
        rows = _reorder(columns, rows)
    good = [row for row in rows if valid_audit_row(row)]
    rejects = (
        [(reject_reason(row), row) for row in rows if not valid_audit_row(row)]
        if len(good) != len(rows)
        else []
    )
    max_minute = max((row[TS_MS] for row in good), default=None)
    return Message(
        offset,
        good,
        None if max_minute is None else max_minute // MINUTE_MS,
        bad_rows=len(rejects),
        rejects=rejects,
    )


def reject_reason(row: Any) -> str:
    """Why an audit row is not valid: ``past_timestamp`` (before 1970) or ``invalid_row``."""
    if type(row) is list and row and type(row[TS_MS]) is int and row[TS_MS] < 0:
        return "past_timestamp"
    return "invalid_row"


def _reorder(columns: Any, rows: list[Any]) -> list[Any]:
    """Rows of a batch whose columns are a superset of AUDIT_COLUMNS in another order."""
    if type(columns) is not list or not set(AUDIT_COLUMNS) <= set(columns):
        raise DecodeError("bad_columns", "columns do not include every audit column")
    index = [columns.index(name) for name in AUDIT_COLUMNS]
    width = len(columns)
    return [
        [row[i] for i in index] if type(row) is list and len(row) == width else None for row in rows
    ]


# -- decisions, alerts, dead letters ------------------------------------------------------


def decision_message(
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    source_ok: Callable[[str], bool] = DEFAULT_GROUPING,
) -> Message:
    """A decision (or a tombstone: null value, fields from the key) as a decisions row.

    The Kafka key is read first (``bad_key``: not UTF-8, malformed, or a tenant the one
    tenant validator refuses); a value must carry that same key (``key_mismatch``) and
    its tenant (``tenant_mismatch``). A source decision the grouping check ``source_ok``
    refuses (wider than one source, or written in IPv6 inside a NAT64 prefix) is bad."""
    text, parsed = _wire_key(key)
    if value is None:
        decision = _tombstone(text, parsed, timestamp_ms)
    else:
        decision = decode_decision(value, source_ok=source_ok, key=text)
        if decision.tenant != parsed[1]:
            raise DecodeError(
                "tenant_mismatch",
                f"the value's tenant {decision.tenant[:70]!r} differs from its key's {parsed[1]!r}",
            )
    row = decision_row(
        decision, tombstone=value is None, topic=topic, partition=partition, offset=offset
    )
    return Message(offset, [row])


def _wire_key(key: bytes | None) -> tuple[str, Key]:
    """A decisions message's Kafka key, as text and parsed (``pipeline.core.keys``)."""
    try:
        text = (key or b"").decode("utf-8")
        return text, parse_wire_key(text)
    except UnicodeDecodeError:
        raise DecodeError("bad_key", "the decision key is not UTF-8") from None
    except ValueError as exc:
        raise DecodeError("bad_key", str(exc)) from None


def _tombstone(text: str, key: Key, timestamp_ms: int) -> DecisionValue:
    """A tombstone's fields from its key; both times are the lift."""
    scope, tenant, account, source, device = key
    return DecisionValue(
        decision_id="",
        key=text,
        tenant=tenant,
        scope=scope,
        account_digest=account,
        source=source,
        device_id=device,
        applies_to="",
        action="",
        rule="",
        count=0,
        threshold=0,
        window_ms=0,
        issued_at_ms=timestamp_ms,
        expires_at_ms=timestamp_ms,
        policy_version="",
        operator=None,
        reason=None,
    )


def decode_alert(topic: str, partition: int, offset: int, value: bytes | None) -> Message:
    """An alert as an alerts row (``ALERTS_COLUMNS``)."""
    body = _json_object(value)
    row = [
        _text(body, "alert_id"),
        _text(body, "type"),
        _text(body, "tenant"),
        _text(body, "source", nullable=True),
        _text(body, "account_digest", nullable=True),
        _count(body, "count", UINT64_MAX),
        _count(body, "distinct_accounts", UINT64_MAX),
        _time_ms(body, "window_start"),
        _time_ms(body, "window_end"),
        _text(body, "policy_version"),
        topic,
        partition,
        offset,
    ]
    return Message(offset, [row])


def decode_dead_letter(
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    headers: Sequence[tuple[str, bytes]],
) -> Message:
    """A dead letter as a dead_letters row locating the original message.

    Missing or garbled headers do not lose the row: reason/stage become ``unknown`` and
    the coordinates those of the dead letter itself (``bad_reason`` says so).
    """
    found = {name: raw for name, raw in headers}
    if found.get("stage") == b"sink" and "dedup_token" in found:
        return Message(offset, [])  # quarantined by the sink: in dead_letters already

    def header(name: str) -> str | None:
        raw = found.get(name)
        if raw is None:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None

    reason, stage = header("error"), header("stage")
    source_topic = header("source_topic")
    source_partition, source_offset = header("source_partition"), header("source_offset")
    located = (
        source_topic is not None
        and source_partition is not None
        and source_partition.isdigit()
        and int(source_partition) <= UINT16_MAX
        and source_offset is not None
        and source_offset.isdigit()
    )
    row: list[Any] = [timestamp_ms, reason or "unknown", stage or "unknown"]
    if located:
        row += [source_topic, int(source_partition or 0), int(source_offset or 0)]
    else:
        row += [topic, partition, offset]
    bad = None if located and reason and stage else "bad_headers"
    return Message(offset, [row], bad_reason=bad)


def _json_object(value: bytes | None) -> dict[str, Any]:
    if not value:
        raise DecodeError("empty", "the message value is null or empty")
    try:
        body = loads(value)
    except ValueError as exc:
        raise DecodeError("not_json", str(exc)[:200]) from None
    if type(body) is not dict:
        raise DecodeError("not_object", "the JSON value is not an object")
    return body


def _text(body: Mapping[str, Any], name: str, *, nullable: bool = False) -> str | None:
    value = body.get(name)
    if value is None and nullable:
        return None
    if type(value) is not str:
        raise DecodeError("invalid_field", f"{name} is not a string")
    return value


def _count(body: Mapping[str, Any], name: str, high: int) -> int:
    value = body.get(name)
    if type(value) is int and 0 <= value <= high:
        return value
    raise DecodeError("invalid_field", f"{name} is not an integer in 0..{high}")


def _time_ms(body: Mapping[str, Any], name: str) -> int:
    try:
        return parse_utc_ms(str(_text(body, name)))
    except ValueError as exc:
        raise DecodeError("invalid_field", f"{name}: {exc}") from None
