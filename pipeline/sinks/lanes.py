"""The sink's lanes (pure: no I/O, no clock; time is a parameter): buffered messages
cut into batches, the plan recorded before the inserts, and the cap.

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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline.sinks.plan import (
    CLOSE,
    MAX_PLAN_CHARS,
    Entry,
    Marks,
    encode_marks,
    encode_plan,
)
from pipeline.sinks.ratecap import RateCap, RateCapConfig
from pipeline.sinks.rows import OFFSET, PARTITION, TOPIC, WEIGHT, Message
from pipeline.sinks.tables import TABLES, LaneKind

IDLE_CLOSE_MS: Final = 5_000


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
        cls,
        topic: str,
        partition: int,
        kind: LaneKind,
        committed: int | None,
        plan: Sequence[Entry],
        cap: RateCapConfig,
        marks: Marks | None = None,
    ) -> Lane:
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
        self,
        *,
        flush_rows: int,
        now_ms: int,
        position: int | None = None,
        idle_close_ms: int = IDLE_CLOSE_MS,
        closing: bool = False,
    ) -> list[WorkItem]:
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
            if row[TOPIC] != topic:
                topic = row[TOPIC]
                found = marks.setdefault(topic, {})
            partition, offset = row[PARTITION], row[OFFSET]
            if offset > found.get(partition, -1):
                found[partition] = offset
                if fresh is not rows:
                    fresh.append(row)
                continue
            if fresh is rows:
                fresh = rows[:index]  # the first replayed row: copy what passed so far
            self.dropped_rows += 1
            self.dropped_weight += row[WEIGHT]
        return fresh

    def _close(self, items: list[WorkItem], *, record: bool) -> None:
        assert self.cap is not None and self.next_offset is not None
        rows: list[list[Any]] = []
        self.cap.close_all(rows)
        self.minute = None
        token = f"{self.table}:{self.topic}:{self.partition}:close@{self.next_offset}"
        self._item(
            items, rows, token, self.next_offset, CLOSE if record else None, self.next_offset
        )

    def _item(
        self,
        items: list[WorkItem],
        rows: list[list[Any]],
        token: str,
        clean: int | None,
        entry: Entry | None,
        first: int,
    ) -> None:
        table, columns = TABLES[self.kind]
        marks = ""
        if clean is not None and self.marks:
            marks, cut = encode_marks(self.marks)
            self.marks_cut = self.marks_cut or cut
        item = WorkItem(
            table,
            columns,
            rows,
            token,
            clean,
            recorded=entry is not None,
            marks=marks,
            first=first,
        )
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
