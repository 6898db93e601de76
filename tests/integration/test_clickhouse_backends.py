"""The ClickHouse interface, run against both backends: embedded chdb and HTTP.

The ``http`` backend is clickhouse-connect talking to the chdb-backed endpoint of
tests/chhttp in another process; the ``chdb`` backend runs in this process.
"""

from __future__ import annotations

import shutil
from datetime import UTC, timedelta, timezone
from pathlib import Path

import pytest

from pipeline.settings import ClickHouseSettings, Settings
from pipeline.sinks.clickhouse import (
    BatchRefused,
    ClickHouse,
    ClickHouseError,
    ClickHouseUnavailable,
)
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.migrate import (
    SCHEMA_DIR,
    apply_migrations,
    load_migrations,
    render,
    run_migrate_command,
    split_statements,
)
from tests.plugins.clickhouse import (
    ATTEMPT_COLUMNS,
    ChHttpEndpoint,
    attempt_row,
    recent_minute,
)

EXPECTED_TABLES = [
    "alert_firings",
    "alerts",
    "attempts",
    "attempts_by_account_minute",
    "attempts_by_account_minute_mv",
    "attempts_by_flow_minute",
    "attempts_by_flow_minute_mv",
    "attempts_by_source_minute",
    "attempts_by_source_minute_mv",
    "dead_letters",
    "dead_letters_by_minute",
    "dead_letters_by_minute_mv",
    "decisions",
    "decisions_by_minute",
    "decisions_by_minute_mv",
    "schema_migrations",
]

ATTEMPTS_SCHEMA = [
    ("ts", "DateTime64(3, 'UTC')"),
    ("tenant", "LowCardinality(String)"),
    ("service", "LowCardinality(String)"),
    ("flow", "LowCardinality(String)"),
    ("account_digest", "String"),
    ("account", "Nullable(String)"),
    ("source", "String"),
    ("device_id", "String"),
    ("trusted", "Bool"),
    ("outcome", "LowCardinality(String)"),
    ("failure_reason", "LowCardinality(String)"),
    ("decision", "LowCardinality(String)"),
    ("weight", "UInt32"),
    ("summary", "Bool"),
    ("policy_version", "LowCardinality(String)"),
    ("event_id", "String"),
    ("kafka_topic", "LowCardinality(String)"),
    ("kafka_partition", "UInt16"),
    ("kafka_offset", "UInt64"),
]


def _tables(ch: ClickHouse) -> list[str]:
    rows = ch.query(
        "SELECT name FROM system.tables WHERE database = {db:String} ORDER BY name",
        {"db": ch.database},
    )
    return [name for (name,) in rows]


def _create_statements(ch: ClickHouse) -> list[tuple[str, str]]:
    return [
        (str(name), str(sql))
        for name, sql in ch.query(
            "SELECT name, create_table_query FROM system.tables "
            "WHERE database = {db:String} ORDER BY name",
            {"db": ch.database},
        )
    ]


def test_migrations_create_every_table(clickhouse: ClickHouse) -> None:
    """The migrations create exactly the expected tables and views in the database."""
    assert _tables(clickhouse) == EXPECTED_TABLES


def test_attempts_has_exact_columns_and_types(clickhouse: ClickHouse) -> None:
    """attempts has exactly the documented columns, in order, with their types."""
    rows = clickhouse.query(
        "SELECT name, type FROM system.columns "
        "WHERE database = {db:String} AND table = 'attempts' ORDER BY position",
        {"db": clickhouse.database},
    )
    assert rows == ATTEMPTS_SCHEMA


def test_attempts_engine_has_ttl_and_dedup_window(clickhouse: ClickHouse) -> None:
    """attempts is partitioned by day, with the settings' TTL and a deduplication window."""
    [(engine_full,)] = clickhouse.query(
        "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = 'attempts'",
        {"db": clickhouse.database},
    )
    assert engine_full.startswith("MergeTree PARTITION BY toDate(ts) ")
    assert "TTL toDateTime(ts) + toIntervalDay(90) " in engine_full
    assert "non_replicated_deduplication_window = 1000" in engine_full


