"""The ClickHouse sink: pure lanes and decoders, then end to end on the real broker.

End-to-end tests run ``.venv/bin/authpipe sink`` as a subprocess against the session's
Kafka broker and the chdb-backed HTTP endpoint (``chhttp``), on unique topics and a
unique consumer group each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.contracts.codec import DecodeError as BadMessage
from pipeline.contracts.codec import dumps, encode
from pipeline.contracts.models import AUDIT_COLUMNS, Alert, Decision, datetime_to_ms
from pipeline.kafka_admin import TopicSpec, ensure_topics
from pipeline.settings import ClickHouseSettings
from pipeline.sinks.clickhouse import ClickHouse
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.lanes import Lane, WorkItem
from pipeline.sinks.migrate import SCHEMA_DIR, apply_migrations, render, split_statements
from pipeline.sinks.plan import (
    CLOSE,
    MAX_MARKS_CHARS,
    decode_marks,
    decode_plan,
    encode_marks,
    encode_plan,
)
from pipeline.sinks.ratecap import RateCapConfig
from pipeline.sinks.rows import Message, decode_audit, decode_dead_letter
from pipeline.sinks.rows import decision_message as decode_decision
from tests.plugins.clickhouse import ChHttpEndpoint, recent_minute
from tests.plugins.waiting import wait_until
from tests.unit.test_sink_support import audit_row as support_row

REPO_ROOT = Path(__file__).resolve().parents[2]
AUTHPIPE = REPO_ROOT / ".venv" / "bin" / "authpipe"
PARTITIONS = 2
SINK_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
SOURCE = "203.0.113.66"


# -- helpers -----------------------------------------------------------------------------


def audit_row(
    index: int,
    ts: datetime,
    *,
    outcome: str = "failure",
    account: str = "acct",
    source: str = SOURCE,
    tenant: str = "acme",
) -> list[Any]:
    """One audit row (AUDIT_COLUMNS order), input coordinates from ``index``."""
    return support_row(
        index, datetime_to_ms(ts), outcome=outcome, account=account, source=source, tenant=tenant
    )


def audit_batch(rows: list[list[Any]]) -> bytes:
    return dumps({"v": 1, "columns": list(AUDIT_COLUMNS), "rows": rows})


def decision(key: str, minute: datetime, count: int) -> Decision:
    scope, tenant, account, source, _ = key.split("|")
    return Decision(
        decision_id=f"d-{uuid.uuid4().hex[:8]}",
        key=key,
        tenant=tenant,
        scope=scope,  # type: ignore[arg-type]
        account_digest=None if account == "-" else account,
        source=None if source == "-" else source,
        device_id=None,
        applies_to="untrusted",
        action="block",
        rule=scope,
        count=count,
        threshold=5,
        window_ms=900_000,
        issued_at=minute,
        expires_at=minute + timedelta(minutes=15),
        policy_version="p1",
    )


class Topics:
    """Unique topic names and a unique app id for one test."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.app_id = f"sinktest-{tag}"
        self.audit = f"audit-{tag}"
        self.decisions = f"decisions-{tag}"
        self.alerts = f"alerts-{tag}"
        self.dlq = f"dlq-{tag}"

    def env(self, bootstrap: str, clickhouse_url: str) -> dict[str, str]:
        return {
            "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "AUTHPIPE_KAFKA_PARTITIONS": str(PARTITIONS),
            "AUTHPIPE_KAFKA_APP_ID": self.app_id,
            "AUTHPIPE_KAFKA_AUDIT_TOPIC": self.audit,
            "AUTHPIPE_KAFKA_DECISIONS_TOPIC": self.decisions,
            "AUTHPIPE_KAFKA_ALERTS_TOPIC": self.alerts,
            "AUTHPIPE_KAFKA_DLQ_TOPIC": self.dlq,
            "AUTHPIPE_CLICKHOUSE_URL": clickhouse_url,
            "AUTHPIPE_AUDIT_FLUSH_INTERVAL_MS": "200",
            "AUTHPIPE_LOG_FORMAT": "json",
            "AUTHPIPE_LOG_LEVEL": "info",
        }


class SinkProcess:
    """``authpipe sink`` in a subprocess, logging JSON lines to a file."""

    def __init__(self, env: dict[str, str], workdir: Path, log_path: Path) -> None:
        self.env = {**os.environ, **env}
        self.env.pop("AUTHPIPE_CONFIG", None)
        self.workdir = workdir
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, extra_env: dict[str, str] | None = None) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(AUTHPIPE), "sink"],
                cwd=self.workdir,
                env={**self.env, **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> int:
        """SIGTERM and wait (SIGKILL after STOP_TIMEOUT_S); the exit code."""
        process = self.process
        if process is None:
            return 0
        self.process = None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)
                raise AssertionError(f"the sink did not stop on SIGTERM:\n{self.tail()}") from None
        return int(process.returncode)

    def wait_exit(self, timeout_s: float) -> int:
        assert self.process is not None
        code = self.process.wait(timeout=timeout_s)
        self.process = None
        return code

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                event = json.loads(line)
                if event.get("event") == name:
                    found.append(event)
        return found

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]


