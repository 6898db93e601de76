"""The stream's stages, run by the in-memory twin, agree with the single-process Engine."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from pipeline.contracts.codec import decode_attempt, encode
from pipeline.core.engine import Engine
from pipeline.core.policy import DEFAULT_POLICY, policy_from_toml
from pipeline.errors import ConfigError
from pipeline.settings import Settings
from pipeline.stream.ingest import Ingest, Record
from pipeline.stream.memory import MemoryPipeline
from pipeline.wiring import build_normaliser

T0 = datetime(2026, 11, 1, tzinfo=UTC)
NOW_MS = int((T0 + timedelta(days=1)).timestamp() * 1000)


def records(n: int, seed: int) -> list[Record]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.3:
            account, ip, ok = "victim", f"10.0.{rng.randrange(4)}.{rng.randrange(250)}", False
        elif roll < 0.5:
            account, ip, ok = f"u{rng.randrange(5000)}", "198.51.100.9", False
        else:
            account, ip, ok = (
                f"u{rng.randrange(500)}",
                f"192.0.2.{rng.randrange(200)}",
                rng.random() < 0.9,
            )
        body = {
            "event_id": f"e{i}",
            "occurred_at": (T0 + timedelta(milliseconds=200 * i)).isoformat(),
            "service": "web",
            "account": account,
            "peer_ip": ip,
            "outcome": "success" if ok else "failure",
        }
        if not ok:
            body["failure_reason"] = "bad_password"
        out.append(Record("auth.login-attempts", i % 8, i // 8, None, orjson.dumps(body)))
    return out


def run_twin(recs: list[Record], restart_at: int | None = None) -> MemoryPipeline:
    twin = MemoryPipeline(Settings(), DEFAULT_POLICY)
    for i in range(0, len(recs), 500):
        twin.feed(recs[i : i + 500], NOW_MS)
        if restart_at is not None and i == restart_at:
            twin.restart()
    twin.finish()  # the last rows wait for a later mark (their successes are familiar)
    return twin


def engine_for(recs: list[Record]) -> Engine:
    normaliser = build_normaliser(Settings())
    engine = Engine(DEFAULT_POLICY)
    engine.run(normaliser.normalise(decode_attempt(r.value)) for r in recs)
    return engine


def split(
    decisions: list[bytes], alerts: list[bytes]
) -> tuple[set[bytes], set[str], set[tuple[str, str]]]:
    """Account-keyed decisions exactly; source-keyed decisions and alerts by subject.

    A source's failures reach its stage from several account partitions, interleaved in
    arrival order, so which event trips a source signal may differ; its subject may not.
    """
    exact = {d for d in decisions if b'"scope":"source"' not in d}
    source_keys = {orjson.loads(d)["key"] for d in decisions if b'"scope":"source"' in d}
    subjects = {
        (
            orjson.loads(a)["type"],
            str(orjson.loads(a)["source"]) + str(orjson.loads(a)["account_digest"]),
        )
        for a in alerts
    }
    return exact, source_keys, subjects


def test_twin_gives_the_engines_decisions_and_alerts() -> None:
    """Ingest -> account stage -> source stage -> rollup issue the Engine's decisions and alerts."""
    recs = records(20_000, seed=5)
    twin, engine = run_twin(recs), engine_for(recs)
    got = split([v for _, v in twin.out.decisions if v is not None], twin.out.alerts)
    want = split(
        [
            *(encode(d) for _, d in engine.out.decisions if d is not None),
            *(raw for _, raw in engine.out.exempts),
        ],
        [encode(a) for a in engine.out.alerts],
    )
    assert got == want
    assert (len(got[0]), len(got[1]), len(got[2])) == (len(want[0]), 1, len(want[2]))
    assert len(got[0]) >= 10


def test_twin_survives_a_restart_with_the_same_answer() -> None:
    """Dropping every shard mid-stream and rebuilding from the changelog changes no decision."""
    recs = records(20_000, seed=6)
    plain, restarted = run_twin(recs), run_twin(recs, restart_at=10_000)
    assert {v for _, v in restarted.out.decisions if v} == {v for _, v in plain.out.decisions if v}
    assert sorted(restarted.out.alerts) == sorted(plain.out.alerts)