def test_insert_and_query_exact_values(clickhouse: ClickHouse) -> None:
    """Inserted rows read back exactly: ms timestamps as aware UTC, NULL, bools, ints."""
    ts = recent_minute().replace(second=7, microsecond=123000)
    rows = [
        attempt_row(ts, "e1", account="Alice@Example.com", offset=10),
        attempt_row(ts + timedelta(milliseconds=1), "e2", outcome="success", weight=4, offset=11),
    ]
    clickhouse.insert("attempts", ATTEMPT_COLUMNS, rows)

    got = clickhouse.query(
        "SELECT ts, account, outcome, weight, summary, kafka_offset FROM attempts ORDER BY event_id"
    )

    assert got == [
        (ts, "Alice@Example.com", "failure", 1, False, 10),
        (ts + timedelta(milliseconds=1), None, "success", 4, True, 11),
    ]
    assert got[0][0].tzinfo == UTC
    assert got[1][0].microsecond == 124000


def test_full_rows_round_trip(clickhouse: ClickHouse) -> None:
    """Every column of an attempts row reads back as inserted."""
    ts = recent_minute().replace(second=1, microsecond=999000)
    row = attempt_row(ts, "e-full", account=None, offset=42)
    clickhouse.insert("attempts", ATTEMPT_COLUMNS, [row])

    got = clickhouse.query(f"SELECT {', '.join(ATTEMPT_COLUMNS)} FROM attempts")

    assert got == [tuple(row)]


def test_epoch_ms_ints_insert_as_datetime64(clickhouse: ClickHouse) -> None:
    """An epoch-millisecond int inserts into DateTime64(3) as that instant."""
    ts = recent_minute().replace(second=30, microsecond=456000)
    epoch_ms = int(ts.timestamp() * 1000)
    clickhouse.insert("attempts", ATTEMPT_COLUMNS, [attempt_row(epoch_ms, "e-int")])

    assert clickhouse.query("SELECT ts, toUnixTimestamp64Milli(ts) FROM attempts") == [
        (ts, epoch_ms)
    ]


def test_query_dicts_names_columns(clickhouse: ClickHouse) -> None:
    """query_dicts returns one dict per row keyed by column name."""
    ts = recent_minute()
    clickhouse.insert("attempts", ATTEMPT_COLUMNS, [attempt_row(ts, "e1", weight=3)])

    got = clickhouse.query_dicts("SELECT event_id, weight, ts FROM attempts")

    assert got == [{"event_id": "e1", "weight": 3, "ts": ts}]


def test_parameters_bind_server_side(clickhouse: ClickHouse) -> None:
    """{name:Type} parameters bind values with quotes and backslashes literally."""
    ts = recent_minute()
    tricky = "x' OR 1=1 --\\"
    clickhouse.insert(
        "attempts",
        ATTEMPT_COLUMNS,
        [attempt_row(ts, "e1", tenant=tricky), attempt_row(ts, "e2", tenant="other")],
    )
    sql = "SELECT event_id FROM attempts WHERE tenant = {tenant:String} AND ts >= {since:DateTime64(3, 'UTC')}"

    assert clickhouse.query(sql, {"tenant": tricky, "since": ts}) == [("e1",)]
    assert clickhouse.query(sql, {"tenant": "x", "since": ts}) == []
    assert clickhouse.query(sql, {"tenant": "other", "since": ts + timedelta(milliseconds=1)}) == []


def test_parameters_without_placeholders_are_refused(clickhouse: ClickHouse) -> None:
    """Parameters with SQL that has no {name:Type} placeholder raise ClickHouseError."""
    with pytest.raises(ClickHouseError, match=r"no \{name:Type\} placeholder"):
        clickhouse.query("SELECT %(x)s", {"x": 1})


def test_naive_datetimes_are_refused(clickhouse: ClickHouse) -> None:
    """A naive datetime in an insert raises ClickHouseError and inserts nothing."""
    aware = recent_minute()
    naive = aware.replace(tzinfo=None)
    rows = [attempt_row(aware, "e1"), attempt_row(naive, "e2")]

    with pytest.raises(ClickHouseError, match="column ts has a naive datetime"):
        clickhouse.insert("attempts", ATTEMPT_COLUMNS, rows)
    assert clickhouse.query("SELECT count() FROM attempts") == [(0,)]