@pytest.fixture
def topics() -> Topics:
    return Topics()


@pytest.fixture
def ch(chhttp: ChHttpEndpoint, chdb_path: Path) -> Iterator[ClickHouse]:
    """The test's reader of chhttp, with every migration applied."""
    settings = ClickHouseSettings(url=chhttp.url, path=chdb_path)
    with open_clickhouse(settings, create_database=True) as handle:
        apply_migrations(handle, settings)
        yield handle


@pytest.fixture
def sink(
    topics: Topics, kafka_bootstrap: str, chhttp: ChHttpEndpoint, tmp_path: Path
) -> Iterator[SinkProcess]:
    process = SinkProcess(topics.env(kafka_bootstrap, chhttp.url), tmp_path, tmp_path / "sink.log")
    try:
        yield process
    finally:
        if process.log_path.exists():
            print(f"--- sink log tail ({process.log_path}) ---\n{process.tail()}")
        if process.process is not None and process.process.poll() is None:
            process.process.kill()
            process.process.wait(timeout=STOP_TIMEOUT_S)


async def create_topics(bootstrap: str, topics: Topics) -> None:
    names = [topics.audit, topics.decisions, topics.alerts, topics.dlq]
    await ensure_topics(bootstrap, [TopicSpec(name, PARTITIONS) for name in names])