def test_every_record_is_either_a_row_or_a_dead_letter() -> None:
    """Ingest accounts for every record: rows + dead letters == records, with reasons."""
    ingest = Ingest(build_normaliser(Settings()), partitions=8, max_future_skew_ms=300_000)
    good = records(10, seed=1)
    future = orjson.dumps({**orjson.loads(good[0].value), "occurred_at": "2099-01-01T00:00:00Z"})
    bad_ip = orjson.dumps({**orjson.loads(good[0].value), "peer_ip": "not-an-ip"})
    batch = [
        *good,
        *(Record("t", 0, 100 + i, None, v) for i, v in enumerate([b"{", future, bad_ip])),
    ]
    result = ingest.process(batch, NOW_MS)
    assert sum(len(rows) for rows in result.rows.values()) == 10
    assert sorted(d.reason for d in result.dead) == ["bad_peer_ip", "future_timestamp", "not_json"]
    assert dict(result.reasons) == {"bad_peer_ip": 1, "future_timestamp": 1, "not_json": 1}
    headers = dict(result.dead[0].headers())
    assert (headers["source_topic"], headers["source_offset"]) == (b"t", b"100")


def test_events_older_than_the_past_skew_or_before_1970_are_dead_letters() -> None:
    """occurred_at beyond max_past_skew_ms behind now, or before 1970: past_timestamp."""
    ingest = Ingest(build_normaliser(Settings()), partitions=8, max_past_skew_ms=3_600_000)
    body = orjson.loads(records(1, seed=1)[0].value)

    def at(when: datetime) -> bytes:
        return orjson.dumps({**body, "occurred_at": when.isoformat()})

    now = T0 + timedelta(days=1)
    values = [
        at(now - timedelta(hours=1)),  # at the limit: kept
        at(now - timedelta(hours=1, milliseconds=1)),  # 1 ms past it
        at(datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)),
        at(datetime(1900, 1, 1, tzinfo=UTC)),
    ]
    batch = [Record("t", 0, i, None, value) for i, value in enumerate(values)]
    result = ingest.process(batch, int(now.timestamp() * 1000))
    assert sum(len(rows) for rows in result.rows.values()) == 1
    assert [(d.record.offset, d.reason) for d in result.dead] == [
        (1, "past_timestamp"),
        (2, "past_timestamp"),
        (3, "past_timestamp"),
    ]
    assert [d.detail for d in result.dead][1:] == ["occurred_at is before 1970"] * 2

    # Before 1970 is refused whatever the skew: the tables cannot hold it.
    lenient = Ingest(build_normaliser(Settings()), partitions=8, max_past_skew_ms=10**15)
    assert lenient.process(batch, int(now.timestamp() * 1000)).reasons == {"past_timestamp": 2}
    assert Settings().ingest.max_past_skew_ms == 7 * 86_400_000


def test_a_tenants_policy_flag_reaches_the_shared_normaliser(tmp_path: Path) -> None:
    """case_sensitive = true under [tenants.acme] keeps acme's case, from a given policy or policy_path."""
    text = "[tenants.acme]\ncase_sensitive = true\n"
    given = build_normaliser(Settings(), policy_from_toml(text))
    path = tmp_path / "policy.toml"
    path.write_text(text)
    loaded = build_normaliser(Settings(policy_path=path))
    assert given.case_sensitive_tenants == loaded.case_sensitive_tenants == frozenset({"acme"})


def test_case_sensitive_in_the_policy_defaults_is_a_config_error() -> None:
    """A [defaults] case_sensitive flag (not expressible as a tenant list) is refused with what to do."""
    policy = policy_from_toml("[defaults]\ncase_sensitive = true\n")
    with pytest.raises(ConfigError, match=r"set it per tenant"):
        build_normaliser(Settings(), policy)