def test_values_of_the_wrong_type_are_refused(clickhouse: ClickHouse) -> None:
    """A str in a UInt32 column and a None in a String column raise ClickHouseError."""
    wrong_weight = attempt_row(recent_minute(), "e1")
    wrong_weight[ATTEMPT_COLUMNS.index("weight")] = "many"
    null_source = attempt_row(recent_minute(), "e2", source=None)  # type: ignore[arg-type]

    with pytest.raises(ClickHouseError, match="insert into attempts: a value does not fit"):
        clickhouse.insert("attempts", ATTEMPT_COLUMNS, [wrong_weight])
    with pytest.raises(ClickHouseError, match="Invalid None value in non-Nullable column"):
        clickhouse.insert("attempts", ATTEMPT_COLUMNS, [null_source])
    assert clickhouse.query("SELECT count() FROM attempts") == [(0,)]


def test_same_dedup_token_inserts_once(clickhouse: ClickHouse) -> None:
    """The same dedup_token twice stores one copy, in the table and in its aggregates."""
    ts = recent_minute()
    rows = [attempt_row(ts, "e1", weight=2), attempt_row(ts, "e2", account_digest="b" * 32)]

    clickhouse.insert("attempts", ATTEMPT_COLUMNS, rows, dedup_token="audit-3-100-101")
    clickhouse.insert("attempts", ATTEMPT_COLUMNS, rows, dedup_token="audit-3-100-101")

    assert clickhouse.query("SELECT count(), sum(weight) FROM attempts") == [(2, 3)]
    assert clickhouse.query(
        "SELECT sum(attempts), sum(failures), uniqMerge(accounts) FROM attempts_by_source_minute"
    ) == [(3, 3, 2)]


def test_another_dedup_token_inserts_again(clickhouse: ClickHouse) -> None:
    """A different dedup_token with the same rows stores a second copy."""
    rows = [attempt_row(recent_minute(), "e1")]

    clickhouse.insert("attempts", ATTEMPT_COLUMNS, rows, dedup_token="t1")
    clickhouse.insert("attempts", ATTEMPT_COLUMNS, rows, dedup_token="t2")

    assert clickhouse.query("SELECT count() FROM attempts") == [(2,)]


def test_insert_settings_reach_the_server_with_the_dedup_token(clickhouse: ClickHouse) -> None:
    """optimize_on_insert=0 keeps both rows of one key in a block; the token still dedupes."""
    clickhouse.command(
        "CREATE TABLE replacing (k UInt8, v UInt8) ENGINE = ReplacingMergeTree ORDER BY k "
        "SETTINGS non_replicated_deduplication_window = 10"
    )
    rows = [[1, 1], [1, 2]]
    clickhouse.insert("replacing", ["k", "v"], rows, dedup_token="r1")
    clickhouse.insert(
        "replacing", ["k", "v"], rows, dedup_token="r2", settings={"optimize_on_insert": 0}
    )
    clickhouse.insert(
        "replacing", ["k", "v"], rows, dedup_token="r2", settings={"optimize_on_insert": 0}
    )
    assert clickhouse.query("SELECT count() FROM replacing") == [(1 + 2,)]


def test_minute_aggregates(clickhouse: ClickHouse) -> None:
    """The per-minute views count weight, failures and distinct accounts/sources exactly."""
    minute = recent_minute()
    a, b = "a" * 32, "b" * 32
    rows = [
        attempt_row(minute + timedelta(seconds=1), "e1", account_digest=a),
        attempt_row(minute + timedelta(seconds=2), "e2", account_digest=b),
        attempt_row(minute + timedelta(seconds=3), "e3", account_digest=a, outcome="success"),
        attempt_row(minute + timedelta(seconds=4), "e4", account_digest="", weight=5),
        attempt_row(minute + timedelta(seconds=61), "e5", account_digest=a, source="198.51.100.1"),
    ]
    clickhouse.insert("attempts", ATTEMPT_COLUMNS, rows)
    next_minute = minute + timedelta(minutes=1)

    by_source = clickhouse.query(
        "SELECT minute, source, sum(attempts), sum(failures), uniqMerge(accounts) "
        "FROM attempts_by_source_minute GROUP BY minute, source ORDER BY minute, source"
    )
    by_account = clickhouse.query(
        "SELECT minute, account_digest, sum(attempts), sum(failures), uniqMerge(sources) "
        "FROM attempts_by_account_minute GROUP BY ALL ORDER BY minute, account_digest"
    )
    by_flow = clickhouse.query(
        "SELECT minute, flow, outcome, decision, sum(attempts) "
        "FROM attempts_by_flow_minute GROUP BY ALL ORDER BY minute, outcome"
    )

    assert by_source == [(minute, "203.0.113.7", 8, 7, 2), (next_minute, "198.51.100.1", 1, 1, 1)]
    assert by_account == [(minute, a, 2, 1, 1), (minute, b, 1, 1, 1), (next_minute, a, 1, 1, 1)]
    assert by_flow == [
        (minute, "login", "failure", "allowed", 7),
        (minute, "login", "success", "allowed", 1),
        (next_minute, "login", "failure", "allowed", 1),
    ]


