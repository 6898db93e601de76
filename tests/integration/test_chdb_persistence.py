"""The embedded chdb backend keeps its data in the directory across close, reopen and restart."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from pipeline.settings import ClickHouseSettings
from pipeline.sinks.clickhouse import ClickHouseError
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.migrate import apply_migrations
from tests.plugins.clickhouse import ATTEMPT_COLUMNS, REPO_ROOT, attempt_row, recent_minute

READ_TIMEOUT_S = 120

_READER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from pipeline.settings import ClickHouseSettings
    from pipeline.sinks.connect import open_clickhouse

    with open_clickhouse(ClickHouseSettings(path=Path(sys.argv[1]))) as ch:
        rows = ch.query("SELECT ts, event_id, account FROM attempts ORDER BY event_id")
        versions = ch.query("SELECT version FROM schema_migrations ORDER BY version")
    print(json.dumps({"rows": [[ts.isoformat(), e, a] for ts, e, a in rows],
                      "versions": [v for (v,) in versions]}))
    """
)


def _write_rows(settings: ClickHouseSettings) -> tuple[datetime, datetime]:
    """Migrate, insert e1 (with a plain account) and e2, close; return their timestamps."""
    ts1 = recent_minute().replace(second=9, microsecond=321000)
    ts2 = ts1 + timedelta(milliseconds=1)
    rows = [attempt_row(ts1, "e1", account="bob@example.com"), attempt_row(ts2, "e2")]
    with open_clickhouse(settings, create_database=True) as ch:
        apply_migrations(ch, settings)
        ch.insert("attempts", ATTEMPT_COLUMNS, rows, dedup_token="persist-1")
    return ts1, ts2


def test_rows_survive_close_and_reopen(chdb_path: Path) -> None:
    """Rows inserted, closed and reopened in this process read back exactly."""
    settings = ClickHouseSettings(path=chdb_path)
    ts1, ts2 = _write_rows(settings)

    with open_clickhouse(settings) as ch:
        got = ch.query("SELECT ts, event_id, account FROM attempts ORDER BY event_id")
        aggregated = ch.query("SELECT sum(attempts) FROM attempts_by_source_minute")

    assert got == [(ts1, "e1", "bob@example.com"), (ts2, "e2", None)]
    assert aggregated == [(2,)]


def test_rows_survive_a_process_restart(chdb_path: Path) -> None:
    """A new process opening the same directory reads the same rows and migrations."""
    settings = ClickHouseSettings(path=chdb_path)
    ts1, ts2 = _write_rows(settings)

    done = subprocess.run(
        [sys.executable, "-c", _READER, str(chdb_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=READ_TIMEOUT_S,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {
        "rows": [
            [ts1.isoformat(), "e1", "bob@example.com"],
            [ts2.isoformat(), "e2", None],
        ],
        "versions": [1, 2, 3, 4, 5, 6, 7, 8],
    }


def test_migrations_survive_reopen(chdb_path: Path) -> None:
    """Reopening the directory and migrating again applies nothing."""
    settings = ClickHouseSettings(path=chdb_path)
    _write_rows(settings)

    with open_clickhouse(settings, create_database=True) as ch:
        assert apply_migrations(ch, settings) == []
        assert ch.query("SELECT count() FROM attempts") == [(2,)]


def test_one_data_directory_per_process(chdb_path: Path, tmp_path: Path) -> None:
    """While a directory is open, another is refused with a clear error; after close it opens."""
    first = ClickHouseSettings(path=chdb_path)
    second = ClickHouseSettings(path=tmp_path / "other-chdb")

    with open_clickhouse(first, create_database=True):
        with pytest.raises(ClickHouseError, match="one data directory per process"):
            open_clickhouse(second, create_database=True)
        with open_clickhouse(first) as same_directory:
            assert same_directory.query("SELECT 1") == [(1,)]

    with open_clickhouse(second, create_database=True) as ch:
        assert ch.query("SELECT currentDatabase()") == [("authpipe",)]