async def produce(bootstrap: str, messages: list[tuple[str, int, Any, Any, Any]]) -> None:
    """(topic, partition, key, value, headers) each, in order, acks=all."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await producer.start()
    try:
        for topic, partition, key, value, headers in messages:
            await producer.send_and_wait(
                topic, value=value, key=key, partition=partition, headers=headers or []
            )
    finally:
        await producer.stop()


def scalar(ch: ClickHouse, sql: str) -> Any:
    return ch.query(sql)[0][0]


def totals(ch: ClickHouse) -> tuple[int, int, int]:
    """(sum(weight), rows, distinct event ids) of attempts."""
    row = ch.query("SELECT toInt64(sum(weight)), count(), uniqExact(event_id) FROM attempts")[0]
    return int(row[0]), int(row[1]), int(row[2])


# -- pure parts --------------------------------------------------------------------------


def test_plan_metadata_round_trips_and_refuses_foreign_metadata() -> None:
    """A plan encodes as ap1:<spans and !> and decodes back; foreign metadata is refused."""
    entries: list[int | str] = [120, 37, CLOSE, 15]
    assert encode_plan(entries) == "ap1:120,37,!,15"
    assert decode_plan("ap1:120,37,!,15") == entries
    assert decode_plan("") == []
    assert decode_plan(None) == []
    assert decode_plan("ap1:") == []
    with pytest.raises(Exception, match="not a sink plan"):
        decode_plan("ap1:12,x")


def test_decode_audit_skips_bad_rows_and_refuses_bad_batches() -> None:
    """Valid rows pass; a row with a text ts is dropped and counted; non-JSON is refused."""
    ts = recent_minute()
    good = audit_row(1, ts)
    bad = [*good[:0], "soon", *good[1:]]
    message = decode_audit(7, audit_batch([good, bad]))
    assert message.rows == [good]
    assert message.bad_rows == 1
    assert message.max_minute == datetime_to_ms(ts) // 60_000
    for value, reason in [(b"{oops", "not_json"), (b"[1]", "not_object"), (None, "empty")]:
        with pytest.raises(BadMessage, match=reason):
            decode_audit(7, value)
    with pytest.raises(BadMessage, match="bad_version"):
        decode_audit(7, dumps({"v": 2, "columns": [], "rows": []}))


def test_decode_audit_reorders_columns_by_name() -> None:
    """A batch with the columns in another order yields rows in AUDIT_COLUMNS order."""
    row = audit_row(1, recent_minute())
    columns = list(reversed(AUDIT_COLUMNS))
    message = decode_audit(0, dumps({"v": 1, "columns": columns, "rows": [row[::-1]]}))
    assert message.rows == [row]


def test_tombstone_row_comes_from_the_key() -> None:
    """A null decision value becomes a tombstone row with scope/tenant/subject from the key."""
    message = decode_decision(
        "t", 1, 5, 1_790_000_000_000, b"account_source|acme|abc|203.0.113.9|-", None
    )
    (row,) = message.rows
    assert row[:7] == [
        "",
        "account_source|acme|abc|203.0.113.9|-",
        "acme",
        "account_source",
        "abc",
        "203.0.113.9",
        None,
    ]
    assert row[13:] == [1_790_000_000_000, 1_790_000_000_000, "", True, None, None, None, "t", 1, 5]
    with pytest.raises(BadMessage, match="bad_key"):
        decode_decision("t", 1, 5, 0, b"garbage", None)


def test_dead_letter_headers_locate_the_original() -> None:
    """DLQ headers give reason, stage and the original coordinates; without them, defaults."""
    headers = [
        ("error", b"not_json"),
        ("error_detail", b"x"),
        ("stage", b"ingest"),
        ("source_topic", b"auth.login-attempts"),
        ("source_partition", b"3"),
        ("source_offset", b"42"),
    ]
    located = decode_dead_letter("dlq", 0, 9, 1_000, headers)
    assert located.rows == [[1_000, "not_json", "ingest", "auth.login-attempts", 3, 42]]
    assert located.bad_reason is None
    bare = decode_dead_letter("dlq", 0, 9, 1_000, [])
    assert bare.rows == [[1_000, "unknown", "unknown", "dlq", 0, 9]]
    assert bare.bad_reason == "bad_headers"


def _lane(plan: list[int | str], committed: int | None) -> Lane:
    return Lane.start("auth.audit", 0, "audit", committed, plan, RateCapConfig(rows_per_minute=3))


def _messages(count: int) -> list[Message]:
    base = recent_minute()
    out = []
    for offset in range(count):
        ts = base + timedelta(seconds=offset * 20)  # 3 messages per minute
        rows = [audit_row(offset * 10 + i, ts, account=f"a{i}") for i in range(4)]
        out.append(decode_audit(offset, audit_batch(rows)))
    return out


def test_lane_replay_rebuilds_the_same_items_and_tokens() -> None:
    """Items planned in timing-dependent flushes are rebuilt identically from the plan."""
    messages = _messages(9)
    first = _lane([], None)
    items = []
    for chunk in (messages[0:2], messages[2:5], messages[5:9]):  # three flushes
        for message in chunk:
            first.add(message, now_ms=0)
        items += first.plan_items(flush_rows=1000, now_ms=0)
    items += first.plan_items(flush_rows=1000, now_ms=0, closing=True)
    plan = list(first.plan)
    assert plan == [2, 1, CLOSE, 2, 1, CLOSE, 3, CLOSE]

    again = _lane(plan, 0)
    for message in _messages(9):
        again.add(message, now_ms=0)
    replayed = again.plan_items(flush_rows=1000, now_ms=0, position=9)
    assert [(i.token, i.rows, i.clean) for i in replayed] == [
        (i.token, i.rows, i.clean) for i in items
    ]
    assert all(not i.recorded for i in replayed)
    assert sum(row[12] for i in items for row in i.rows) == 9 * 4


def test_lane_confirm_moves_the_clean_offset_and_trims_the_plan() -> None:
    """Confirming items up to a close commits the close's offset with the rest of the plan."""
    lane = _lane([], None)
    for message in _messages(4):
        lane.add(message, now_ms=0)
    items = lane.plan_items(flush_rows=1000, now_ms=0)
    assert len(items) == 3
    assert list(lane.plan) == [3, CLOSE, 1]
    assert lane.commit_value() == (0, "ap1:3,!,1")
    lane.confirm()
    assert lane.commit_value() == (0, "ap1:3,!,1")
    lane.confirm()
    marks = "|auth.login-attempts=0:21,1:22,2:23,3:10,4:11,5:12,6:20"  # of offsets 0-2
    assert lane.commit_value() == (3, "ap1:1" + marks)
    lane.confirm()
    assert lane.commit_value() == (3, "ap1:1" + marks)


def test_plan_never_outgrows_kafka_commit_metadata() -> None:
    """3,000 messages a minute apart (a close each): every committed plan fits in 4 KiB."""
    base = recent_minute() - timedelta(days=3)
    lane = _lane([], None)
    for offset in range(3000):
        row = audit_row(offset, base + timedelta(minutes=offset))
        lane.add(decode_audit(offset, audit_batch([row])), now_ms=0)
    longest = 0
    weight = 0
    calls = 0
    while True:
        closing = not lane.buffer
        calls += 1
        items = lane.plan_items(flush_rows=1000, now_ms=0, closing=closing)
        value = lane.commit_value()
        assert value is not None
        longest = max(longest, len(value[1].encode()))
        weight += sum(row[12] for item in items for row in item.rows)
        while lane.pending:
            lane.confirm()
        if closing:
            break
    assert 2000 < longest <= 4096
    assert calls > 3
    assert weight == 3000
    assert lane.commit_value() == (
        3000,
        "ap1:|auth.login-attempts=0:2996,1:2997,2:2998,3:2999,4:2993,5:2994,6:2995",
    )