def test_dead_letters_per_minute(clickhouse: ClickHouse) -> None:
    """dead_letters rows are counted per minute, stage and reason."""
    minute = recent_minute()
    columns = ["ts", "reason", "stage", "kafka_topic", "kafka_partition", "kafka_offset"]
    rows = [
        [minute, "bad_json", "decode", "auth.login-attempts", 0, 1],
        [minute + timedelta(seconds=5), "bad_json", "decode", "auth.login-attempts", 1, 7],
        [minute, "too_large", "decode", "auth.login-attempts", 0, 2],
    ]
    clickhouse.insert("dead_letters", columns, rows)

    assert clickhouse.query(
        "SELECT minute, stage, reason, sum(messages) FROM dead_letters_by_minute "
        "GROUP BY ALL ORDER BY reason"
    ) == [(minute, "decode", "bad_json", 2), (minute, "decode", "too_large", 1)]


def test_decisions_and_alerts_round_trip(clickhouse: ClickHouse) -> None:
    """A decision (with NULL parts and a tombstone flag) and an alert read back exactly."""
    issued = recent_minute().replace(microsecond=5000)
    decision = [
        "d-1",
        "acme|source|203.0.113.7",
        "acme",
        "source",
        None,
        "203.0.113.7",
        None,
        "untrusted",
        "block",
        "source_failures",
        120,
        100,
        60_000,
        issued,
        issued + timedelta(minutes=15),
        "policy-1",
        False,
        "auth.throttle-decisions",
        2,
        9,
    ]
    decision_columns = [
        "decision_id",
        "key",
        "tenant",
        "scope",
        "account_digest",
        "source",
        "device_id",
        "applies_to",
        "action",
        "rule",
        "count",
        "threshold",
        "window_ms",
        "issued_at",
        "expires_at",
        "policy_version",
        "tombstone",
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
    ]
    alert = [
        "al-1",
        "credential_stuffing",
        "acme",
        "203.0.113.7",
        None,
        500,
        120,
        issued,
        issued + timedelta(minutes=5),
        "policy-1",
        "auth.alerts",
        0,
        4,
    ]
    alert_columns = [
        "alert_id",
        "type",
        "tenant",
        "source",
        "account_digest",
        "count",
        "distinct_accounts",
        "window_start",
        "window_end",
        "policy_version",
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
    ]
    clickhouse.insert("decisions", decision_columns, [decision])
    clickhouse.insert("alerts", alert_columns, [alert])

    assert clickhouse.query(f"SELECT {', '.join(decision_columns)} FROM decisions") == [
        tuple(decision)
    ]
    assert clickhouse.query(f"SELECT {', '.join(alert_columns)} FROM alerts") == [tuple(alert)]


def test_bad_sql_raises_clickhouse_error_with_server_message(clickhouse: ClickHouse) -> None:
    """A syntax error raises ClickHouseError with code 62 and the server's message."""
    with pytest.raises(ClickHouseError) as caught:
        clickhouse.query("SELEC 1")

    assert caught.type is ClickHouseError
    assert caught.value.code == 62
    assert "Code: 62. DB::Exception: Syntax error" in str(caught.value)


def test_unknown_table_raises_clickhouse_error(clickhouse: ClickHouse) -> None:
    """A command on a missing table raises ClickHouseError with code 60 (UNKNOWN_TABLE)."""
    with pytest.raises(ClickHouseError) as caught:
        clickhouse.command("ALTER TABLE no_such_table DELETE WHERE 1")

    assert caught.value.code == 60
    assert "UNKNOWN_TABLE" in str(caught.value)


