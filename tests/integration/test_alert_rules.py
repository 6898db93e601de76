"""The SQL alert rules of dashboards/alerts and the `authpipe alerts run` runner.

Rule tests seed the migrated schema in chdb with known data and assert the exact
firings. Runner tests emit to a unique alerts topic on the session's real broker.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.contracts.codec import encode
from pipeline.contracts.models import datetime_to_ms
from pipeline.kafka_admin import TopicSpec, ensure_topics
from pipeline.settings import ClickHouseSettings, Settings
from pipeline.sinks.alerts import (
    RULES_DIR,
    AlertRunner,
    alert_id_for,
    evaluate,
    load_rules,
)
from pipeline.sinks.clickhouse import ClickHouse
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.migrate import apply_migrations
from pipeline.sinks.tables import DECISIONS_COLUMNS
from tests.plugins.clickhouse import ATTEMPT_COLUMNS, ChHttpEndpoint, attempt_row, free_port
from tests.plugins.waiting import wait_until_async

REPO_ROOT = Path(__file__).resolve().parents[2]
AUTHPIPE = REPO_ROOT / ".venv" / "bin" / "authpipe"
RULE_NAMES = [
    "decision_rate_anomaly",
    "distributed_spray",
    "failure_ratio_spike",
    "source_many_tenants",
]
# The evaluation time: 30 s into the minute after END, an hour boundary two hours ago
# (inside every TTL). Hour windows are [END - 60 min, END), 10-minute ones
# [END - 10 min, END), baselines the 24 h before those.
END = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
NOW_MS = datetime_to_ms(END) + 30_000
ALERT_LINE = '{"alert_id":'  # stdout lines of alerts (log lines start with {"event" or text)


@pytest.fixture
def ch(chdb_path: Path) -> Iterator[ClickHouse]:
    """Embedded chdb, migrated, in a fresh directory."""
    settings = ClickHouseSettings(path=chdb_path)
    with open_clickhouse(settings, create_database=True) as handle:
        apply_migrations(handle, settings)
        yield handle


def failures(
    ts: datetime, tenant: str, source: str, accounts: list[str], *, outcome: str = "failure"
) -> list[list[Any]]:
    """One attempts row per account, all from ``source`` at ``ts``."""
    return [
        attempt_row(
            ts,
            f"{tenant}-{source}-{a}-{outcome}",
            tenant=tenant,
            account_digest=a,
            source=source,
            outcome=outcome,
        )
        for a in accounts
    ]


def weighted(ts: datetime, tenant: str, outcome: str, weight: int, account: str) -> list[Any]:
    """One (summary-like) row standing for ``weight`` attempts."""
    return attempt_row(
        ts,
        f"{tenant}-{outcome}-{weight}-{ts.isoformat()}",
        tenant=tenant,
        account_digest=account,
        outcome=outcome,
        weight=weight,
    )


def decision_rows(
    ts: datetime, tenant: str, count: int, *, tombstone: bool = False
) -> list[list[Any]]:
    rows = []
    for i in range(count):
        values = {
            "decision_id": f"{tenant}-{ts.isoformat()}-{i}",
            "key": f"account|{tenant}|acct-{i}|-|-",
            "tenant": tenant,
            "scope": "account",
            "account_digest": f"acct-{i}",
            "source": None,
            "device_id": None,
            "applies_to": "untrusted",
            "action": "block",
            "rule": "account",
            "count": 50,
            "threshold": 50,
            "window_ms": 900_000,
            "issued_at": ts,
            "expires_at": ts + timedelta(minutes=15),
            "policy_version": "p1",
            "tombstone": tombstone,
            "operator": None,
            "reason": None,
            "challenge": None,
            "kafka_topic": "auth.throttle-decisions",
            "kafka_partition": 0,
            "kafka_offset": i,
        }
        rows.append([values[name] for name in DECISIONS_COLUMNS])
    return rows


def fired(ch: ClickHouse, rule: str, now_ms: int = NOW_MS) -> list[tuple[Any, ...]]:
    """(tenant, subject, count, distinct_accounts) of one rule's firings, in order."""
    rules = [r for r in load_rules() if r.name == rule]
    return [
        (f.alert.tenant, f.subject, f.alert.count, f.alert.distinct_accounts)
        for f in evaluate(ch, rules, now_ms)
    ]


