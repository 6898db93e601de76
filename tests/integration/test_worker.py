"""The worker on the real broker: decisions, dead letters, durability, exactness, scale-out,
convergence. Every answer is checked against the single-process core Engine."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.contracts.codec import decode_attempt, encode
from pipeline.core.engine import Engine, replay_order
from pipeline.core.policy import DEFAULT_POLICY, Policy
from pipeline.settings import load_settings
from pipeline.wiring import build_normaliser
from tests.plugins.waiting import wait_until
from tests.plugins.worker import (
    StreamNames,
    ensure_stream_topics,
    event,
    produce,
    read_topic,
    start_worker,
)

pytestmark = pytest.mark.integration


def mixed_stream(n: int, seed: int, start: datetime) -> list[bytes]:
    """Ordinary users, a brute force, a botnet on one account, and a spraying source."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = start + timedelta(milliseconds=20 * i)
        roll = rng.random()
        if roll < 0.05:
            out.append(event(i, t, "brute-target", "203.0.113.5", run=f"s{seed}"))
        elif roll < 0.15:
            out.append(
                event(
                    i,
                    t,
                    "botnet-target",
                    f"10.9.{rng.randrange(8)}.{rng.randrange(250)}",
                    run=f"s{seed}",
                )
            )
        elif roll < 0.30:
            out.append(
                event(
                    i,
                    t,
                    f"victim{rng.randrange(3000)}",
                    "198.51.100.66",
                    run=f"s{seed}",
                    reason="unknown_account",
                )
            )
        else:
            user = rng.randrange(400)
            ok = rng.random() < 0.9
            out.append(
                event(
                    i,
                    t,
                    f"user{user}",
                    f"192.0.2.{user % 200}",
                    ok=ok,
                    run=f"s{seed}",
                    device=f"dev{user}",
                    trusted=rng.random() < 0.5,
                )
            )
    return out


def with_trailer(values: list[bytes]) -> list[bytes]:
    """``values`` and one success 2 s after their last event, so the live marks pass the
    stream's last second: the rollup evaluates a second only once time passes its end,
    which for a stream's last events comes with the next input (docs/stream.md), or with
    the wall clock when the stream reaches into the future, as these do; the engine's
    ``finish`` evaluates it at once. Without the trailer a worker that caught up more than
    the answer's wait before the wall clock reached the end lacked an alert due then."""
    last = datetime.fromisoformat(orjson.loads(values[-1])["occurred_at"])
    t = last + timedelta(seconds=2)
    trailer = event(len(values), t, "trailer@example.com", "192.0.2.250", ok=True, run="trailer")
    return [*values, trailer]


Answer = tuple[set[bytes], set[bytes]]


def _split(decisions: list[bytes], alerts: list[bytes]) -> Answer:
    """Every decision and every alert, byte for byte (sets: arrival order is free, and a
    record re-sent after a crash is the same record).

    Every stage applies its rows in event-time order (``pipeline.core.sequence``), so the
    source-keyed signals and rule 8 are exact too, not only the account-keyed decisions.
    """
    return set(decisions), set(alerts)


def engine_answer(values: list[bytes], policy: Policy = DEFAULT_POLICY) -> Answer:
    """What the core computes for ``values``, split as the topics are compared."""
    normaliser = build_normaliser(load_settings())
    engine = Engine(policy)
    engine.run(sorted((normaliser.normalise(decode_attempt(v)) for v in values), key=replay_order))
    decisions = [
        *(encode(d) for _, d in engine.out.decisions if d is not None),
        *(raw for _, raw in engine.out.exempts),
    ]
    return _split(decisions, [encode(a) for a in engine.out.alerts])


def topic_answer(bootstrap: str, names: StreamNames) -> Answer:
    decisions = [m.value for m in read_topic(bootstrap, names.decisions) if m.value is not None]
    return _split(decisions, [m.value for m in read_topic(bootstrap, names.alerts)])


