"""``authpipe sink``: Kafka → ClickHouse, exactly once, with the audit rate cap.

One process reads ``auth.audit``, ``auth.throttle-decisions``, ``auth.alerts`` and
``auth.login-attempts.dlq`` (consumer group ``<app_id>-sink``, manual commits) and writes
the ``attempts``, ``decisions``, ``alerts`` and ``dead_letters`` tables through the one
ClickHouse interface.

Lanes, batches and dedup tokens
-------------------------------
Every assigned (topic, partition) is a *lane*; the lane's messages are cut into
batches of consecutive offsets and each batch is ONE insert into its table, whose
``dedup_token`` names that range: ``<table>:<topic>:<partition>:<first>-<last>``.
A ClickHouse insert never mixes partitions, so a token names exactly one range, and a
rebalance never splits a batch between two owners.

A retry after a crash must rebuild the *same* batches, or the tokens differ and rows
are doubled. Flushing by time makes batch ends depend on timing, so the ends are
recorded before the insert: the lane's Kafka commit carries, as its metadata, the list
of batches planned since the committed offset (``ap1:120,37,!,15``: batch spans in
offsets, ``!`` a rate-cap close). The sequence for each flush is

1. plan the batches (and closes) from the buffered messages, advancing the cap;
2. commit ``{partition: (clean offset, plan)}`` for every lane with news;
3. insert each item with its token;
4. once the items up to a *clean point* are in, the next commit moves the offset there
   and drops them from the plan.

After a crash (or on a new owner), the lane starts at the committed offset with an
empty cap and first *replays* the recorded plan: the same ranges, the same closes, so
the same rows and the same tokens; ClickHouse drops what it already has (the tables'
``non_replicated_deduplication_window`` is 1000 inserts; a replay is far shorter).
Only then does it plan new batches.

A clean point is an offset where the lane's cap is empty: after every batch of the
stateless lanes (decisions, alerts, dead letters), and for the audit lane after a
close (the cap is emptied when the lane's event time enters a new minute, after
``IDLE_CLOSE_MS`` without a message, at shutdown, and when the plan grows too long for
Kafka's 4 KiB metadata). The committed offset is always a clean point, so the cap state
there is known (empty) and the replay is deterministic. Offsets are committed only for
data ClickHouse has accepted.

Upstream replays (exactly once per input event)
-----------------------------------------------
The worker's account stage skips every row whose input offset is at or below the highest
it applied for that input partition (``pipeline.stream.stages``), so on one audit
partition the input offsets of the rows of one (input topic, input partition) strictly
increase. After a worker crash the stage restarts from its last changelog and applies
envelopes again whose audit batches may already be on the topic: their rows come again,
at or below offsets the audit lane has passed. The audit lane therefore keeps a *mark*
per (input topic, input partition), the highest input offset it has planned, and drops
rows at or below it before the rate cap (materialized views fire on insert, so they
must never see such rows). Rate-cap summaries are made after this filter, from rows that
passed it, so they are never doubled either.

The marks are part of the lane's committed state: each clean point records the marks
as they stood there, and the commit metadata carries them after the plan
(``ap1:120,!|auth.login-attempts=0:5123,1:4870``). A restart resumes with exactly the
marks of the committed offset, so the plan replay filters as the first run did and
rebuilds the same rows. (Marks read back from ClickHouse would not do: they include
rows past the committed offset, which the replay must filter as before, and miss rows
the cap summarized.) Marks that do not fit ``MAX_MARKS_CHARS`` (over about a hundred
input partitions) are left out of the metadata, largest topic-partition last, and
logged: a replay of those partitions across a sink restart is then not caught. A lane
committed by an older sink starts with no marks. Re-creating the input topic (offsets
from 0 again) needs a new sink group, as it needs new worker state.

Failures
--------
* ClickHouse unavailable (or refusing): the planned items stay queued and are retried
  with capped exponential backoff (``BACKOFF_START_S`` doubling to ``BACKOFF_CAP_S``);
  fetching is paused so the backlog waits in Kafka; it resumes once they are in.
  Nothing is dropped and the process does not exit.
* A message that is not valid (not JSON, wrong shape) is logged, counted and skipped,
  deterministically (a replay skips it again). Rows of a valid message that no column can
  hold (a time before 1970: ``past_timestamp``; wrong types or ranges: ``invalid_row``)
  are quarantined (:mod:`pipeline.sinks.quarantine`) before the lane plans past them.
* Every insert is cut into parts of at most ``MAX_DAYS_PER_INSERT`` days
  (:mod:`pipeline.sinks.partitions`), within the per-insert partition limit the inserts
  set. Rows ClickHouse still refuses for good (``BatchRefused``, e.g. code 252 "too many
  partitions for single INSERT block" under another partition key) are quarantined with
  the reason and the lane moves on: one batch never stops the sink.
* Test hook: with ``AUTHPIPE_FAULT_SINK_KILL_AFTER_INSERTS=N`` the process SIGKILLs
  itself right after its N-th successful non-empty insert (before the next commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from aiokafka import ConsumerRebalanceListener

from pipeline.contracts.codec import loads
from pipeline.contracts.models import AUDIT_COLUMNS, datetime_to_ms
from pipeline.core.grouping import within_grouping
from pipeline.errors import AuthpipeError
from pipeline.kafka_client import client_kwargs
from pipeline.logs import get_logger
from pipeline.runtime import tune_gc
from pipeline.settings import Settings
from pipeline.sinks.clickhouse import (
    BatchRefused,
    ClickHouse,
    ClickHouseError,
    ClickHouseUnavailable,
)
from pipeline.sinks.cluster import CLUSTER_INSERT_SETTINGS
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.partitions import MAX_DAYS_PER_INSERT, PARTITION_COLUMN, split_by_day
from pipeline.sinks.quarantine import DEAD_LETTERS_COLUMNS, Quarantine, Quarantined
from pipeline.sinks.ratecap import MINUTE_MS, TS_MS, RateCap, RateCapConfig
from pipeline.topics import Topics

log = get_logger("sink")

POLL_TIMEOUT_MS: Final = 100
POLL_MAX_RECORDS: Final = 500
IDLE_CLOSE_MS: Final = 5_000
BACKOFF_START_S: Final = 0.2
BACKOFF_CAP_S: Final = 30.0
BUFFER_FACTOR: Final = 4
MAX_PLAN_CHARS: Final = 2_000
MAX_MARKS_CHARS: Final = 1_900  # plan + marks stay under Kafka's 4,096-byte metadata limit
PROGRESS_LOG_INTERVAL_S: Final = 10.0
SHUTDOWN_TIMEOUT_S: Final = 30.0
MAX_TRACKED_KEYS: Final = 100_000
PLAN_PREFIX: Final = "ap1:"
CLOSE: Final = "!"
MARKS_SEPARATOR: Final = "|"
FAULT_ENV: Final = "AUTHPIPE_FAULT_SINK_KILL_AFTER_INSERTS"

LaneKind = Literal["audit", "decisions", "alerts", "dead_letters"]
Entry = int | str  # a batch span in offsets, or CLOSE

ATTEMPTS_COLUMNS: Final = ("ts", *AUDIT_COLUMNS[1:])
DECISIONS_COLUMNS: Final = (
    "decision_id", "key", "tenant", "scope", "account_digest", "source", "device_id",
    "applies_to", "action", "rule", "count", "threshold", "window_ms", "issued_at",
    "expires_at", "policy_version", "tombstone", "operator", "reason", "kafka_topic",
    "kafka_partition", "kafka_offset",
)  # fmt: skip
ALERTS_COLUMNS: Final = (
    "alert_id", "type", "tenant", "source", "account_digest", "count", "distinct_accounts",
    "window_start", "window_end", "policy_version", "kafka_topic", "kafka_partition",
    "kafka_offset",
)  # fmt: skip

TABLES: Final[Mapping[str, tuple[str, tuple[str, ...]]]] = {
    "audit": ("attempts", ATTEMPTS_COLUMNS),
    "decisions": ("decisions", DECISIONS_COLUMNS),
    "alerts": ("alerts", ALERTS_COLUMNS),
    "dead_letters": ("dead_letters", DEAD_LETTERS_COLUMNS),
}
# Where each table's partition time is in its rows.
DAY_INDEX: Final[Mapping[str, int]] = {
    table: columns.index(PARTITION_COLUMN[table]) for table, columns in TABLES.values()
}

# Settings of every sink insert. The views' targets (AggregatingMergeTree) get one
# block per insert that the view's GROUP BY already made unique per key, so merging it
# again on insert (``optimize_on_insert``, on by default) finds nothing to fold, yet it
# rebuilds every aggregate state (a ``uniq`` set per account and minute): 2-4 us of the
# 20-25 us of engine and client CPU per ``attempts`` row in ``bench.bench_sink``. Readers
# GROUP BY the key anyway; background merges fold the parts as before.
# The partition limit is set to the cut of pipeline.sinks.partitions, so the two agree
# whatever the server's profile says.
INSERT_SETTINGS: Final[Mapping[str, Any]] = {
    "optimize_on_insert": 0,
    "max_partitions_per_insert_block": MAX_DAYS_PER_INSERT,
}

UINT16_MAX: Final = 65_535
UINT32_MAX: Final = 4_294_967_295
UINT64_MAX: Final = 18_446_744_073_709_551_615


class SinkError(AuthpipeError):
    """The sink cannot start (bad configuration, no broker)."""


class BadMessage(AuthpipeError):
    """A message on a sink topic that cannot be written; ``reason`` is a stable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


