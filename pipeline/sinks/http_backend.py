"""The server backend: a ClickHouse server over HTTP(S) with clickhouse-connect.

``settings.url`` is ``http(s)://user:pass@host:port``; a path or query string in it is
ignored for the database (``settings.database`` decides). Inserts are lz4-compressed
when the lz4 package is installed, as clickhouse-connect does by default.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pipeline.settings import ClickHouseSettings
from pipeline.sinks.clickhouse import (
    ClickHouse,
    ClickHouseError,
    open_handle,
    translate_error,
)

CONNECT_TIMEOUT_S = 5
SEND_RECEIVE_TIMEOUT_S = 120


def open_http(settings: ClickHouseSettings, *, create_database: bool = False) -> ClickHouse:
    """Connect to the server at ``settings.url``; ClickHouseUnavailable if it is down."""
    if not settings.url:
        raise ClickHouseError("clickhouse.url is not set; set it to http://user:pass@host:8123")
    where = redact_url(settings.url)
    client = _connect(settings.url, where)
    return open_handle(
        client, backend="http", where=where, database=settings.database, create=create_database
    )


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _connect(url: str, where: str) -> Any:
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError as ConnectError

    parts = urlsplit(url)
    base = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    try:
        return clickhouse_connect.get_client(
            dsn=base,
            tz_mode="aware",
            # No HTTP session: a shared client may then serve several threads at once.
            autogenerate_session_id=False,
            connect_timeout=CONNECT_TIMEOUT_S,
            send_receive_timeout=SEND_RECEIVE_TIMEOUT_S,
        )
    except ConnectError as exc:
        raise translate_error(exc, where) from exc