def seed_spray(ch: ClickHouse, at: datetime) -> None:
    """acme: 25 sources x 3 failures on 75 accounts (a distributed spray)."""
    rows = []
    for i in range(25):
        rows += failures(at, "acme", f"10.0.0.{i}", [f"acme-{i}-{j}" for j in range(3)])
    ch.insert("attempts", ATTEMPT_COLUMNS, rows)


def test_rule_files_follow_the_contract() -> None:
    """Four rules, named by alert type, parameterised by now_ms, reading aggregates only."""
    rules = load_rules()
    assert [r.name for r in rules] == RULE_NAMES
    for rule in rules:
        assert "{now_ms:Int64}" in rule.sql
        assert "now()" not in rule.sql
        assert any(t in rule.sql for t in ("attempts_by_source_minute", "decisions_by_minute"))
        assert "FROM attempts\n" not in rule.sql and "FROM decisions\n" not in rule.sql
        assert len(rule.version) == 12


def test_distributed_spray_fires_for_many_low_rate_sources(ch: ClickHouse) -> None:
    """acme (25 sources, 3 each) fires; one loud source and 20-per-source sprays do not."""
    seed_spray(ch, END - timedelta(minutes=30))
    old = failures(END - timedelta(minutes=61), "acme", "10.9.9.9", ["old-1", "old-2"])
    loud = failures(
        END - timedelta(minutes=5), "globex", "10.1.1.1", [f"g-{j}" for j in range(100)]
    )
    busy = []
    for i in range(30):  # 30 sources, 60 accounts, 20 failures per source: not low-rate
        accounts = [f"i-{i}-0", f"i-{i}-1"]
        for k in range(10):
            busy += failures(
                END - timedelta(minutes=20, seconds=k), "initech", f"10.2.0.{i}", accounts
            )
    ch.insert("attempts", ATTEMPT_COLUMNS, old + loud)
    ch.insert("attempts", ATTEMPT_COLUMNS, busy)
    assert fired(ch, "distributed_spray") == [("acme", "acme", 75, 75)]


def test_failure_ratio_spike_is_against_the_tenants_own_baseline(ch: ClickHouse) -> None:
    """acme (5% -> 60%) and hooli (no history -> 40%) fire; globex (50% -> 60%) and a small
    initech window do not."""
    base = END - timedelta(hours=5)
    recent = END - timedelta(minutes=5)
    rows = [
        weighted(base, "acme", "success", 950, "a1"),
        weighted(base, "acme", "failure", 50, "a2"),
        weighted(recent, "acme", "success", 80, "a3"),
        weighted(recent, "acme", "failure", 120, "a4"),
        weighted(base, "globex", "success", 500, "g1"),
        weighted(base, "globex", "failure", 500, "g2"),
        weighted(recent, "globex", "success", 80, "g3"),
        weighted(recent, "globex", "failure", 120, "g4"),
        weighted(recent, "initech", "failure", 50, "i1"),
        weighted(recent, "hooli", "success", 60, "h1"),
        weighted(recent, "hooli", "failure", 40, "h2"),
        weighted(recent - timedelta(minutes=10), "hooli", "failure", 900, "h3"),  # before window
    ]
    ch.insert("attempts", ATTEMPT_COLUMNS, rows)
    assert fired(ch, "failure_ratio_spike") == [("acme", "acme", 120, 2)]
    # hooli's 900 failures 15 minutes ago are its baseline (90%): 40% is no spike.
    ch.insert(
        "attempts",
        ATTEMPT_COLUMNS,
        [
            weighted(recent, "umbrella", "success", 60, "u1"),
            weighted(recent, "umbrella", "failure", 40, "u2"),
        ],
    )
    assert fired(ch, "failure_ratio_spike") == [
        ("acme", "acme", 120, 2),
        ("umbrella", "umbrella", 40, 2),
    ]