def test_stateless_lane_is_clean_after_every_batch() -> None:
    """A decisions lane commits the end of each confirmed batch with an empty plan."""
    lane = Lane.start("auth.throttle-decisions", 1, "decisions", 40, [], RateCapConfig())
    for offset in (40, 41, 43):
        lane.add(decode_decision("t", 1, offset, 0, b"account|acme|a|-|-", None), now_ms=0)
    (item,) = lane.plan_items(flush_rows=2, now_ms=0)[:1]
    assert item.token == "decisions:auth.throttle-decisions:1:40-41"
    assert lane.commit_value() == (40, "ap1:2,2")
    lane.confirm()
    assert lane.commit_value() == (42, "ap1:2")
    lane.confirm()
    assert lane.commit_value() == (44, "ap1:")


def test_marks_round_trip_after_the_plan_and_fit_the_metadata() -> None:
    """Marks encode after the plan and decode back; too many input partitions are cut."""
    marks = {"auth.login-attempts": {3: 10, 0: 7}, "b.topic": {1: 2}}
    text, cut = encode_marks(marks)
    assert (text, cut) == ("|auth.login-attempts=0:7,3:10|b.topic=1:2", False)
    metadata = encode_plan([12, CLOSE], text)
    assert decode_plan(metadata) == [12, CLOSE]
    assert decode_marks(metadata) == marks
    assert decode_marks("ap1:12,!") == {}
    assert decode_marks(None) == {}
    with pytest.raises(Exception, match="not a sink plan"):
        decode_marks("ap1:1|t=x:1")
    many = {"auth.login-attempts": {p: 10**12 + p for p in range(500)}}
    text, cut = encode_marks(many)
    assert cut
    assert len(text) <= MAX_MARKS_CHARS
    kept = decode_marks("ap1:" + text)["auth.login-attempts"]
    assert kept == {p: 10**12 + p for p in range(len(kept))}


def _replay_workload(minute: datetime) -> list[bytes]:
    """Three audit messages of one worker partition; the third starts with a replay.

    0: 100 failures from SOURCE on 100 accounts (input offsets 0-99, partitions i % 7);
    1: 50 successes (100-149); 2: the worker crashed and applied its last two envelopes
    again: failures 80-99 and successes 100-149 come a second time, then 10 new
    failures on one account (150-159).
    """
    failures = [
        audit_row(i, minute + timedelta(milliseconds=10 * i), account=f"acct-{i}")
        for i in range(100)
    ]
    successes = [
        audit_row(
            i,
            minute + timedelta(seconds=2),
            outcome="success",
            account=f"acct-{i}",
            source=f"198.51.100.{i % 200}",
        )
        for i in range(100, 150)
    ]
    new = [
        audit_row(i, minute + timedelta(seconds=3), account="victim", source="192.0.2.1")
        for i in range(150, 160)
    ]
    return [
        audit_batch(failures),
        audit_batch(successes),
        audit_batch(failures[80:] + successes + new),
    ]


REPLAY_ATTEMPTS = 160
# 100 failures of one source: 60 rows + a source summary of 40; 50 successes; 10 new
# failures on one account and source (under the cap): 60 + 1 + 50 + 10 rows.
REPLAY_ROWS = 121


def _insert_items(ch: ClickHouse, items: list[WorkItem]) -> None:
    for item in items:
        ch.insert(item.table, item.columns, item.rows, dedup_token=item.token)


def test_lane_drops_upstream_replays_before_the_cap() -> None:
    """Replayed input offsets are dropped before the cap: weights add up to 160, not 230."""
    lane = Lane.start("auth.audit", 0, "audit", None, [], RateCapConfig())
    for offset, value in enumerate(_replay_workload(recent_minute())):
        lane.add(decode_audit(offset, value), now_ms=0)
    items = lane.plan_items(flush_rows=1000, now_ms=0, closing=True)
    rows = [row for item in items for row in item.rows]
    assert sum(row[12] for row in rows) == REPLAY_ATTEMPTS
    assert len(rows) == REPLAY_ROWS
    assert (lane.dropped_rows, lane.dropped_weight) == (70, 70)
    assert sorted(row[18] for row in rows if not row[13]) == sorted([*range(60), *range(100, 160)])