def assert_same_answer(bootstrap: str, names: StreamNames, expected: Answer) -> None:
    """Wait for the topics to hold the core's answer; on timeout, show the difference."""
    try:
        wait_until(
            lambda: topic_answer(bootstrap, names) == expected,
            60,
            interval_s=1,
            description="decisions and alerts equal to the core's",
        )
    except AssertionError:
        got = topic_answer(bootstrap, names)
        for mine, theirs in zip(got, expected, strict=True):
            assert (sorted(mine - theirs)[:3], sorted(theirs - mine)[:3]) == ([], [])
        raise


def audited_ids(bootstrap: str, names: StreamNames) -> set[str]:
    ids: set[str] = set()
    for message in read_topic(bootstrap, names.audit):
        batch = orjson.loads(message.value)
        column = batch["columns"].index("event_id")
        ids.update(row[column] for row in batch["rows"])
    return ids


def audit_decisions(bootstrap: str, names: StreamNames) -> dict[str, str]:
    out: dict[str, str] = {}
    for message in read_topic(bootstrap, names.audit):
        batch = orjson.loads(message.value)
        cols = batch["columns"]
        for row in batch["rows"]:
            out[row[cols.index("event_id")]] = row[cols.index("decision")]
    return out


def as_messages(values: list[bytes]) -> list[tuple[bytes | None, bytes]]:
    """Keyed by the claimed account, as login services publish them."""
    return [(orjson.loads(v)["account"].encode(), v) for v in values]


def test_brute_force_is_decided_and_bad_events_are_dead_lettered(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[Any],
    tmp_path: Path,
) -> None:
    """Five failures issue one account_source block (and seed 002's account lock); three bad
    events land in the DLQ with reasons."""
    now = datetime.now(UTC)
    good = [event(i, now + timedelta(milliseconds=i), "alice", "203.0.113.9") for i in range(5)]
    bad = [b"not json", b'{"event_id": "x"}', b"\xff\xfe"]
    start_worker(workers, worker_env, tmp_path).wait_ready()
    produce(kafka_bootstrap, stream_names.input, [(b"k", v) for v in good + bad])

    dlq = wait_until(
        lambda: (
            read_topic(kafka_bootstrap, stream_names.dlq)
            if len(read_topic(kafka_bootstrap, stream_names.dlq)) == 3
            else None
        ),
        60,
        interval_s=0.5,
        description="3 dead letters",
    )
    assert sorted(dict(m.headers)["error"] for m in dlq) == [
        b"bad_utf8",
        b"missing_field",
        b"not_json",
    ]
    assert sorted(m.value for m in dlq) == sorted(bad)
    assert {dict(m.headers)["stage"] for m in dlq} == {b"ingest"}
    decisions = wait_until(
        lambda: d if len(d := read_topic(kafka_bootstrap, stream_names.decisions)) >= 2 else None,
        60,
        interval_s=0.5,
        description="two decisions",
    )
    assert sorted(orjson.loads(d.value)["scope"] for d in decisions) == ["account_source", "lock"]
    decisions = [d for d in decisions if b'"scope":"account_source"' in d.value]
    decision = orjson.loads(decisions[0].value)
    assert (decision["scope"], decision["action"], decision["count"]) == (
        "account_source",
        "block",
        5,
    )
    assert decision["source"] == "203.0.113.9"
    assert decisions[0].key.decode() == decision["key"]
    assert wait_until(
        lambda: len(audited_ids(kafka_bootstrap, stream_names)) == 5,
        30,
        interval_s=0.5,
        description="5 audit rows",
    )


