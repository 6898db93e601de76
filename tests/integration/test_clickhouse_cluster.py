"""Cluster mode of ``authpipe clickhouse migrate``: the generated ON CLUSTER DDL, and on chdb
what one embedded node can run of it (chdb has no cluster and no Keeper: ``ON CLUSTER``
statements stop at CLUSTER_DOESNT_EXIST, after parsing; the local tables and views run with
replication and the cluster stripped, a Merge table standing in for each Distributed one)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.settings import ClickHouseSettings
from pipeline.sinks.clickhouse import ClickHouseError
from pipeline.sinks.cluster import for_cluster
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.migrate import plan_sql
from pipeline.sinks.tables import ATTEMPTS_COLUMNS
from tests.plugins.clickhouse import attempt_row, recent_minute

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "authpipe_cluster"
SETTINGS = ClickHouseSettings(cluster=CLUSTER)
TABLES = [
    "schema_migrations",
    "attempts",
    "decisions",
    "alerts",
    "dead_letters",
    "attempts_by_source_minute",
    "attempts_by_account_minute",
    "attempts_by_flow_minute",
    "dead_letters_by_minute",
    "decisions_by_minute",
    "alert_firings",
]
VIEWS = [
    "attempts_by_source_minute_mv",
    "attempts_by_account_minute_mv",
    "attempts_by_flow_minute_mv",
    "dead_letters_by_minute_mv",
    "decisions_by_minute_mv",
]


def test_every_table_is_replicated_with_a_distributed_table_in_front() -> None:
    """Per table: a Replicated*MergeTree ``_local`` and a Distributed table, all ON CLUSTER."""
    sql = plan_sql(SETTINGS)
    assert sql[0] == f"CREATE DATABASE IF NOT EXISTS authpipe ON CLUSTER {CLUSTER}"
    created = re.findall(
        r"^CREATE TABLE IF NOT EXISTS authpipe\.(\w+) ON CLUSTER (\w+)", "\n".join(sql), re.M
    )
    assert sorted(created) == sorted(
        [(t, CLUSTER) for t in TABLES] + [(f"{t}_local", CLUSTER) for t in TABLES]
    )
    for statement in sql[1:]:
        assert f" ON CLUSTER {CLUSTER}" in statement.splitlines()[0]
        assert "non_replicated_deduplication_window" not in statement
    engines = re.findall(r"ENGINE = (Replicated\w*MergeTree|Distributed)\(", "\n".join(sql))
    assert engines.count("Distributed") == len(TABLES)
    assert sorted(set(engines)) == [
        "Distributed",
        "ReplicatedAggregatingMergeTree",
        "ReplicatedMergeTree",
        "ReplicatedReplacingMergeTree",
    ]
    (distributed,) = [
        s for s in sql if s.startswith("CREATE TABLE IF NOT EXISTS authpipe.dead_letters ")
    ]
    assert distributed == (
        f"CREATE TABLE IF NOT EXISTS authpipe.dead_letters ON CLUSTER {CLUSTER} AS "
        "authpipe.dead_letters_local\nENGINE = Distributed(authpipe_cluster, authpipe, "
        "dead_letters_local, cityHash64(kafka_topic, kafka_partition, kafka_offset))"
    )
    (local,) = [
        s for s in sql if s.startswith("CREATE TABLE IF NOT EXISTS authpipe.dead_letters_local ")
    ]
    assert (
        "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/authpipe/dead_letters_local', '{replica}')"
        in local
    )
    assert "SETTINGS replicated_deduplication_window = 1000, ttl_only_drop_parts = 1" in local


def test_views_run_between_the_local_tables_on_every_node() -> None:
    """Each materialized view is ON CLUSTER, reads the local source, writes the local target."""
    views = [s for s in plan_sql(SETTINGS) if s.startswith("CREATE MATERIALIZED VIEW")]
    assert len(views) == len(VIEWS)
    for view in views:
        name, target = re.findall(
            r"^CREATE MATERIALIZED VIEW IF NOT EXISTS authpipe\.(\w+) ON CLUSTER \w+\nTO authpipe\.(\w+)\n",
            view,
        )[0]
        assert name in VIEWS and target == name.removesuffix("_mv") + "_local"
        sources = re.findall(r"\bFROM authpipe\.(\w+)", view)
        assert len(sources) == 1 and sources[0].endswith("_local")


def test_statements_cluster_mode_cannot_rewrite_are_refused() -> None:
    """An ALTER (or anything but CREATE TABLE / VIEW) is refused with what to do."""
    with pytest.raises(ClickHouseError, match="ON CLUSTER form"):
        for_cluster(
            "ALTER TABLE authpipe.attempts MODIFY TTL toDateTime(ts) + INTERVAL 9 DAY", CLUSTER
        )
    with pytest.raises(ClickHouseError, match="not a plain identifier"):
        for_cluster("CREATE TABLE IF NOT EXISTS a.b (x UInt8) ENGINE = MergeTree ORDER BY x", "a-b")


def one_node(statement: str) -> str:
    """A statement of the cluster DDL as one chdb node can run it: no cluster, no Keeper,
    a Merge table (read path of a one-shard Distributed table) for each Distributed one."""
    statement = re.sub(rf" ON CLUSTER {CLUSTER}", "", statement)
    statement = re.sub(r"Replicated(\w*MergeTree)\('[^']*', '[^']*'(?:, )?", r"\1(", statement)
    statement = statement.replace("MergeTree()", "MergeTree")
    statement = statement.replace(
        " replicated_deduplication_window", " non_replicated_deduplication_window"
    )
    return re.sub(
        r"ENGINE = Distributed\(\w+, (\w+), (\w+), [^\n]*\)$",
        lambda m: f"ENGINE = Merge({m[1]}, '^{m[2]}$')",
        statement,
    )


def test_the_cluster_schema_runs_on_one_chdb_node(tmp_path: Path) -> None:
    """On chdb every statement parses and stops only at the missing cluster (code 701; 392,
    replicated DDL disabled, for ALTER TABLE), and
    its one-node form runs: rows into attempts_local reach the local minute aggregates, read
    back through the front tables with exact sums."""
    with open_clickhouse(ClickHouseSettings(path=tmp_path / "chdb"), create_database=True) as ch:
        for statement in plan_sql(SETTINGS):
            with pytest.raises(ClickHouseError) as refused:
                ch.command(statement)
            # no such cluster (701); chdb refuses ALTER … ON CLUSTER before it looks (392)
            expected = 392 if statement.startswith("ALTER TABLE") else 701
            assert refused.value.code == expected, (statement, str(refused.value))
            ch.command(one_node(statement))
        minute = recent_minute()
        rows = [
            attempt_row(minute, f"ev-{i}", outcome="failure" if i % 3 else "success", offset=i)
            for i in range(30)
        ]
        ch.insert("attempts_local", ATTEMPTS_COLUMNS, rows, dedup_token="t1")
        ch.insert("attempts_local", ATTEMPTS_COLUMNS, rows, dedup_token="t1")  # a retry
        assert ch.query("SELECT count(), sum(weight) FROM attempts") == [(30, 30)]
        assert ch.query(
            "SELECT outcome, sum(attempts) FROM attempts_by_flow_minute GROUP BY outcome ORDER BY outcome"
        ) == [("failure", 20), ("success", 10)]
        assert ch.query(
            "SELECT sum(failures), uniqMerge(sources) FROM attempts_by_account_minute"
        ) == [(20, 1)]


def test_migrate_print_shows_the_cluster_ddl_without_connecting(tmp_path: Path) -> None:
    """`authpipe clickhouse migrate --cluster NAME --print` prints the DDL; no database made."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "clickhouse",
            "migrate",
            "--cluster",
            CLUSTER,
            "--print",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(REPO_ROOT),
            "AUTHPIPE_CLICKHOUSE_PATH": str(tmp_path / "chdb"),
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(f"ON CLUSTER {CLUSTER}") == len(plan_sql(SETTINGS))
    assert result.stdout.rstrip().endswith(";")
    assert not (tmp_path / "chdb").exists()