def test_replayed_audit_batch_after_a_sink_restart_is_counted_once_in_clickhouse(
    ch: ClickHouse,
) -> None:
    """A lane restarted from its commit drops an upstream replay: exact counts, views too."""
    messages = _replay_workload(recent_minute())
    first = Lane.start("auth.audit", 0, "audit", None, [], RateCapConfig())
    for offset, value in enumerate(messages[:2]):
        first.add(decode_audit(offset, value), now_ms=0)
    _insert_items(ch, first.plan_items(flush_rows=1000, now_ms=0, closing=True))
    while first.pending:
        first.confirm()
    committed = first.commit_value()
    assert committed is not None and committed[0] == 2

    offset, metadata = committed
    again = Lane.start(
        "auth.audit",
        0,
        "audit",
        offset,
        decode_plan(metadata),
        RateCapConfig(),
        decode_marks(metadata),
    )
    again.add(decode_audit(2, messages[2]), now_ms=0)
    _insert_items(ch, again.plan_items(flush_rows=1000, now_ms=0, closing=True))
    assert (again.dropped_rows, again.dropped_weight) == (70, 70)

    assert totals(ch) == (REPLAY_ATTEMPTS, REPLAY_ROWS, REPLAY_ROWS)
    assert scalar(ch, "SELECT sum(attempts) FROM attempts_by_flow_minute") == REPLAY_ATTEMPTS
    assert ch.query(
        "SELECT outcome, toInt64(sum(attempts)) FROM attempts_by_flow_minute "
        "GROUP BY outcome ORDER BY outcome"
    ) == [("failure", 110), ("success", 50)]
    assert ch.query(
        "SELECT source, toInt64(sum(failures)), uniqMerge(accounts) "
        "FROM attempts_by_source_minute GROUP BY source HAVING sum(failures) > 0 ORDER BY source"
    ) == [("192.0.2.1", 10, 1), (SOURCE, 100, 60)]
    assert ch.query(
        "SELECT toInt64(sum(attempts)), toInt64(sum(failures)) FROM attempts_by_account_minute"
    ) == [(60 + 50 + 10, 60 + 10)]  # the source summary has no account


# -- end to end on the real broker -------------------------------------------------------


def _workload(topics: Topics, minute: datetime) -> list[tuple[str, int, Any, Any, Any]]:
    """Audit, decisions, alerts and dead letters with known answers (see the test)."""
    p0_failures = [
        audit_row(i, minute + timedelta(milliseconds=10 * i), account=f"acct-{i}")
        for i in range(100)
    ]
    p0_successes = [
        audit_row(
            1000 + i,
            minute + timedelta(seconds=2),
            outcome="success",
            account=f"acct-{i}",
            source=f"198.51.100.{i}",
        )
        for i in range(20)
    ]
    mixed = [audit_row(2000, minute + timedelta(seconds=3), outcome="success")]
    bad_row = list(mixed[0])
    bad_row[0] = "later"
    p1_victim = [
        audit_row(
            3000 + i,
            minute + timedelta(milliseconds=5 * i),
            account="victim",
            source=f"192.0.2.{i}",
        )
        for i in range(70)
    ]
    block = decision("account|acme|victim|-|-", minute, 50)
    pair = decision(f"account_source|acme|acct-1|{SOURCE}|-", minute, 5)
    alert = Alert(
        alert_id="al-1",
        type="spray_source",
        tenant="acme",
        source=SOURCE,
        account_digest=None,
        count=100,
        distinct_accounts=100,
        window_start=minute,
        window_end=minute + timedelta(minutes=15),
        policy_version="p1",
    )
    dlq_headers = [
        ("error", b"not_json"),
        ("error_detail", b"bad"),
        ("stage", b"ingest"),
        ("source_topic", b"auth.login-attempts"),
        ("source_partition", b"1"),
    ]
    return [
        (topics.audit, 0, b"0", audit_batch(p0_failures[:50]), None),
        (topics.audit, 0, b"0", audit_batch(p0_failures[50:] + p0_successes), None),
        (topics.audit, 0, b"0", b"not json at all", None),
        (topics.audit, 0, b"0", audit_batch([*mixed, bad_row]), None),
        (topics.audit, 1, b"1", audit_batch(p1_victim), None),
        (topics.decisions, 0, block.key.encode(), encode(block), None),
        (topics.decisions, 1, pair.key.encode(), encode(pair), None),
        (topics.decisions, 1, pair.key.encode(), None, None),
        (topics.decisions, 0, b"k", b"{not json", None),
        (topics.alerts, 0, None, encode(alert), None),
        (topics.alerts, 1, None, b'{"alert_id": "x"}', None),
        (topics.dlq, 0, b"k", b"raw-1", [*dlq_headers, ("source_offset", b"10")]),
        (topics.dlq, 1, b"k", b"raw-2", [*dlq_headers, ("source_offset", b"11")]),
        (topics.dlq, 1, b"k", b"raw-3", []),
    ]


WORKLOAD_ATTEMPTS = 100 + 20 + 1 + 70