# -- decoding (pure) ------------------------------------------------------------------


@dataclass(slots=True)
class Message:
    """One decoded message of a lane: its offset and the table rows it yields."""

    offset: int
    rows: list[list[Any]]
    max_minute: int | None = None
    bad_rows: int = 0
    bad_reason: str | None = None
    rejects: list[tuple[str, Any]] = field(default_factory=list)  # (reason, row) to quarantine


_ROW_TYPES: Final = tuple(
    int if name in ("ts_ms", "weight", "kafka_partition", "kafka_offset")
    else bool if name in ("trusted", "summary")
    else str
    for name in AUDIT_COLUMNS
)  # fmt: skip
_ACCOUNT: Final = AUDIT_COLUMNS.index("account")
# The type signatures a valid row has: ``account`` is a string or null.
_ROW_SIGNATURES: Final = frozenset(
    {_ROW_TYPES, (*_ROW_TYPES[:_ACCOUNT], type(None), *_ROW_TYPES[_ACCOUNT + 1 :])}
)
_WEIGHT: Final = AUDIT_COLUMNS.index("weight")
_TOPIC: Final = AUDIT_COLUMNS.index("kafka_topic")
_PARTITION: Final = AUDIT_COLUMNS.index("kafka_partition")
_OFFSET: Final = AUDIT_COLUMNS.index("kafka_offset")


def valid_audit_row(row: Any) -> bool:
    """True when ``row`` is a list of AUDIT_COLUMNS values the attempts table accepts."""
    return (
        type(row) is list
        and tuple(map(type, row)) in _ROW_SIGNATURES
        and 0 <= row[0] <= UINT64_MAX
        and 1 <= row[_WEIGHT] <= UINT32_MAX
        and 0 <= row[_PARTITION] <= UINT16_MAX
        and 0 <= row[_OFFSET] <= UINT64_MAX
    )


_AUDIT_COLUMN_LIST: Final = list(AUDIT_COLUMNS)


