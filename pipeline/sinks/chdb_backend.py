"""The embedded backend: chdb (ClickHouse in-process) with a persistent data directory.

It is clickhouse-connect's chdb client, so queries, parameters and inserts go through the
same Native codec as the HTTP backend and give identical values.

chdb limits (chdb 4.4 / engine 26.9), found by trying them:

* One engine, so one data directory, per process. Any number of handles may share it;
  opening another directory while a handle is open fails (BAD_ARGUMENTS). Once every
  handle is closed, another directory can be opened.
* Handles are safe to share between threads; clickhouse-connect serializes the calls of
  one client with a lock, so give each thread its own handle for parallel work.
* Data lives in MergeTree parts under the directory and survives a restart; an insert is
  on disk when ``insert`` returns.
"""

from __future__ import annotations

from typing import Any

from pipeline.settings import ClickHouseSettings
from pipeline.sinks.clickhouse import ClickHouse, ClickHouseError, open_handle


def open_chdb(settings: ClickHouseSettings, *, create_database: bool = False) -> ClickHouse:
    """Open the chdb data directory at ``settings.path`` (created if missing)."""
    path = settings.path.resolve()
    where = f"chdb:{path}"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ClickHouseError(
            f"cannot create the chdb data directory {path} ({exc}); "
            "fix clickhouse.path or its permissions"
        ) from exc
    client = _connect(str(path), where)
    return open_handle(
        client, backend="chdb", where=where, database=settings.database, create=create_database
    )


def _connect(path: str, where: str) -> Any:
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError as ConnectError

    try:
        return clickhouse_connect.get_client(interface="chdb", path=path, tz_mode="aware")
    except ConnectError as exc:
        raise ClickHouseError(
            f"cannot open {where} ({exc}); chdb allows one data directory per process: "
            "close the other ClickHouse handle first or use one clickhouse.path"
        ) from exc