def test_source_many_tenants_fires_for_a_source_across_five_tenants(ch: ClickHouse) -> None:
    """A source failing in 6 tenants fires; 4 tenants, or successes only, do not."""
    at = END - timedelta(minutes=15)
    rows = []
    for t in range(6):
        rows += failures(at, f"t{t}", "198.51.100.9", [f"acc-{t}-0", f"acc-{t}-1"])
        rows += failures(at, f"t{t}", "198.51.100.11", [f"ok-{t}"], outcome="success")
    for t in range(4):
        rows += failures(at, f"t{t}", "198.51.100.10", [f"few-{t}"])
    ch.insert("attempts", ATTEMPT_COLUMNS, rows)
    assert fired(ch, "source_many_tenants") == [("*", "198.51.100.9", 12, 12)]
    (firing,) = evaluate(ch, [r for r in load_rules() if r.name == "source_many_tenants"], NOW_MS)
    assert (firing.alert.source, firing.alert.account_digest) == ("198.51.100.9", None)


def test_decision_rate_anomaly_compares_with_the_tenants_rate(ch: ClickHouse) -> None:
    """acme (60 in 10 min vs 0.1/min) fires; globex (vs 2/min) and tombstones do not."""
    recent = END - timedelta(minutes=3)
    base = END - timedelta(hours=12)
    for rows in (
        decision_rows(recent, "acme", 60),
        decision_rows(base, "acme", 144),
        decision_rows(recent, "globex", 60),
        decision_rows(base, "globex", 2880),
        decision_rows(recent, "initech", 100, tombstone=True),
    ):
        ch.insert("decisions", DECISIONS_COLUMNS, rows)
    assert fired(ch, "decision_rate_anomaly") == [("acme", "acme", 60, 60)]


def test_alert_id_is_deterministic_per_rule_tenant_subject_and_period() -> None:
    """The same firing has the same id; another period or subject has another."""
    first = alert_id_for("distributed_spray", "acme", "acme", END)
    assert first == alert_id_for("distributed_spray", "acme", "acme", END)
    assert first != alert_id_for("distributed_spray", "acme", "acme", END + timedelta(hours=1))
    assert first != alert_id_for("distributed_spray", "acme", "globex", END)
    assert len(first) == 32


# -- the runner --------------------------------------------------------------------------


def runner_settings(bootstrap: str, chdb_path: Path, alerts_topic: str) -> Settings:
    return Settings(
        kafka={"bootstrap_servers": bootstrap, "alerts_topic": alerts_topic, "partitions": 1},
        clickhouse={"path": chdb_path},
    )