def decode_audit(offset: int, value: bytes | None) -> Message:
    """An audit batch ``{"v": 1, "columns": AUDIT_COLUMNS, "rows": [...]}``; bad rows skipped."""
    body = _json_object(value)
    if body.get("v") != 1:
        raise BadMessage("bad_version", f"v is {body.get('v')!r}, expected 1")
    rows = body.get("rows")
    if type(rows) is not list:
        raise BadMessage("bad_shape", "rows is not a list")
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
    if type(row) is list and row and type(row[0]) is int and row[0] < 0:
        return "past_timestamp"
    return "invalid_row"


def _reorder(columns: Any, rows: list[Any]) -> list[Any]:
    """Rows of a batch whose columns are a superset of AUDIT_COLUMNS in another order."""
    if type(columns) is not list or not set(AUDIT_COLUMNS) <= set(columns):
        raise BadMessage("bad_columns", "columns do not include every audit column")
    index = [columns.index(name) for name in AUDIT_COLUMNS]
    width = len(columns)
    return [
        [row[i] for i in index] if type(row) is list and len(row) == width else None for row in rows
    ]


def _json_object(value: bytes | None) -> dict[str, Any]:
    if not value:
        raise BadMessage("empty", "the message value is null or empty")
    try:
        body = loads(value)
    except ValueError as exc:
        raise BadMessage("not_json", str(exc)[:200]) from None
    if type(body) is not dict:
        raise BadMessage("not_object", "the JSON value is not an object")
    return body


def _text(body: Mapping[str, Any], name: str, *, nullable: bool = False) -> str | None:
    value = body.get(name)
    if value is None and nullable:
        return None
    if type(value) is not str:
        raise BadMessage("invalid_field", f"{name} is not a string")
    return value


def _count(body: Mapping[str, Any], name: str, high: int) -> int:
    value = body.get(name)
    if type(value) is int and 0 <= value <= high:
        return value
    raise BadMessage("invalid_field", f"{name} is not an integer in 0..{high}")


def _time_ms(body: Mapping[str, Any], name: str) -> int:
    text = _text(body, name)
    assert text is not None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise BadMessage("invalid_field", f"{name} is not an RFC 3339 time") from None
    if parsed.tzinfo is None:
        raise BadMessage("invalid_field", f"{name} has no UTC offset")
    return datetime_to_ms(parsed)


def decode_decision(
    topic: str, partition: int, offset: int, timestamp_ms: int, key: bytes | None,
    value: bytes | None, grouping: tuple[int, int] = (32, 64),
) -> Message:  # fmt: skip
    """A decision (or a tombstone: null value, fields from the key) as a decisions row.
    A source decision wider than the grouping (``(ipv4_prefix, ipv6_prefix)``) is bad."""
    coords = [topic, partition, offset]
    if value is None:
        return Message(offset, [_tombstone_row(key, timestamp_ms) + coords])
    body = _json_object(value)
    source = _text(body, "source", nullable=True)
    if body.get("scope") == "source" and not (source and within_grouping(source, *grouping)):
        raise BadMessage("invalid_field", f"source {str(source)[:64]!r} is wider than one source")
    row = [
        _text(body, "decision_id"), _text(body, "key"), _text(body, "tenant"),
        _text(body, "scope"), _text(body, "account_digest", nullable=True),
        _text(body, "source", nullable=True), _text(body, "device_id", nullable=True),
        _text(body, "applies_to"), _text(body, "action"), _text(body, "rule"),
        _count(body, "count", UINT32_MAX), _count(body, "threshold", UINT32_MAX),
        _count(body, "window_ms", UINT64_MAX), _time_ms(body, "issued_at"),
        _time_ms(body, "expires_at"), _text(body, "policy_version"), False,
        _text(body, "operator", nullable=True), _text(body, "reason", nullable=True), *coords,
    ]  # fmt: skip
    return Message(offset, [row])


def _tombstone_row(key: bytes | None, timestamp_ms: int) -> list[Any]:
    """``<scope>|<tenant>|<account or ->|<source or ->|<device or ->``; times = the lift."""
    try:
        text = (key or b"").decode("utf-8")
    except UnicodeDecodeError:
        raise BadMessage("bad_key", "the tombstone key is not UTF-8") from None
    parts = text.split("|")
    if len(parts) != 5 or not parts[0] or not parts[1]:
        raise BadMessage("bad_key", "the tombstone key is not scope|tenant|account|source|device")
    scope, tenant, account, source, device = (None if p == "-" else p for p in parts)
    return [
        "", text, tenant, scope, account, source, device, "", "", "", 0, 0, 0,
        timestamp_ms, timestamp_ms, "", True, None, None,
    ]  # fmt: skip


def decode_alert(topic: str, partition: int, offset: int, value: bytes | None) -> Message:
    """An alert as an alerts row."""
    body = _json_object(value)
    row = [
        _text(body, "alert_id"), _text(body, "type"), _text(body, "tenant"),
        _text(body, "source", nullable=True), _text(body, "account_digest", nullable=True),
        _count(body, "count", UINT64_MAX), _count(body, "distinct_accounts", UINT64_MAX),
        _time_ms(body, "window_start"), _time_ms(body, "window_end"),
        _text(body, "policy_version"), topic, partition, offset,
    ]  # fmt: skip
    return Message(offset, [row])


def decode_dead_letter(
    topic: str, partition: int, offset: int, timestamp_ms: int,
    headers: Sequence[tuple[str, bytes]],
) -> Message:  # fmt: skip
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
    source_topic, source_partition, source_offset = (
        header("source_topic"), header("source_partition"), header("source_offset"),
    )  # fmt: skip
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


# -- the plan in the commit metadata (pure) ----------------------------------------------


def encode_plan(entries: Iterable[Entry], marks: str = "") -> str:
    """``ap1:`` then the entries (batch spans in offsets, ``!`` for a close), then marks."""
    return PLAN_PREFIX + ",".join(str(entry) for entry in entries) + marks


