"""Choosing the ClickHouse backend: the server at ``clickhouse.url`` (clickhouse-connect over
HTTP), else embedded chdb. The interface (``pipeline.sinks.clickhouse``) knows neither."""

from __future__ import annotations

from pipeline.settings import ClickHouseSettings
from pipeline.sinks.chdb_backend import open_chdb
from pipeline.sinks.clickhouse import ClickHouse, check_identifier
from pipeline.sinks.http_backend import open_http


def open_clickhouse(settings: ClickHouseSettings, *, create_database: bool = False) -> ClickHouse:
    """Connect to the configured ClickHouse: the server at ``url``, else embedded chdb.

    The database must exist unless ``create_database`` is set (migrations set it);
    raises ClickHouseUnavailable when the server cannot be reached.
    """
    check_identifier(settings.database, "clickhouse.database")
    if settings.url:
        return open_http(settings, create_database=create_database)
    return open_chdb(settings, create_database=create_database)