async def test_sink_writes_every_topic_exactly(
    kafka_bootstrap: str, topics: Topics, ch: ClickHouse, sink: SinkProcess
) -> None:
    """Audit (capped, with summaries), decisions, tombstones, alerts, DLQ land exactly."""
    await create_topics(kafka_bootstrap, topics)
    minute = recent_minute()
    await produce(kafka_bootstrap, _workload(topics, minute))
    sink.start()
    wait_until(
        lambda: (
            totals(ch)[0] == WORKLOAD_ATTEMPTS
            and scalar(ch, "SELECT countIf(summary) FROM attempts") == 2
        ),
        SINK_TIMEOUT_S,
        description="every attempt and both summaries in ClickHouse",
    )
    wait_until(
        lambda: (
            scalar(ch, "SELECT count() FROM dead_letters") == 4
            and scalar(ch, "SELECT count() FROM decisions") == 3
            and scalar(ch, "SELECT count() FROM alerts") == 1
        ),
        SINK_TIMEOUT_S,
        description="decisions, alerts and dead letters in ClickHouse",
    )
    assert sink.stop() == 0

    # 100 failures of one source (p0): 60 rows + a source summary of 40; 70 failures on
    # one account (p1): 60 rows + an account summary of 10; 21 successes pass.
    assert totals(ch) == (191, 60 + 1 + 20 + 1 + 60 + 1, 60 + 1 + 20 + 1 + 60 + 1)
    summaries = ch.query(
        "SELECT weight, source, account_digest, event_id FROM attempts WHERE summary "
        "ORDER BY weight"
    )
    assert summaries == [(10, "", "victim", "summary:ev-3060"), (40, SOURCE, "", "summary:ev-60")]
    assert scalar(ch, "SELECT sum(attempts) FROM attempts_by_flow_minute") == 191
    assert ch.query(
        "SELECT key, tombstone, scope, tenant, account_digest, source, action "
        "FROM decisions ORDER BY kafka_partition, kafka_offset"
    ) == [
        ("account|acme|victim|-|-", False, "account", "acme", "victim", None, "block"),
        (
            f"account_source|acme|acct-1|{SOURCE}|-",
            False,
            "account_source",
            "acme",
            "acct-1",
            SOURCE,
            "block",
        ),
        (
            f"account_source|acme|acct-1|{SOURCE}|-",
            True,
            "account_source",
            "acme",
            "acct-1",
            SOURCE,
            "",
        ),
    ]
    assert ch.query("SELECT alert_id, type, source, count FROM alerts") == [
        ("al-1", "spray_source", SOURCE, 100)
    ]
    assert ch.query(
        "SELECT reason, stage, kafka_topic, kafka_partition, kafka_offset FROM dead_letters "
        "ORDER BY reason, kafka_offset"
    ) == [
        ("invalid_row", "sink", "auth.login-attempts", 5, 2000),  # the bad row, quarantined
        ("not_json", "ingest", "auth.login-attempts", 1, 10),
        ("not_json", "ingest", "auth.login-attempts", 1, 11),
        ("unknown", "unknown", topics.dlq, 1, 1),
    ]
    (stopped,) = sink.events("sink_stopped")
    assert (stopped["bad_messages"], stopped["bad_rows"]) == (4, 1)
    assert stopped["quarantined_rows"] == 1


async def test_sigkill_between_insert_and_commit_writes_nothing_twice(
    kafka_bootstrap: str, topics: Topics, ch: ClickHouse, sink: SinkProcess
) -> None:
    """SIGKILL right after an insert, before its commit: the restart replays, no doubles."""
    await create_topics(kafka_bootstrap, topics)
    minute = recent_minute()
    await produce(kafka_bootstrap, _workload(topics, minute))
    sink.start({"AUTHPIPE_FAULT_SINK_KILL_AFTER_INSERTS": "3"})
    assert sink.wait_exit(SINK_TIMEOUT_S) == -signal.SIGKILL, sink.tail()
    (fault,) = sink.events("sink_fault_kill")
    assert fault["inserts"] == 3

    sink.start()
    wait_until(
        lambda: (
            totals(ch)[0] == WORKLOAD_ATTEMPTS
            and scalar(ch, "SELECT count() FROM dead_letters") == 4
            and scalar(ch, "SELECT count() FROM decisions") == 3
            and scalar(ch, "SELECT count() FROM alerts") == 1
        ),
        SINK_TIMEOUT_S,
        description="every row after the restart",
    )
    assert sink.stop() == 0
    assert sink.events("sink_replaying"), "the restart did not replay a recorded plan"
    weight, rows, distinct = totals(ch)
    assert (weight, rows, distinct) == (191, 143, 143), sink.tail()
    for table in ("decisions", "alerts", "dead_letters"):
        assert (
            scalar(
                ch,
                f"SELECT count() - uniqExact(kafka_topic, kafka_partition, kafka_offset) "
                f"FROM {table}",
            )
            == 0
        ), table
    assert scalar(ch, "SELECT sum(attempts) FROM attempts_by_flow_minute") == 191