def decode_plan(metadata: str | None) -> list[Entry]:
    """The entries of a commit's metadata; empty for no or foreign metadata."""
    if not metadata or not metadata.startswith(PLAN_PREFIX):
        return []
    body = metadata[len(PLAN_PREFIX) :].split(MARKS_SEPARATOR, 1)[0]
    if not body:
        return []
    entries: list[Entry] = []
    for part in body.split(","):
        if part == CLOSE:
            entries.append(CLOSE)
        elif part.isdigit() and int(part) > 0:
            entries.append(int(part))
        else:
            raise _foreign(metadata)
    return entries


Marks = dict[str, dict[int, int]]  # input topic -> input partition -> highest offset planned


def encode_marks(marks: Marks, limit: int = MAX_MARKS_CHARS) -> tuple[str, bool]:
    """``|<topic>=<partition>:<offset>,…`` per input topic, and whether any were left out.

    Kafka topic names hold only ``[A-Za-z0-9._-]``, so ``|``, ``=``, ``:`` and ``,``
    cannot occur in them.
    """
    parts: list[str] = []
    size = 0
    cut = False
    for topic in sorted(marks):
        pairs = []
        head = len(topic) + 2
        for partition, offset in sorted(marks[topic].items()):
            pair = f"{partition}:{offset}"
            if size + head + len(pair) + 1 > limit:
                cut = True
                break
            pairs.append(pair)
            size += len(pair) + 1
        if pairs:
            parts.append(f"{MARKS_SEPARATOR}{topic}={','.join(pairs)}")
            size += head
        if cut:
            break
    return "".join(parts), cut


def decode_marks(metadata: str | None) -> Marks:
    """The marks of a commit's metadata; empty for none, old or foreign metadata."""
    if not metadata or not metadata.startswith(PLAN_PREFIX):
        return {}
    marks: Marks = {}
    for section in metadata.split(MARKS_SEPARATOR)[1:]:
        topic, _, pairs = section.partition("=")
        found = marks.setdefault(topic, {})
        for pair in pairs.split(","):
            partition, _, offset = pair.partition(":")
            if not (topic and partition.isdigit() and offset.isdigit()):
                raise _foreign(metadata)
            found[int(partition)] = int(offset)
    return marks


def _foreign(metadata: str) -> SinkError:
    return SinkError(
        f"commit metadata {metadata[:80]!r} is not a sink plan; "
        "another program committed for this group: give the sink its own group"
    )


# -- lanes (pure: no I/O, no clock; time is a parameter) ----------------------------------


@dataclass(slots=True)
class WorkItem:
    """One planned insert: rows for ``table`` under ``token``.

    ``clean`` is the offset that becomes the lane's committed offset once this item and
    every item before it are in ClickHouse (None: not a clean point); ``marks`` are the
    lane's upstream marks there, encoded for the commit metadata.
    """

    table: str
    columns: tuple[str, ...]
    rows: list[list[Any]]
    token: str
    clean: int | None
    recorded: bool
    marks: str = ""
    first: int = 0  # the first offset of the range the rows came from