def test_counters_and_active_decisions_survive_sigkill(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[Any],
    tmp_path: Path,
) -> None:
    """After SIGKILL and restart, a key at 4 failures trips on the 5th and a blocked key stays blocked."""
    now = datetime.now(UTC)
    first = [
        event(i, now + timedelta(milliseconds=i), "counted", "203.0.113.1", run="a")
        for i in range(4)
    ]
    first += [
        event(10 + i, now + timedelta(milliseconds=10 + i), "blocked", "203.0.113.2", run="a")
        for i in range(5)
    ]
    worker = start_worker(workers, worker_env, tmp_path).wait_ready()
    produce(kafka_bootstrap, stream_names.input, as_messages(first))
    wait_until(
        lambda: len(audited_ids(kafka_bootstrap, stream_names)) == 9,
        60,
        interval_s=0.5,
        description="9 audited attempts",
    )
    wait_until(
        lambda: len(read_topic(kafka_bootstrap, stream_names.decisions)) == 2,
        30,
        interval_s=0.5,
        description="the blocks of 'blocked'",
    )
    worker.kill()

    start_worker(workers, worker_env, tmp_path).wait_ready()
    later = now + timedelta(seconds=1)
    produce(
        kafka_bootstrap,
        stream_names.input,
        as_messages(
            [
                event(100, later, "counted", "203.0.113.1", run="b"),
                event(101, later, "blocked", "203.0.113.2", run="b"),
            ]
        ),
    )
    # Waits for the decision itself: the restarted worker may re-send the first life's
    # two decisions (same records) before the new rows pass the watermark.
    decisions = wait_until(
        lambda: (
            [m for m in read_topic(kafka_bootstrap, stream_names.decisions) if m.value]
            if any(
                b"203.0.113.1" in m.key for m in read_topic(kafka_bootstrap, stream_names.decisions)
            )
            else None
        ),
        60,
        interval_s=0.5,
        description="the 5th failure's decision after restart",
    )
    counted = [orjson.loads(m.value) for m in decisions if b"203.0.113.1" in m.key]
    assert [(d["count"], d["action"]) for d in counted] == [(5, "block")]
    verdicts = wait_until(
        lambda: audit_decisions(kafka_bootstrap, stream_names).get("b-101"),
        30,
        interval_s=0.5,
        description="the audit row of the blocked key",
    )
    assert verdicts == "block"


def test_exact_answer_when_the_worker_is_killed_mid_stream(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[Any],
    tmp_path: Path,
) -> None:
    """A SIGKILL mid-stream and a restart end with exactly the core's decisions and alerts."""
    values = with_trailer(
        mixed_stream(20_000, seed=7, start=datetime.now(UTC) - timedelta(minutes=5))
    )
    ensure_stream_topics(kafka_bootstrap, stream_names)
    produce(kafka_bootstrap, stream_names.input, as_messages(values))
    worker = start_worker(workers, worker_env, tmp_path).wait_ready()
    wait_until(
        lambda: len(audited_ids(kafka_bootstrap, stream_names)) >= 6000,
        120,
        interval_s=0.2,
        description="a third of the stream processed",
    )
    worker.kill()
    start_worker(workers, worker_env, tmp_path).wait_ready()
    wait_until(
        lambda: len(audited_ids(kafka_bootstrap, stream_names)) == len(values),
        180,
        interval_s=1,
        description="every event audited",
    )
    expected = engine_answer(values)
    assert_same_answer(kafka_bootstrap, stream_names, expected)
    assert len(expected[0]) >= 3
    assert_placed_by_key(kafka_bootstrap, stream_names.decisions)


def assert_placed_by_key(bootstrap: str, topic: str, partitions: int = 4) -> None:
    """Every decision sits on the partition Kafka's default partitioner gives its key
    (murmur2, as a plain send placed it before decisions went out as record batches), so
    a key's records share one partition and compaction keeps its latest."""
    from aiokafka.partitioner import murmur2

    messages = read_topic(bootstrap, topic)
    misplaced = [m for m in messages if (murmur2(m.key) & 0x7FFFFFFF) % partitions != m.partition]
    assert (len(messages) > 0, misplaced[:3]) == (True, [])


def test_two_workers_decide_like_one_through_a_rebalance(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[Any],
    tmp_path: Path,
) -> None:
    """Two workers in one group, the second joining mid-stream, give the core's exact answer."""
    values = with_trailer(
        mixed_stream(16_000, seed=11, start=datetime.now(UTC) - timedelta(minutes=5))
    )
    start_worker(workers, worker_env, tmp_path).wait_ready()
    produce(kafka_bootstrap, stream_names.input, as_messages(values[:8000]))
    wait_until(
        lambda: len(audited_ids(kafka_bootstrap, stream_names)) >= 4000,
        120,
        interval_s=0.2,
        description="half of the first half processed",
    )
    second = start_worker(workers, worker_env, tmp_path)
    produce(kafka_bootstrap, stream_names.input, as_messages(values[8000:]))
    second.wait_ready()
    wait_until(
        lambda: len(audited_ids(kafka_bootstrap, stream_names)) == len(values),
        180,
        interval_s=1,
        description="every event audited",
    )
    assert_same_answer(kafka_bootstrap, stream_names, engine_answer(values))