async def read_topic(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of every message of partition 0."""
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[tuple[bytes | None, bytes | None]] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=500)
            out += [(r.key, r.value) for r in batch.get(tp, [])]
        return out
    finally:
        await consumer.stop()


async def test_runner_fires_once_per_subject_and_period_across_restarts(
    kafka_bootstrap: str, ch: ClickHouse, chdb_path: Path
) -> None:
    """A firing is emitted once; again at the same time or after a restart: nothing; next
    period: a new alert with a new id."""
    topic = f"alerts-{uuid.uuid4().hex[:8]}"
    settings = runner_settings(kafka_bootstrap, chdb_path, topic)
    seed_spray(ch, END - timedelta(minutes=10))

    def fresh() -> AlertRunner:
        return AlertRunner(settings, open_ch=lambda: open_clickhouse(settings.clickhouse))

    runner = fresh()
    await runner.start()
    try:
        (alert,) = await runner.run_once(NOW_MS)
        assert await runner.run_once(NOW_MS) == []
        assert await runner.run_once(NOW_MS + 20 * 60_000) == []  # same hour, still firing
    finally:
        await runner.stop()
    assert alert.type == "distributed_spray"
    assert alert.alert_id == alert_id_for("distributed_spray", "acme", "acme", END)
    assert (alert.tenant, alert.count, alert.distinct_accounts) == ("acme", 75, 75)
    assert (alert.window_start, alert.window_end) == (END - timedelta(hours=1), END)
    assert alert.policy_version.startswith("rules:")

    restarted = fresh()
    await restarted.start()
    try:
        assert await restarted.run_once(NOW_MS) == []
        seed_spray(ch, END + timedelta(minutes=50))
        (later,) = await restarted.run_once(NOW_MS + 60 * 60_000)
    finally:
        await restarted.stop()
    assert later.alert_id == alert_id_for(
        "distributed_spray", "acme", "acme", END + timedelta(hours=1)
    )
    assert await read_topic(kafka_bootstrap, topic) == [
        (alert.alert_id.encode(), encode(alert)),
        (later.alert_id.encode(), encode(later)),
    ]
    assert ch.query("SELECT count(), uniqExact(alert_id) FROM alert_firings") == [(2, 2)]


async def test_runner_posts_to_the_webhook_and_prints_to_stdout(
    kafka_bootstrap: str,
    ch: ClickHouse,
    chdb_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With a webhook and stdout, each new alert is POSTed as JSON and printed as a line."""
    received: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    app_runner = web.AppRunner(app)
    await app_runner.setup()
    port = free_port()
    await web.TCPSite(app_runner, "127.0.0.1", port).start()
    settings = runner_settings(kafka_bootstrap, chdb_path, f"alerts-{uuid.uuid4().hex[:8]}")
    seed_spray(ch, END - timedelta(minutes=10))
    runner = AlertRunner(
        settings,
        webhook=f"http://127.0.0.1:{port}/hook",
        to_stdout=True,
        open_ch=lambda: open_clickhouse(settings.clickhouse),
    )
    await runner.start()
    try:
        (alert,) = await runner.run_once(NOW_MS)
    finally:
        await runner.stop()
        await app_runner.cleanup()
    await wait_until_async(lambda: received, 10.0, description="the webhook POST")
    assert received == [json.loads(encode(alert))]
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(ALERT_LINE)]
    assert printed == [encode(alert).decode()]


async def test_alerts_run_once_command(
    kafka_bootstrap: str, chhttp: ChHttpEndpoint, chdb_path: Path, tmp_path: Path
) -> None:
    """`authpipe alerts run --once --stdout` prints the firing and exits 0; again: nothing."""
    settings = ClickHouseSettings(url=chhttp.url, path=chdb_path)
    with open_clickhouse(settings, create_database=True) as handle:
        apply_migrations(handle, settings)
        seed_spray(
            handle, datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
        )
    topic = f"alerts-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1)])
    env = {
        **os.environ,
        "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "AUTHPIPE_KAFKA_ALERTS_TOPIC": topic,
        "AUTHPIPE_KAFKA_PARTITIONS": "1",
        "AUTHPIPE_CLICKHOUSE_URL": chhttp.url,
        "AUTHPIPE_LOG_FORMAT": "json",
    }
    env.pop("AUTHPIPE_CONFIG", None)
    command = [str(AUTHPIPE), "alerts", "run", "--once", "--stdout"]
    first = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert first.returncode == 0, first.stderr + first.stdout
    alerts = [json.loads(line) for line in first.stdout.splitlines() if line.startswith(ALERT_LINE)]
    assert [(a["type"], a["tenant"], a["count"]) for a in alerts] == [
        ("distributed_spray", "acme", 75)
    ]
    second = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert second.returncode == 0, second.stderr
    assert [line for line in second.stdout.splitlines() if line.startswith(ALERT_LINE)] == []
    assert len(await read_topic(kafka_bootstrap, topic)) == 1


def test_rules_dir_is_in_the_repository() -> None:
    """The runner reads dashboards/alerts of this checkout."""
    assert RULES_DIR == REPO_ROOT / "dashboards" / "alerts"