@dataclass(slots=True)
class Lane:
    """One (topic, partition): buffered messages, the plan since the committed offset,
    the cap (audit only) and the items waiting for ClickHouse."""

    topic: str
    partition: int
    kind: LaneKind
    committed: int | None
    cap: RateCap | None
    replay: deque[Entry] = field(default_factory=deque)
    plan: deque[Entry] = field(default_factory=deque)
    buffer: deque[Message] = field(default_factory=deque)
    pending: deque[WorkItem] = field(default_factory=deque)
    next_offset: int | None = None
    seen_to: int | None = None
    buffered_rows: int = 0
    minute: int | None = None
    last_message_ms: int = 0
    confirmed_entries: int = 0
    commit_due: bool = False
    marks: Marks = field(default_factory=dict)
    committed_marks: str = ""
    marks_cut: bool = False
    dropped_rows: int = 0
    dropped_weight: int = 0

    @classmethod
    def start(
        cls, topic: str, partition: int, kind: LaneKind, committed: int | None,
        plan: Sequence[Entry], cap: RateCapConfig, marks: Marks | None = None,
    ) -> Lane:  # fmt: skip
        """A lane at its committed offset (None: never committed), replaying ``plan``,
        with the upstream ``marks`` committed with it (audit lanes)."""
        held = {topic: dict(found) for topic, found in (marks or {}).items()}
        return cls(
            topic=topic,
            partition=partition,
            kind=kind,
            committed=committed,
            cap=RateCap(cap) if kind == "audit" else None,
            replay=deque(plan),
            plan=deque(plan),
            next_offset=committed,
            seen_to=committed,
            marks=held,
            committed_marks=encode_marks(held)[0],
        )

    @property
    def table(self) -> str:
        return TABLES[self.kind][0]

    @property
    def replaying(self) -> bool:
        return bool(self.replay)

    def add(self, message: Message, now_ms: int) -> bool:
        """Buffer a message; False (ignored) when its offset was seen already."""
        if self.seen_to is not None and message.offset < self.seen_to:
            return False
        if self.committed is None:
            self.committed = message.offset
        if self.next_offset is None:
            self.next_offset = message.offset
        self.seen_to = message.offset + 1
        self.buffer.append(message)
        self.buffered_rows += max(1, len(message.rows))
        self.last_message_ms = now_ms
        return True

    def plan_items(
        self, *, flush_rows: int, now_ms: int, position: int | None = None,
        idle_close_ms: int = IDLE_CLOSE_MS, closing: bool = False,
    ) -> list[WorkItem]:  # fmt: skip
        """Turn buffered messages into items: the replay plan first, then new batches.

        ``position`` is the consumer's next offset for this partition (for a replayed
        batch whose last offsets no longer hold a message). New items append their
        entries to ``plan``; the caller commits the plan before inserting them.
        """
        items: list[WorkItem] = []
        while self.replay and self._replay_one(items, position):
            pass
        if self.replay:
            return items
        # The plan must fit Kafka's commit metadata: past MAX_PLAN_CHARS, stop planning
        # (the rest waits for the next flush) and close the cap to make a clean point.
        full = False
        while self.buffer and not (full := len(encode_plan(self.plan)) > MAX_PLAN_CHARS):
            self._plan_batch(items, flush_rows)
        cap = self.cap
        if (
            cap is not None
            and cap.tracked_keys
            and (closing or full or now_ms - self.last_message_ms >= idle_close_ms)
        ):
            self._close(items, record=True)
        return items

    def _replay_one(self, items: list[WorkItem], position: int | None) -> bool:
        entry = self.replay[0]
        if entry == CLOSE:
            self.replay.popleft()
            self._close(items, record=False)
            return True
        assert isinstance(entry, int) and self.next_offset is not None
        end = self.next_offset + entry - 1
        complete = (self.buffer and self.buffer[-1].offset > end) or (
            position is not None and position > end
        )
        if not complete:
            return False
        batch: list[Message] = []
        while self.buffer and self.buffer[0].offset <= end:
            batch.append(self._take())
        self.replay.popleft()
        self._batch(items, batch, end, record=False)
        return True

    def _plan_batch(self, items: list[WorkItem], flush_rows: int) -> None:
        batch: list[Message] = []
        rows = 0
        while self.buffer and rows < flush_rows:
            message = self.buffer[0]
            if self.cap is not None and message.max_minute is not None:
                if self.minute is not None and message.max_minute > self.minute:
                    if batch:
                        break  # the batch ends before the new minute; the cap closes next
                    if self.cap.tracked_keys:
                        self._close(items, record=True)
                    self.minute = None
                self.minute = (
                    message.max_minute
                    if self.minute is None
                    else max(self.minute, message.max_minute)
                )
            batch.append(self._take())
            rows += len(message.rows)
        if batch:
            self._batch(items, batch, batch[-1].offset, record=True)

    def _take(self) -> Message:
        message = self.buffer.popleft()
        self.buffered_rows -= max(1, len(message.rows))
        return message

    def _batch(
        self, items: list[WorkItem], batch: list[Message], end: int, *, record: bool
    ) -> None:
        start = self.next_offset
        assert start is not None
        if self.cap is None:
            rows = [row for message in batch for row in message.rows]
        else:
            rows = []
            offer = self.cap.offer
            for message in batch:
                for row in self._fresh(message.rows):
                    offer(row, rows)
                if message.max_minute is not None and record is False:
                    self.minute = (
                        message.max_minute
                        if self.minute is None
                        else max(self.minute, message.max_minute)
                    )
        self.next_offset = end + 1
        clean = end + 1 if self.cap is None or not self.cap.tracked_keys else None
        token = f"{self.table}:{self.topic}:{self.partition}:{start}-{end}"
        self._item(items, rows, token, clean, end - start + 1 if record else None, start)

    def _fresh(self, rows: list[list[Any]]) -> list[list[Any]]:
        """``rows`` without upstream replays: input offsets at or below the marks."""
        marks = self.marks
        topic: str | None = None
        found: dict[int, int] = {}
        fresh = rows
        for index, row in enumerate(rows):
            if row[_TOPIC] != topic:
                topic = row[_TOPIC]
                found = marks.setdefault(topic, {})
            partition, offset = row[_PARTITION], row[_OFFSET]
            if offset > found.get(partition, -1):
                found[partition] = offset
                if fresh is not rows:
                    fresh.append(row)
                continue
            if fresh is rows:
                fresh = rows[:index]  # the first replayed row: copy what passed so far
            self.dropped_rows += 1
            self.dropped_weight += row[_WEIGHT]
        return fresh

    def _close(self, items: list[WorkItem], *, record: bool) -> None:
        assert self.cap is not None and self.next_offset is not None
        rows: list[list[Any]] = []
        self.cap.close_all(rows)
        self.minute = None
        token = f"{self.table}:{self.topic}:{self.partition}:close@{self.next_offset}"
        self._item(items, rows, token, self.next_offset, CLOSE if record else None, self.next_offset)

    def _item(
        self, items: list[WorkItem], rows: list[list[Any]], token: str, clean: int | None,
        entry: Entry | None, first: int,
    ) -> None:  # fmt: skip
        table, columns = TABLES[self.kind]
        marks = ""
        if clean is not None and self.marks:
            marks, cut = encode_marks(self.marks)
            self.marks_cut = self.marks_cut or cut
        item = WorkItem(
            table, columns, rows, token, clean, recorded=entry is not None, marks=marks,
            first=first,
        )  # fmt: skip
        if entry is not None:
            self.plan.append(entry)
            self.commit_due = True
        items.append(item)
        self.pending.append(item)

    def confirm(self) -> WorkItem:
        """The first pending item is in ClickHouse: move the clean point if it is one."""
        item = self.pending.popleft()
        self.confirmed_entries += 1
        if item.clean is not None:
            for _ in range(self.confirmed_entries):
                self.plan.popleft()
            self.confirmed_entries = 0
            self.committed = item.clean
            self.committed_marks = item.marks
            self.commit_due = True
        return item

    def commit_value(self) -> tuple[int, str] | None:
        """(offset, metadata) to commit, or None before the lane saw any offset."""
        if self.committed is None:
            return None
        return self.committed, encode_plan(self.plan, self.committed_marks)


# -- the I/O shell -------------------------------------------------------------------------