def test_migrate_twice_is_idempotent(
    clickhouse: ClickHouse, clickhouse_settings: ClickHouseSettings
) -> None:
    """A second migration run applies nothing and changes no table."""
    before = _create_statements(clickhouse)

    assert apply_migrations(clickhouse, clickhouse_settings) == []
    assert _create_statements(clickhouse) == before
    versions = clickhouse.query("SELECT version, name FROM schema_migrations ORDER BY version")
    assert versions == [(m.version, m.name) for m in load_migrations()]


def test_changed_applied_migration_is_refused(
    clickhouse: ClickHouse, clickhouse_settings: ClickHouseSettings, tmp_path: Path
) -> None:
    """Editing an applied migration file makes the next run fail and apply nothing."""
    schema_dir = tmp_path / "schemas"
    shutil.copytree(SCHEMA_DIR, schema_dir)
    first = sorted(schema_dir.glob("001_*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited\n")
    (schema_dir / "999_extra.sql").write_text(
        "CREATE TABLE {database}.extra (a UInt8) ENGINE = Log;\n"
    )

    with pytest.raises(ClickHouseError, match="changed after it was applied"):
        apply_migrations(clickhouse, clickhouse_settings, schema_dir)
    assert "extra" not in _tables(clickhouse)


def test_new_migration_applies_with_placeholders(
    clickhouse: ClickHouse, clickhouse_settings: ClickHouseSettings, tmp_path: Path
) -> None:
    """A new file applies once, with {database} and {ttl_days} filled in."""
    schema_dir = tmp_path / "schemas"
    shutil.copytree(SCHEMA_DIR, schema_dir)
    (schema_dir / "900_extra.sql").write_text(
        "-- a test migration\n"
        "CREATE TABLE IF NOT EXISTS {database}.extra (ts DateTime)\n"
        "ENGINE = MergeTree ORDER BY ts TTL ts + INTERVAL {ttl_days} DAY;\n"
        "INSERT INTO {database}.extra SELECT now();\n"
    )

    applied = apply_migrations(clickhouse, clickhouse_settings, schema_dir)

    assert [m.label for m in applied] == ["900_extra"]
    assert clickhouse.query("SELECT count() FROM extra") == [(1,)]
    [(engine_full,)] = clickhouse.query(
        "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = 'extra'",
        {"db": clickhouse.database},
    )
    assert "TTL ts + toIntervalDay(90)" in engine_full
    assert apply_migrations(clickhouse, clickhouse_settings, schema_dir) == []


def test_render_fills_only_known_placeholders() -> None:
    """render fills {database}/{ttl_days}, keeps {name:Type}, refuses other {word}s."""
    settings = ClickHouseSettings(database="audit_db", ttl_days=7)

    assert render("SELECT {n:UInt8} FROM {database}.t TTL {ttl_days}", settings) == (
        "SELECT {n:UInt8} FROM audit_db.t TTL 7"
    )
    with pytest.raises(ClickHouseError, match=r"unknown placeholder \{tenant\}"):
        render("SELECT * FROM {database}.t WHERE tenant = {tenant}", settings)


def test_split_statements_at_line_end_semicolons() -> None:
    """Statements split at ';' ending a line; comment-only chunks are dropped."""
    text = "-- a\nCREATE TABLE a (s String DEFAULT ';x') ENGINE = Log;\nSELECT 1;  \n-- end\n"

    assert split_statements(text) == [
        "-- a\nCREATE TABLE a (s String DEFAULT ';x') ENGINE = Log",
        "SELECT 1",
    ]


def test_migrate_command_prints_what_it_applied(
    clickhouse_settings: ClickHouseSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    """`authpipe clickhouse migrate` lists each applied file, then applies nothing."""
    settings = Settings(clickhouse=clickhouse_settings)
    labels = [m.label for m in load_migrations()]

    assert run_migrate_command(settings) == 0
    first = capsys.readouterr().out.splitlines()
    assert run_migrate_command(settings) == 0
    second = capsys.readouterr().out.splitlines()

    assert [line for line in first if line.startswith("applied ")] == [
        f"applied {label}" for label in labels
    ]
    assert first[-1].endswith(f"database authpipe: {len(labels)} applied, 0 already up to date")
    assert second[-1].endswith(f"database authpipe: 0 applied, {len(labels)} already up to date")


def test_missing_database_is_a_clear_error(clickhouse_settings: ClickHouseSettings) -> None:
    """Opening before any migration says the database is missing and what to run."""
    with pytest.raises(ClickHouseError, match=r"database authpipe does not exist .*migrate"):
        open_clickhouse(clickhouse_settings)


def test_http_outage_raises_unavailable_then_recovers(chhttp: ChHttpEndpoint) -> None:
    """With the server down, calls raise ClickHouseUnavailable; after restart they work."""
    settings = ClickHouseSettings(url=chhttp.url)
    rows = [attempt_row(recent_minute(), "e1")]
    with open_clickhouse(settings, create_database=True) as ch:
        apply_migrations(ch, settings)
        chhttp.stop()

        with pytest.raises(ClickHouseUnavailable):
            ch.insert("attempts", ATTEMPT_COLUMNS, rows, dedup_token="b1")
        with pytest.raises(ClickHouseUnavailable):
            open_clickhouse(settings)

        chhttp.start()
        ch.insert("attempts", ATTEMPT_COLUMNS, rows, dedup_token="b1")
        assert ch.query("SELECT event_id FROM attempts") == [("e1",)]


def test_closed_handle_is_refused(clickhouse: ClickHouse) -> None:
    """A call after close() raises ClickHouseError saying the connection is closed."""
    clickhouse.close()

    with pytest.raises(ClickHouseError, match="is closed; open a new one"):
        clickhouse.query("SELECT 1")


def test_aware_non_utc_datetimes_are_converted(clickhouse: ClickHouse) -> None:
    """An aware datetime in another zone is stored as the same instant, read back in UTC."""
    ts = recent_minute().replace(microsecond=250000)
    plus_two = ts.astimezone(timezone(timedelta(hours=2)))
    clickhouse.insert("attempts", ATTEMPT_COLUMNS, [attempt_row(plus_two, "e1")])

    [(got,)] = clickhouse.query("SELECT ts FROM attempts")
    assert got == ts
    assert got.utcoffset() == timedelta(0)


def test_too_many_partitions_for_one_insert_is_a_batch_refusal(clickhouse: ClickHouse) -> None:
    """Code 252 for the per-insert partition limit: BatchRefused (too_many_partitions)."""
    days = [recent_minute() - timedelta(days=d) for d in range(101)]
    rows = [attempt_row(ts, f"ev-{i}") for i, ts in enumerate(days)]
    with pytest.raises(BatchRefused) as refused:
        clickhouse.insert("attempts", ATTEMPT_COLUMNS, rows)
    assert (refused.value.code, refused.value.reason) == (252, "too_many_partitions")
    assert not isinstance(refused.value, ClickHouseUnavailable)
    assert clickhouse.query("SELECT count() FROM attempts") == [(0,)]


def test_too_many_parts_stays_transient(clickhouse: ClickHouse) -> None:
    """Code 252 for merges behind inserts ("Too many parts"): ClickHouseUnavailable, retry."""
    clickhouse.command(
        "CREATE TABLE busy (x UInt64) ENGINE = MergeTree ORDER BY x "
        "SETTINGS parts_to_delay_insert = 1, parts_to_throw_insert = 2, max_delay_to_insert = 0"
    )
    clickhouse.command("SYSTEM STOP MERGES busy")
    with pytest.raises(ClickHouseUnavailable) as busy:
        for x in range(5):
            clickhouse.insert("busy", ["x"], [[x]])
    assert busy.value.code == 252
    assert not isinstance(busy.value, BatchRefused)


def test_column_oriented_insert_stores_the_same_rows(clickhouse: ClickHouse) -> None:
    """column_oriented=True takes one sequence per column and stores the same rows."""
    minute = recent_minute()
    rows = [attempt_row(minute, f"ev-{i}", offset=i) for i in range(3)]
    clickhouse.insert(
        "attempts", ATTEMPT_COLUMNS, list(zip(*rows, strict=True)), column_oriented=True
    )
    assert clickhouse.query(
        "SELECT event_id, kafka_offset FROM attempts ORDER BY kafka_offset"
    ) == [
        ("ev-0", 0),
        ("ev-1", 1),
        ("ev-2", 2),
    ]
    with pytest.raises(ClickHouseError, match="one sequence of values per column"):
        clickhouse.insert("attempts", ATTEMPT_COLUMNS, [("x",)], column_oriented=True)