SHORT_POLICY = """
policy_version = "short-windows"
[defaults.account_source]
threshold = 3
window_ms = 2000
[defaults.backoff]
base_ms = 2000
cap_ms = 4000
"""


def test_decision_topic_converges_to_no_live_decision_after_expiry(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[Any],
    tmp_path: Path,
) -> None:
    """Once every block has expired, the compacted topic read from the start holds no live decision."""
    policy_path = tmp_path / "short.toml"
    policy_path.write_text(SHORT_POLICY)
    start_worker(workers, worker_env, tmp_path, AUTHPIPE_POLICY_PATH=str(policy_path)).wait_ready()
    now = datetime.now(UTC)
    values = [
        event(i, now + timedelta(milliseconds=i), f"acct{i % 4}", "203.0.113.7") for i in range(12)
    ]
    produce(kafka_bootstrap, stream_names.input, as_messages(values))
    wait_until(
        lambda: (
            len([m for m in read_topic(kafka_bootstrap, stream_names.decisions) if m.value]) == 4
        ),
        60,
        interval_s=0.5,
        description="4 decisions",
    )

    def live() -> dict[bytes, bytes | None]:
        latest: dict[bytes, bytes | None] = {}
        for message in read_topic(kafka_bootstrap, stream_names.decisions):
            latest[message.key] = message.value
        return {k: v for k, v in latest.items() if v is not None}

    wait_until(lambda: not live(), 30, interval_s=0.5, description="no live decision")
    assert live() == {}


def test_malformed_payloads_never_crash_and_every_offset_is_accounted_for(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[Any],
    tmp_path: Path,
) -> None:
    """Thousands of random and malformed payloads: no crash, counted + dead-lettered == produced."""
    rng = random.Random(3)
    now = datetime.now(UTC)
    valid = [event(i, now, f"fuzz{i}", "192.0.2.1", run="fz", ok=True) for i in range(500)]
    templates = [orjson.loads(v) for v in valid[:50]]
    junk: list[bytes] = []
    for i in range(3000):
        kind = i % 6
        if kind == 0:
            junk.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
        elif kind == 1:
            junk.append(orjson.dumps(rng.choice([[1, 2], "s", 3, None, True])))
        elif kind == 2:
            body = dict(rng.choice(templates))
            body.pop(rng.choice(list(body)))
            body["event_id"] = f"junk-{i}"
            junk.append(orjson.dumps(body))
        elif kind == 3:
            body = dict(rng.choice(templates), event_id=f"junk-{i}")
            body[rng.choice(list(body))] = rng.choice([123, [], {}, "", "x" * 400, -1.5])
            junk.append(orjson.dumps(body))
        elif kind == 4:
            body = dict(rng.choice(templates), event_id=f"junk-{i}", peer_ip="999.1.1.1")
            junk.append(orjson.dumps(body))
        else:
            junk.append(b"{" * rng.randrange(1, 3000))
    payloads = valid + junk
    rng.shuffle(payloads)
    worker = start_worker(workers, worker_env, tmp_path).wait_ready()
    produce(kafka_bootstrap, stream_names.input, [(None, v) for v in payloads])

    def accounted() -> tuple[int, int]:
        return len(audited_ids(kafka_bootstrap, stream_names)), len(
            read_topic(kafka_bootstrap, stream_names.dlq)
        )

    def settled() -> tuple[int, int] | None:
        counts = accounted()
        return counts if sum(counts) == len(payloads) else None

    counts = wait_until(
        settled, 120, interval_s=1, description="every offset counted or dead-lettered"
    )
    assert counts[0] >= 500
    assert worker.ready()
    assert worker.metric("authpipe_dead_letters_total") == counts[1]