@dataclass
class SinkStats:
    """Counters logged as ``sink.progress`` and at shutdown."""

    messages: int = 0
    rows_in: int = 0
    rows_written: int = 0
    inserts: int = 0
    insert_failures: int = 0
    commits: int = 0
    commit_failures: int = 0
    bad_messages: int = 0
    bad_rows: int = 0
    replayed_items: int = 0
    upstream_replayed_rows: int = 0
    quarantined_rows: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def monotonic_ms() -> int:
    """The sink's clock for flush timing (never for event time)."""
    return time.monotonic_ns() // 1_000_000


class AuditSink:
    """The sink process: one consumer, one ClickHouse handle, one lane per partition."""

    def __init__(
        self,
        settings: Settings,
        *,
        open_ch: Callable[[], ClickHouse] | None = None,
    ) -> None:
        self.settings = settings
        kafka = settings.kafka
        self.group_id = f"{kafka.app_id}-sink"
        self.kinds: dict[str, LaneKind] = {
            kafka.audit_topic: "audit",
            kafka.decisions_topic: "decisions",
            kafka.alerts_topic: "alerts",
            kafka.dlq_topic: "dead_letters",
        }
        if len(self.kinds) != 4:
            raise SinkError(
                "the audit, decisions, alerts and DLQ topics must be four different topics; "
                "fix the kafka.*_topic settings"
            )
        audit = settings.audit
        self.flush_rows = audit.flush_rows
        self.flush_interval_ms = audit.flush_interval_ms
        self.cap_config = RateCapConfig(
            rows_per_minute=audit.rows_per_minute, max_keys=MAX_TRACKED_KEYS
        )
        self._open_ch = open_ch or (lambda: open_clickhouse(settings.clickhouse))
        self._ch: ClickHouse | None = None
        self.lanes: dict[Any, Lane] = {}
        self.stats = SinkStats()
        self._consumer: Any = None
        self._admin: Any = None
        self._events: deque[tuple[str, Any]] = deque()
        self._last_flush_ms = 0
        self._retry_at_ms = 0
        self._backoff_s = BACKOFF_START_S
        self._paused_outage = False
        self._paused_full: set[Any] = set()
        self._fault_after = int(os.environ.get(FAULT_ENV, "0") or "0")
        # A cluster's Distributed tables store an insert before it returns only when asked.
        self.insert_settings: Mapping[str, Any] = (
            {**INSERT_SETTINGS, **CLUSTER_INSERT_SETTINGS}
            if settings.clickhouse.cluster
            else INSERT_SETTINGS
        )
        self.quarantine = Quarantine(
            client_kwargs(kafka), kafka.dlq_topic, insert_settings=self.insert_settings
        )
        self._last_progress_s = time.monotonic()

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, then flush, close the caps and commit."""
        await self._start()
        try:
            while not stop.is_set():
                records = await self._consumer.getmany(
                    timeout_ms=POLL_TIMEOUT_MS, max_records=POLL_MAX_RECORDS
                )
                await self._apply_events()
                self._ingest(records)
                await self._tick(monotonic_ms())
                self._log_progress()
            await self._shutdown()
        finally:
            await self._close()

    async def _start(self) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        from pipeline.kafka_admin import TopicSpec, ensure_topics, wait_for_broker
        from pipeline.kafka_client import client_kwargs, security_kwargs
        kafka = self.settings.kafka
        security = security_kwargs(kafka)
        try:
            await wait_for_broker(kafka.bootstrap_servers, 30.0, security=security)
            specs: list[TopicSpec] = [
                spec
                for spec in Topics.from_settings(kafka).specs(kafka.partitions)
                if spec.name in self.kinds
            ]
            await ensure_topics(
                kafka.bootstrap_servers, specs, replication_factor=kafka.replication_factor,
                security=security,
            )  # fmt: skip
        except AuthpipeError as exc:
            raise SinkError(f"the sink cannot start: {exc}") from exc
        self._admin = AIOKafkaAdminClient(**client_kwargs(kafka))
        await self._admin.start()
        self._consumer = AIOKafkaConsumer(
            **client_kwargs(kafka),
            group_id=self.group_id,
            client_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        await self._consumer.start()
        self._consumer.subscribe(list(self.kinds), listener=_Listener(self._events))
        log.info(
            "sink.started",
            group=self.group_id,
            topics=sorted(self.kinds),
            flush_rows=self.flush_rows,
            flush_interval_ms=self.flush_interval_ms,
            rows_per_minute=self.cap_config.rows_per_minute,
        )

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            if self._consumer is not None:
                await self._consumer.stop()
        with contextlib.suppress(Exception):
            await self.quarantine.stop()
        with contextlib.suppress(Exception):
            if self._admin is not None:
                await self._admin.close()
        if self._ch is not None:
            ch, self._ch = self._ch, None
            with contextlib.suppress(Exception):
                await asyncio.to_thread(ch.close)
        self.stats.quarantined_rows = self.quarantine.rows
        log.info("sink.stopped", **self.stats.as_dict())

    async def _shutdown(self) -> None:
        """Plan what is buffered, close every cap, commit the plan, insert, commit."""
        await self._apply_events()
        now = monotonic_ms()
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        await self._flush(now, closing=True)
        while self._has_pending() and time.monotonic() < deadline:
            if await self._insert_pending():
                break
            await asyncio.sleep(min(self._backoff_s, max(0.0, deadline - time.monotonic())))
        if self._has_pending():
            log.warning("sink.shutdown_with_pending", reason="clickhouse unavailable")
        await self._commit()

    # -- rebalances ----------------------------------------------------------------------

    async def _apply_events(self) -> None:
        while self._events:
            what, tps = self._events.popleft()
            if what == "revoked":
                for tp in tps:
                    self.lanes.pop(tp, None)
                    self._paused_full.discard(tp)
                continue
            try:
                await self._load_lanes(tps, seek=what == "reload")
            except SinkError:
                raise
            except Exception as exc:  # Kafka hiccup: keep the event, retry after a poll
                log.warning("sink.load_failed", error=str(exc)[:300], partitions=len(tps))
                self._events.appendleft((what, tps))
                return

    async def _load_lanes(self, tps: Iterable[Any], *, seek: bool) -> None:
        """New lanes at their committed offsets, replaying the committed plans.

        After an assignment the consumer starts at the committed offsets by itself;
        ``seek`` moves it back there for a lane reloaded after a failure.
        """
        # A lane that exists is current: every path that outdates one (revocation, a
        # failed commit) removes it before asking for a reload.
        tps = [tp for tp in dict.fromkeys(tps) if tp not in self.lanes and self._assigned(tp)]
        if not tps:
            return
        committed = await self._admin.list_consumer_group_offsets(self.group_id, partitions=tps)
        for tp in tps:
            found = committed.get(tp)
            offset = found.offset if found is not None and found.offset >= 0 else None
            metadata = found.metadata if offset is not None else None
            plan = decode_plan(metadata)
            kind = self.kinds[tp.topic]
            marks = decode_marks(metadata) if kind == "audit" else None
            self.lanes[tp] = Lane.start(
                tp.topic, tp.partition, kind, offset, plan, self.cap_config, marks
            )
            if not seek:
                pass
            elif offset is None:
                await self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, offset)
            if plan:
                log.info(
                    "sink.replaying", topic=tp.topic, partition=tp.partition,
                    offset=offset, entries=len(plan),
                )  # fmt: skip

    # -- ingest --------------------------------------------------------------------------

    def _ingest(self, records: Mapping[Any, list[Any]]) -> None:
        now = monotonic_ms()
        for tp, batch in records.items():
            lane = self.lanes.get(tp)
            if lane is None:
                self._events.append(("reload", [tp]))  # load it, seek back; these come again
                continue
            for record in batch:
                if lane.seen_to is not None and record.offset < lane.seen_to:
                    continue  # fetched again after a seek: buffered already
                message = self._decode(lane, record)
                if lane.add(message, now):
                    self.stats.messages += 1
                    self.stats.rows_in += len(message.rows)
            if lane.buffered_rows > BUFFER_FACTOR * self.flush_rows and tp not in self._paused_full:
                self._paused_full.add(tp)
                self._consumer.pause(tp)

    def _decode(self, lane: Lane, record: Any) -> Message:
        try:
            if lane.kind == "audit":
                message = decode_audit(record.offset, record.value)
            elif lane.kind == "decisions":
                ingest = self.settings.ingest
                message = decode_decision(
                    record.topic, record.partition, record.offset, record.timestamp,
                    record.key, record.value, (ingest.ipv4_prefix, ingest.ipv6_prefix),
                )  # fmt: skip
            elif lane.kind == "alerts":
                message = decode_alert(record.topic, record.partition, record.offset, record.value)
            else:
                message = decode_dead_letter(
                    record.topic, record.partition, record.offset, record.timestamp,
                    record.headers,
                )  # fmt: skip
        except BadMessage as exc:
            message = Message(record.offset, [], bad_reason=exc.reason)
            log.warning(
                "sink.bad_message", topic=record.topic, partition=record.partition,
                offset=record.offset, reason=exc.reason, error=str(exc)[:300],
            )  # fmt: skip
            self.stats.bad_messages += 1
            return message
        if message.bad_rows:
            self.stats.bad_rows += message.bad_rows
            log.warning(
                "sink.bad_rows", topic=record.topic, partition=record.partition,
                offset=record.offset, rows=message.bad_rows, quarantined=True,
            )  # fmt: skip
            self.quarantine.queue_rejects(
                record.topic, record.partition, record.offset, message.rejects
            )
        if message.bad_reason is not None:
            self.stats.bad_messages += 1
            log.warning(
                "sink.bad_message", topic=record.topic, partition=record.partition,
                offset=record.offset, reason=message.bad_reason, error="written with defaults",
            )  # fmt: skip
        return message

    async def _send_rejects(self) -> bool:
        """Quarantine the queued rejects; False (and back off) when that fails."""
        from aiokafka.errors import KafkaError

        try:
            await self.quarantine.put_pending(self._handle)
        except (ClickHouseError, KafkaError) as exc:
            self._failed(exc)
            return False
        self._recovered()
        return True

    async def _handle(self) -> ClickHouse:
        if self._ch is None:
            self._ch = await asyncio.to_thread(self._open_ch)
        return self._ch

    # -- flush, commit, insert -----------------------------------------------------------

    def _has_pending(self) -> bool:
        return any(lane.pending for lane in self.lanes.values())

    async def _tick(self, now_ms: int) -> None:
        if self.quarantine.pending and now_ms < self._retry_at_ms:
            return
        if self._has_pending():
            if now_ms < self._retry_at_ms:
                return
            if not await self._insert_pending():
                return
        due = now_ms - self._last_flush_ms >= self.flush_interval_ms
        full = any(lane.buffered_rows >= self.flush_rows for lane in self.lanes.values())
        if due or full:
            await self._flush(now_ms)

    async def _flush(self, now_ms: int, *, closing: bool = False) -> None:
        self._last_flush_ms = now_ms
        # Rejects first: a lane plans (and later commits) past their messages only after.
        if self.quarantine.pending and not await self._send_rejects():
            return
        planned = False
        for tp, lane in list(self.lanes.items()):
            position = None
            if lane.replaying:
                with contextlib.suppress(Exception):
                    position = await self._consumer.position(tp)
            items = lane.plan_items(
                flush_rows=self.flush_rows, now_ms=now_ms, position=position, closing=closing
            )
            planned = planned or bool(items)
            self.stats.replayed_items += sum(1 for item in items if not item.recorded)
            self._note_upstream_replays(tp, lane)
            if tp in self._paused_full and lane.buffered_rows <= self.flush_rows:
                self._paused_full.discard(tp)
                if not self._paused_outage:
                    self._consumer.resume(tp)
        committed = await self._commit()
        if planned and committed:
            await self._insert_pending()

    def _note_upstream_replays(self, tp: Any, lane: Lane) -> None:
        """Log rows a flush dropped as upstream replays, and marks left out of commits."""
        dropped = lane.dropped_rows
        if dropped:
            lane.dropped_rows = 0
            self.stats.upstream_replayed_rows += dropped
            log.warning(
                "sink.upstream_replay_dropped", topic=tp.topic, partition=tp.partition,
                rows=dropped, weight=lane.dropped_weight,
            )  # fmt: skip
            lane.dropped_weight = 0
        if lane.marks_cut:
            lane.marks_cut = False
            log.warning(
                "sink.marks_cut", topic=tp.topic, partition=tp.partition,
                input_partitions=sum(len(found) for found in lane.marks.values()),
                max_chars=MAX_MARKS_CHARS,
            )  # fmt: skip

    async def _commit(self) -> bool:
        """Commit every lane with news; on failure reload those lanes from Kafka."""
        offsets = {}
        for tp, lane in self.lanes.items():
            value = lane.commit_value()
            if lane.commit_due and value is not None:
                offsets[tp] = value
        if not offsets:
            return True
        from aiokafka.errors import KafkaError

        try:
            await self._consumer.commit(offsets)
        except (KafkaError, AssertionError) as exc:
            self.stats.commit_failures += 1
            log.warning("sink.commit_failed", error=str(exc)[:300], partitions=len(offsets))
            for tp in offsets:
                self.lanes.pop(tp, None)
            self._events.append(("reload", [tp for tp in offsets if self._assigned(tp)]))
            return False
        self.stats.commits += 1
        for tp in offsets:
            self.lanes[tp].commit_due = False
        return True

    def _assigned(self, tp: Any) -> bool:
        return tp in self._consumer.assignment()

    async def _insert_pending(self) -> bool:
        """Insert queued items in lane order; False (and back off, pause) on failure."""
        from aiokafka.errors import KafkaError

        for tp, lane in list(self.lanes.items()):
            while lane.pending and self.lanes.get(tp) is lane:
                item = lane.pending[0]
                try:
                    await self._insert(item, lane)
                except (ClickHouseError, KafkaError) as exc:
                    self._failed(exc)
                    return False
                lane.confirm()
        self._recovered()
        return True

    def _recovered(self) -> None:
        """ClickHouse took what was due: resume fetching, reset the backoff."""
        if self._paused_outage:
            self._paused_outage = False
            resumable = [tp for tp in self._consumer.assignment() if tp not in self._paused_full]
            self._consumer.resume(*resumable)
            log.info("sink.clickhouse_back", retry_after_s=self._backoff_s)
        self._backoff_s = BACKOFF_START_S

    async def _insert(self, item: WorkItem, lane: Lane) -> None:
        """Insert an item in parts of at most MAX_DAYS_PER_INSERT days; quarantine the
        parts ClickHouse refuses for good."""
        if not item.rows:
            return
        for token, rows in split_by_day(item.rows, item.token, DAY_INDEX[item.table]):
            ch = await self._handle()
            try:
                await asyncio.to_thread(
                    ch.insert, item.table, item.columns, rows, dedup_token=token,
                    settings=self.insert_settings,
                )  # fmt: skip
            except BatchRefused as exc:
                refused = Quarantined(
                    reason=exc.reason, detail=str(exc), table=item.table, columns=item.columns,
                    rows=rows, topic=lane.topic, partition=lane.partition, offset=item.first,
                    token=token,
                )  # fmt: skip
                await self.quarantine.put(refused, ch)
                continue
            self.stats.inserts += 1
            self.stats.rows_written += len(rows)
            if self._fault_after and self.stats.inserts >= self._fault_after:
                log.warning("sink.fault_kill", inserts=self.stats.inserts, token=token)
                os.kill(os.getpid(), signal.SIGKILL)

    def _failed(self, exc: Exception) -> None:
        self.stats.insert_failures += 1
        transient = not isinstance(exc, ClickHouseError) or isinstance(exc, ClickHouseUnavailable)
        (log.warning if transient else log.error)(
            "sink.insert_failed", error=str(exc)[:500], transient=transient,
            retry_in_s=round(self._backoff_s, 3),
        )  # fmt: skip
        if not transient and self._ch is not None:
            ch, self._ch = self._ch, None  # a fresh handle next time (e.g. after migrate)
            with contextlib.suppress(Exception):
                ch.close()
        self._retry_at_ms = monotonic_ms() + int(self._backoff_s * 1000)
        self._backoff_s = min(BACKOFF_CAP_S, self._backoff_s * 2)
        if not self._paused_outage:
            self._paused_outage = True
            self._consumer.pause(*self._consumer.assignment())

    def _log_progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress_s >= PROGRESS_LOG_INTERVAL_S:
            self._last_progress_s = now
            self.stats.quarantined_rows = self.quarantine.rows
            log.info("sink.progress", lanes=len(self.lanes), **self.stats.as_dict())


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Records rebalances; the sink's loop applies them between polls."""

    def __init__(self, events: deque[tuple[str, Any]]) -> None:
        self._events = events

    async def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
        self._events.append(("revoked", list(revoked)))

    async def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
        self._events.append(("assigned", list(assigned)))


def run_sink(settings: Settings) -> int:
    """``authpipe sink``: run until SIGTERM or SIGINT; returns the exit code.

    The cycle collector is tuned as in the worker (``pipeline.runtime``): the sink holds
    up to ``BUFFER_FACTOR * flush_rows`` decoded rows (a list each), and encoding an
    insert allocates a column list per column, so CPython's default thresholds walk those
    rows again and again: 40 % of clickhouse-connect's encoding time per row in
    ``bench.bench_sink``.
    """
    tune_gc()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await AuditSink(settings).run(stop)

    asyncio.run(main())
    return 0