async def test_upstream_replay_after_a_sink_restart_is_written_once(
    kafka_bootstrap: str, topics: Topics, ch: ClickHouse, sink: SinkProcess
) -> None:
    """Rows the worker sends again after its crash are dropped across a sink restart."""
    await create_topics(kafka_bootstrap, topics)
    messages = _replay_workload(recent_minute())
    await produce(kafka_bootstrap, [(topics.audit, 0, b"0", m, None) for m in messages[:2]])
    sink.start()
    wait_until(lambda: totals(ch)[0] == 150, SINK_TIMEOUT_S, description="the first 150 attempts")
    assert sink.stop() == 0

    await produce(kafka_bootstrap, [(topics.audit, 0, b"0", messages[2], None)])
    sink.start()
    wait_until(
        lambda: totals(ch)[0] >= REPLAY_ATTEMPTS,
        SINK_TIMEOUT_S,
        description="the 10 new attempts",
    )
    assert sink.stop() == 0
    assert totals(ch) == (REPLAY_ATTEMPTS, REPLAY_ROWS, REPLAY_ROWS), sink.tail()
    assert scalar(ch, "SELECT sum(attempts) FROM attempts_by_flow_minute") == REPLAY_ATTEMPTS
    dropped = sink.events("sink_upstream_replay_dropped")
    assert sum(event["rows"] for event in dropped) == 70
    (_, stopped) = sink.events("sink_stopped")
    assert stopped["upstream_replayed_rows"] == 70


async def test_clickhouse_outage_mid_stream_loses_nothing(
    kafka_bootstrap: str,
    topics: Topics,
    ch: ClickHouse,
    sink: SinkProcess,
    chhttp: ChHttpEndpoint,
) -> None:
    """ClickHouse stopped mid-stream and restarted: the sink waits, then writes everything once."""
    await create_topics(kafka_bootstrap, topics)
    minute = recent_minute()
    sink.start()
    # Input offsets below those of the workload's rows on audit partition 1 (3000-3069):
    # the worker's input offsets only grow per partition, and the sink drops lower ones.
    first = [
        audit_row(2500 + i, minute, account=f"early-{i}", outcome="success") for i in range(30)
    ]
    await produce(kafka_bootstrap, [(topics.audit, 1, b"1", audit_batch(first), None)])
    wait_until(lambda: totals(ch)[0] == 30, SINK_TIMEOUT_S, description="the first 30 rows")

    chhttp.stop()
    await produce(kafka_bootstrap, _workload(topics, minute + timedelta(minutes=1)))
    wait_until(
        lambda: sink.events("sink_insert_failed"),
        SINK_TIMEOUT_S,
        description="the sink to hit the outage",
    )
    assert sink.process is not None and sink.process.poll() is None, "the sink exited"
    chhttp.start()

    wait_until(
        lambda: (
            totals(ch)[0] == 30 + WORKLOAD_ATTEMPTS
            and scalar(ch, "SELECT count() FROM dead_letters") == 4
            and scalar(ch, "SELECT count() FROM decisions") == 3
            and scalar(ch, "SELECT count() FROM alerts") == 1
        ),
        SINK_TIMEOUT_S,
        description="every row after the outage",
    )
    assert sink.stop() == 0
    weight, rows, distinct = totals(ch)
    assert (weight, rows, distinct) == (221, 173, 173), sink.tail()
    assert sink.events("sink_clickhouse_back"), sink.tail()
    assert scalar(ch, "SELECT sum(attempts) FROM attempts_by_flow_minute") == 221


