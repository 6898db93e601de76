"""The audit sink writes every attempt exactly once through failed commits, reloads,
rebalances, crashes and ClickHouse outages: the real loop (``pipeline.sinks.loop``)
against an in-memory Kafka (consumer, admin, committed offsets with metadata) and an
in-memory ClickHouse that, like the real one, inserts a dedup token only once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.errors import CommitFailedError
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata, TopicPartition
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pipeline.contracts.codec import dumps
from pipeline.contracts.models import AUDIT_COLUMNS
from pipeline.settings import Settings
from pipeline.sinks import loop as sink_loop
from pipeline.sinks.clickhouse import ClickHouseUnavailable
from pipeline.sinks.loop import ClickHouseSink
from pipeline.sinks.plan import decode_plan
from pipeline.sinks.ratecap import RateCapConfig
from tests.unit.test_sink_support import audit_row as support_row

SETTINGS = Settings()
AUDIT = SETTINGS.kafka.audit_topic
TP = TopicPartition(AUDIT, 0)
BASE_MS = 1_796_661_780_000  # 2026-12-07 16:43 UTC, a minute's start
COL = {name: index for index, name in enumerate(AUDIT_COLUMNS)}
WEIGHT, EVENT_ID, SUMMARY = COL["weight"], COL["event_id"], COL["summary"]


def audit_row(index: int, ts_ms: int, account: str, source: str) -> list[Any]:
    """A failed attempt (capped), input coordinates (auth.login-attempts, 0, index)."""
    return support_row(index, ts_ms, account=account, source=source, partition=0)


def audit_log(
    sizes: list[int], gaps: list[bool], minutes: list[int], again: list[int] | None = None
) -> list[ConsumerRecord]:
    """Audit messages of ``sizes`` new rows each, on two accounts and three sources; a
    gap (a transaction marker's offset) before message i when ``gaps[i]``; message i in
    minute ``minutes[i]`` (non-decreasing); message i first repeats the last ``again[i]``
    rows written before it (an upstream replay after a worker crash)."""
    records = []
    offset = 0
    earlier: list[list[Any]] = []
    for position, size in enumerate(sizes):
        offset += 1 if gaps[position] else 0
        repeat = again[position] if again else 0
        rows = earlier[len(earlier) - repeat :] if repeat else []
        for _ in range(size):
            index = len(earlier)
            ts_ms = BASE_MS + minutes[position] * 60_000 + index
            row = audit_row(index, ts_ms, f"acct-{index % 2}", f"198.51.100.{index % 3}")
            rows.append(row)
            earlier.append(row)
        value = dumps({"v": 1, "columns": list(AUDIT_COLUMNS), "rows": rows})
        records.append(ConsumerRecord(AUDIT, 0, offset, 0, 0, None, value, None, 0, 0, []))
        offset += 1
    return records


class FakeKafka:
    """One audit partition: the consumer (positions as aiokafka keeps them: a getmany
    moves them past what it returns, a seek or a new assignment resets them), the admin
    client and the group's committed offsets with their metadata."""

    def __init__(self, records: list[ConsumerRecord]) -> None:
        self.records = records
        self.end = records[-1].offset + 1 if records else 0
        self.position_of = 0
        self.committed: dict[TopicPartition, OffsetAndMetadata] = {}
        self.fetch_size = 2
        self.fail_commits = 0
        self.applied_failures = False  # a failed commit the broker stored all the same
        self.rebalance_in_commit = False  # the group rebalances while a commit is sent
        self.events: Any = None  # the sink's rebalance events

    # -- consumer
    def assignment(self) -> set[TopicPartition]:
        return {TP}

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> dict[Any, Any]:
        batch = [r for r in self.records if r.offset >= self.position_of][: self.fetch_size]
        if not batch:
            return {}
        self.position_of = batch[-1].offset + 1
        return {TP: batch}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.position_of = offset

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self.position_of = 0

    async def position(self, tp: TopicPartition) -> int:
        return self.position_of

    def pause(self, *tps: TopicPartition) -> None:
        pass

    def resume(self, *tps: TopicPartition) -> None:
        pass

    async def commit(self, offsets: dict[TopicPartition, tuple[int, str]]) -> None:
        if self.rebalance_in_commit:
            self.rebalance_in_commit = False
            self.rebalance()
        failed = self.fail_commits > 0
        if failed:
            self.fail_commits -= 1
        if not failed or self.applied_failures:
            for tp, (offset, metadata) in offsets.items():
                self.committed[tp] = OffsetAndMetadata(offset, metadata)
        if failed:
            raise CommitFailedError("the group rebalanced (a test's failed commit)")

    async def stop(self) -> None:
        pass

    # -- admin
    async def list_consumer_group_offsets(
        self, group_id: str, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        return {tp: self.committed[tp] for tp in partitions if tp in self.committed}

    async def close(self) -> None:
        pass

    # -- the group
    def start_at_committed(self) -> None:
        """Where a consumer starts on a new assignment (auto_offset_reset earliest)."""
        found = self.committed.get(TP)
        self.position_of = found.offset if found is not None else 0

    def rebalance(self) -> None:
        """The partition revoked and assigned again, as aiokafka reports it."""
        self.start_at_committed()
        self.events.append(("revoked", [TP]))
        self.events.append(("assigned", [TP]))


class FakeClickHouse:
    """Inserts keep the first rows of each dedup token, as the tables' dedup window does."""

    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.rows: list[list[Any]] = []
        self.down = False

    def insert(
        self,
        table: str,
        columns: Any,
        rows: Any,
        *,
        dedup_token: str | None = None,
        settings: Any = None,
    ) -> None:
        if self.down:
            raise ClickHouseUnavailable("ClickHouse is down (a test's outage)")
        assert table == "attempts" and dedup_token is not None
        if dedup_token in self.tokens:
            return
        self.tokens.add(dedup_token)
        self.rows.extend(list(row) for row in rows)

    def close(self) -> None:
        pass


class Clock:
    """The loop's monotonic milliseconds, moved by the test."""

    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


CLOCK = Clock()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    monkeypatch.setattr(sink_loop, "monotonic_ms", CLOCK)
    yield CLOCK


class Harness:
    """A sink on the fakes, restarted (as after a crash) from the committed state."""

    def __init__(self, records: list[ConsumerRecord], clock: Clock, rows_per_minute: int) -> None:
        self.kafka = FakeKafka(records)
        self.ch = FakeClickHouse()
        self.clock = clock
        self.rows_per_minute = rows_per_minute
        self.loop = asyncio.new_event_loop()
        self.sink = self._new_sink()
        self.run(self.sink._apply_events())

    def _new_sink(self) -> ClickHouseSink:
        sink = ClickHouseSink(SETTINGS, open_ch=lambda: self.ch)  # type: ignore[arg-type,return-value]
        sink.cap_config = RateCapConfig(rows_per_minute=self.rows_per_minute, max_keys=1000)
        sink.flush_interval_ms = 0
        sink._consumer = self.kafka
        sink._admin = self.kafka
        self.kafka.events = sink._events
        self.kafka.start_at_committed()
        sink._events.append(("assigned", [TP]))
        return sink

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    def poll(self) -> None:
        self.clock.now_ms += 100
        self.run(self.sink.poll_once())

    def crash(self) -> None:
        """The process dies: nothing of its memory survives, Kafka and ClickHouse do."""
        self.sink = self._new_sink()

    def drain(self) -> None:
        """ClickHouse back; poll until every message is in, then shut down; start again
        until a shutdown committed the end with an empty plan (a failed commit at
        shutdown leaves the last closes to the next start, as in production)."""
        self.ch.down = False
        for _ in range(5):
            self.sink.writer.retry_at_ms = 0
            for _ in range(1000):
                lanes = self.sink.lanes.values()
                if (
                    self.kafka.position_of >= self.kafka.end
                    and not self.sink._events
                    and all(not lane.replaying and not lane.buffer for lane in lanes)
                    and not self.sink._has_pending()
                ):
                    break
                self.poll()
            self.run(self.sink._shutdown())
            found = self.kafka.committed.get(TP)
            if found is not None and (found.offset, decode_plan(found.metadata)) == (
                self.kafka.end,
                [],
            ):
                break
            self.crash()
        self.loop.close()

    def written(self) -> tuple[int, list[str]]:
        """(sum of weights in ClickHouse, event ids of rows that are not summaries)."""
        weight = sum(row[WEIGHT] for row in self.ch.rows)
        return weight, [row[EVENT_ID] for row in self.ch.rows if not row[SUMMARY]]


def test_a_reload_after_a_failed_commit_is_not_fed_records_fetched_before_it(
    clock: Clock,
) -> None:
    """A lane reloaded after a failed commit replays from its committed offset, not
    from records the poll had fetched past it: 40 attempts, sum(weight) exactly 40."""
    records = audit_log([2] * 20, [False] * 20, [0] * 20)
    h = Harness(records, clock, rows_per_minute=3)
    h.poll()  # offsets 0-1 planned, committed (0, "ap1:2"), inserted; the cap holds keys
    h.poll()  # 2-3 likewise
    h.kafka.fail_commits = 1
    h.poll()  # 4-5 planned; the commit fails: the lane is dropped, a reload queued
    h.poll()  # fetches 6-7, then reloads the lane at offset 0 with the plan [2, 2]
    h.kafka.rebalance()  # later the group settles: revoked, assigned, replayed again
    h.drain()
    weight, ids = h.written()
    assert (weight, sorted(ids)) == (40, [f"ev-{i}" for i in range(6)])  # 6 rows, summaries
    assert h.kafka.committed[TP] == OffsetAndMetadata(20, "ap1:|auth.login-attempts=0:39")


class SinkMachine(RuleBasedStateMachine):
    """Random polls, fetch sizes, failed commits, rebalances, crashes, outages and quiet
    spells over a random audit partition; at the end ClickHouse holds every attempt's
    weight exactly once."""

    def __init__(self) -> None:
        super().__init__()
        self.h: Harness | None = None
        self.total = 0

    @precondition(lambda self: self.h is None)
    @rule(
        data=st.data(),
        count=st.integers(min_value=1, max_value=14),
        rows_per_minute=st.integers(min_value=1, max_value=3),
    )
    def start(self, data: st.DataObject, count: int, rows_per_minute: int) -> None:
        sizes = data.draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
        gaps = data.draw(st.lists(st.booleans(), min_size=count, max_size=count))
        steps = data.draw(st.lists(st.integers(0, 1), min_size=count, max_size=count))
        again = data.draw(st.lists(st.integers(0, 2), min_size=count, max_size=count))
        minutes = [sum(steps[: i + 1]) for i in range(count)]
        records = audit_log(sizes, gaps, minutes, again)
        self.total = sum(sizes)
        self.h = Harness(records, CLOCK, rows_per_minute)

    @precondition(lambda self: self.h is not None)
    @rule(fetch=st.integers(min_value=1, max_value=4))
    def poll(self, fetch: int) -> None:
        assert self.h is not None
        self.h.kafka.fetch_size = fetch
        self.h.poll()

    @precondition(lambda self: self.h is not None)
    @rule(count=st.integers(min_value=1, max_value=2), applied=st.booleans())
    def fail_commits(self, count: int, applied: bool) -> None:
        assert self.h is not None
        self.h.kafka.fail_commits = count
        self.h.kafka.applied_failures = applied

    @precondition(lambda self: self.h is not None)
    @rule(in_commit=st.booleans())
    def rebalance(self, in_commit: bool) -> None:
        assert self.h is not None
        if in_commit:
            self.h.kafka.rebalance_in_commit = True
        else:
            self.h.kafka.rebalance()

    @precondition(lambda self: self.h is not None)
    @rule()
    def crash(self) -> None:
        assert self.h is not None
        self.h.crash()

    @precondition(lambda self: self.h is not None)
    @rule(down=st.booleans())
    def clickhouse(self, down: bool) -> None:
        assert self.h is not None
        self.h.ch.down = down
        self.h.sink.writer.retry_at_ms = 0

    @precondition(lambda self: self.h is not None)
    @rule()
    def quiet(self) -> None:
        assert self.h is not None
        self.h.clock.now_ms += 6_000  # past IDLE_CLOSE_MS: the next flush closes the cap

    @invariant()
    def never_more_than_produced(self) -> None:
        if self.h is not None:
            weight, ids = self.h.written()
            assert len(ids) == len(set(ids))
            assert weight <= self.total

    def teardown(self) -> None:
        if self.h is not None:
            self.h.drain()
            weight, ids = self.h.written()
            assert len(ids) == len(set(ids))
            assert weight == self.total


def test_sink_state_machine(clock: Clock) -> None:
    """Polls, failed commits, rebalances, crashes and outages in any order: exactly once."""
    SinkMachine.TestCase.settings = settings(
        max_examples=500,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    SinkMachine.TestCase("runTest").runTest()