async def read_topic(bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic`` now (both partitions), in partition then offset order."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[Any] = []
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                records.extend(batch)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        await consumer.stop()


def spread(first: datetime, step: timedelta, count: int) -> list[list[Any]]:
    """``count`` successes of distinct accounts, ``step`` apart from ``first``."""
    return [
        audit_row(i, first + step * i, outcome="success", account=f"a-{i}") for i in range(count)
    ]


async def test_a_batch_over_more_days_than_the_partition_limit_is_written_exactly(
    kafka_bootstrap: str, topics: Topics, ch: ClickHouse, sink: SinkProcess
) -> None:
    """120 distinct days in one batch (limit 100, code 252 before): cut by day, all written."""
    await create_topics(kafka_bootstrap, topics)
    rows = spread(recent_minute() - timedelta(days=60), timedelta(days=1), 120)
    await produce(kafka_bootstrap, [(topics.audit, 0, b"0", audit_batch(rows), None)])
    sink.start()
    wait_until(lambda: totals(ch)[0] == 120, SINK_TIMEOUT_S, description="all 120 rows")
    assert sink.stop() == 0
    assert totals(ch) == (120, 120, 120)
    assert scalar(ch, "SELECT uniqExact(toDate(ts)) FROM attempts") == 120
    assert scalar(ch, "SELECT sum(attempts) FROM attempts_by_flow_minute") == 120
    assert scalar(ch, "SELECT count() FROM dead_letters") == 0
    (stopped,) = sink.events("sink_stopped")
    assert (stopped["inserts"], stopped["insert_failures"]) == (2, 0)  # days 1-100, 101-120


async def test_a_batch_clickhouse_refuses_for_good_is_quarantined_and_the_sink_goes_on(
    kafka_bootstrap: str, topics: Topics, ch: ClickHouse, sink: SinkProcess
) -> None:
    """A real code 252 (attempts re-partitioned by hour, 150 hours in a batch): the batch
    goes to the DLQ and dead_letters with its reason, and the next batch is written."""
    ch.command("DROP TABLE attempts SYNC")
    (create,) = [
        statement for statement in split_statements((SCHEMA_DIR / "001_attempts.sql").read_text())
    ]
    ch.command(
        render(create, ClickHouseSettings()).replace(
            "PARTITION BY toDate(ts)", "PARTITION BY toStartOfHour(ts)"
        )
    )
    await create_topics(kafka_bootstrap, topics)
    hourly = spread(recent_minute() - timedelta(days=7), timedelta(hours=1), 150)
    await produce(kafka_bootstrap, [(topics.audit, 1, b"1", audit_batch(hourly), None)])
    sink.start()
    wait_until(
        lambda: scalar(ch, "SELECT count() FROM dead_letters") == 150,
        SINK_TIMEOUT_S,
        description="the refused batch in dead_letters",
    )
    later = [audit_row(1000 + i, recent_minute(), outcome="success") for i in range(5)]
    await produce(kafka_bootstrap, [(topics.audit, 1, b"1", audit_batch(later), None)])
    wait_until(lambda: totals(ch)[0] == 5, SINK_TIMEOUT_S, description="the next batch")
    assert sink.stop() == 0

    assert totals(ch) == (5, 5, 5)
    assert ch.query(
        "SELECT reason, stage, kafka_topic, count(), min(kafka_offset), max(kafka_offset) "
        "FROM dead_letters GROUP BY ALL"
    ) == [("too_many_partitions", "sink", "auth.login-attempts", 150, 0, 149)]
    (dead,) = await read_topic(kafka_bootstrap, topics.dlq)
    headers = dict(dead.headers)
    assert (headers["error"], headers["stage"]) == (b"too_many_partitions", b"sink")
    assert (headers["source_topic"], headers["source_partition"], headers["source_offset"]) == (
        topics.audit.encode(),
        b"1",
        b"0",
    )
    body = json.loads(dead.value)
    assert (body["table"], len(body["rows"])) == ("attempts", 150)
    assert [row[-1] for row in body["rows"]] == list(range(150))
    (quarantined,) = sink.events("sink_quarantined")
    assert (quarantined["reason"], quarantined["rows"]) == ("too_many_partitions", 150)


async def test_audit_rows_before_1970_are_quarantined_not_dropped(
    kafka_bootstrap: str, topics: Topics, ch: ClickHouse, sink: SinkProcess
) -> None:
    """A row before 1970 (no column holds it) is a past_timestamp dead letter: counts add up."""
    await create_topics(kafka_bootstrap, topics)
    minute = recent_minute()
    rows = [audit_row(i, minute, outcome="success") for i in range(3)]
    rows.insert(1, audit_row(7, datetime(1969, 7, 20, 20, 17, tzinfo=UTC), outcome="success"))
    await produce(kafka_bootstrap, [(topics.audit, 0, b"0", audit_batch(rows), None)])
    sink.start()
    wait_until(
        lambda: totals(ch)[0] == 3 and scalar(ch, "SELECT count() FROM dead_letters") == 1,
        SINK_TIMEOUT_S,
        description="3 attempts and 1 dead letter",
    )
    assert sink.stop() == 0
    assert ch.query(
        "SELECT reason, stage, kafka_topic, kafka_partition, kafka_offset FROM dead_letters"
    ) == [("past_timestamp", "sink", "auth.login-attempts", 0, 7)]
    (dead,) = await read_topic(kafka_bootstrap, topics.dlq)
    assert json.loads(dead.value)["rows"] == [rows[1]]


def test_authpipe_sink_is_a_subcommand() -> None:
    """`authpipe sink --help` describes the sink."""
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "sink", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0
    assert "usage: authpipe sink" in result.stdout
