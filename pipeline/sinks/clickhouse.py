"""The one small interface every ClickHouse user in authpipe goes through (``ClickHouse``).

Two backends open it with the same SQL and the same results:

* ``http``: a ClickHouse server over HTTP(S), when ``settings.clickhouse.url`` is set
  (``http://user:pass@host:8123``); see :mod:`pipeline.sinks.http_backend`.
* ``chdb``: the embedded engine with a persistent data directory
  (``settings.clickhouse.path``), the default; see :mod:`pipeline.sinks.chdb_backend`.

Both are clickhouse-connect clients (its HTTP client and its in-process chdb client), so
values are encoded and decoded by the same Native-format codec:

* ``DateTime64``/``DateTime`` columns come back as timezone-aware UTC datetimes.
  On insert they take aware datetimes or, for ``DateTime64(3)``, epoch-millisecond ints;
  naive datetimes are refused (the codec would read them as local time).
* Parameters bind server-side: write ``{name:Type}`` placeholders in the SQL and pass the
  values in ``parameters``; values are never formatted into the SQL text.
* ``dedup_token`` becomes the ``insert_deduplication_token`` setting; with the tables'
  ``non_replicated_deduplication_window`` a retried insert with the same token is a no-op,
  in the table and in the materialized views fed by it. Without a token ClickHouse still
  drops an insert whose data is byte-identical to one of the last 1000 blocks, so writers
  should always pass a token naming the batch (e.g. topic, partition, offset range).
* Errors: ClickHouseUnavailable when the server cannot be reached or answers with a
  transient code (back off and retry); BatchRefused when the server refuses these rows
  for good (retrying the same insert can never succeed: set the batch aside);
  ClickHouseError otherwise; ``code`` is the server's.
* Sharing: one handle may serve several threads (HTTP: no session is used; chdb:
  calls of one handle are serialized by clickhouse-connect).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Final, Self

from pipeline.errors import AuthpipeError
from pipeline.logs import get_logger

_log = get_logger("clickhouse")

# Server error codes that mean "try again later" rather than "your SQL is wrong".
TRANSIENT_CODES: Final = frozenset(
    {
        159,  # TIMEOUT_EXCEEDED
        202,  # TOO_MANY_SIMULTANEOUS_QUERIES
        203,  # NO_FREE_CONNECTION
        209,  # SOCKET_TIMEOUT
        210,  # NETWORK_ERROR
        241,  # MEMORY_LIMIT_EXCEEDED
        242,  # TABLE_IS_READ_ONLY
        252,  # TOO_MANY_PARTS: merges behind inserts (but see BATCH_REFUSALS)
        319,  # UNKNOWN_STATUS_OF_INSERT
        999,  # KEEPER_EXCEPTION
    }
)

# Refusals of the rows themselves: (code, words of the message) -> reason code. Code 252
# also means "too many parts" (merges are behind inserts: transient); only the per-insert
# partition limit is a property of the batch.
BATCH_REFUSALS: Final = ((252, "partitions for single insert", "too_many_partitions"),)

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SERVER_PARAMETER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*:[^{}]+\}")


class ClickHouseError(AuthpipeError):
    """ClickHouse refused a statement or could not be used; ``code`` is the server's code."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class ClickHouseUnavailable(ClickHouseError):
    """ClickHouse cannot be reached or is overloaded right now: back off and retry."""


class BatchRefused(ClickHouseError):
    """ClickHouse refuses these rows whenever they are sent; ``reason`` is a stable code."""

    def __init__(self, message: str, code: int | None, reason: str) -> None:
        super().__init__(message, code)
        self.reason = reason


def check_identifier(name: str, what: str) -> str:
    """Return name if it is a plain ClickHouse identifier, else raise ClickHouseError."""
    if not _IDENTIFIER.match(name):
        raise ClickHouseError(
            f"{what} {name!r} is not a plain identifier; use letters, digits and underscores"
        )
    return name


def translate_error(exc: Exception, where: str) -> ClickHouseError:
    """Turn a clickhouse-connect exception into ClickHouseError or ClickHouseUnavailable."""
    from clickhouse_connect.driver.exceptions import OperationalError

    code = getattr(exc, "code", None)
    code = code if isinstance(code, int) else None
    text = str(exc)
    lowered = text.lower()
    for refused_code, words, reason in BATCH_REFUSALS:
        if code == refused_code and words in lowered:
            return BatchRefused(
                f"ClickHouse at {where} refuses these rows for good ({text})", code, reason
            )
    if code in TRANSIENT_CODES or (code is None and isinstance(exc, OperationalError)):
        return ClickHouseUnavailable(
            f"ClickHouse at {where} is unavailable ({text}); retry later or check the server",
            code,
        )
    if code is None:
        return ClickHouseError(
            f"the ClickHouse client refused the call for {where}: {text}; "
            "fix the columns or values passed",
        )
    return ClickHouseError(f"ClickHouse at {where} refused the statement: {text}", code)


class ClickHouse:
    """What authpipe needs from ClickHouse, over a clickhouse-connect client: both
    backends (HTTP and chdb) are this class around their own client."""

    def __init__(self, client: Any, *, backend: str, where: str, database: str) -> None:
        self._client = client
        self._backend = backend
        self._where = where
        self._database = database
        self._closed = False

    @property
    def backend(self) -> str:
        """``http`` or ``chdb``."""
        return self._backend

    @property
    def database(self) -> str:
        """The database unqualified table names resolve in."""
        return self._database

    @property
    def where(self) -> str:
        """Where the data lives, for messages: a URL without password, or chdb:<directory>."""
        return self._where

    def command(
        self,
        sql: str,
        settings: Mapping[str, Any] | None = None,
        *,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        """Run one statement that returns nothing we read (DDL, INSERT … SELECT)."""
        _check_parameters(sql, parameters)
        self._call(
            self._client.command,
            sql,
            parameters=dict(parameters) if parameters else None,
            settings=dict(settings) if settings else None,
        )

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one SELECT and return its rows as tuples."""
        result = self._select(sql, parameters)
        return [row if isinstance(row, tuple) else tuple(row) for row in result.result_rows]

    def query_dicts(
        self, sql: str, parameters: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Run one SELECT and return its rows as column-name dicts."""
        result = self._select(sql, parameters)
        return [dict(row) for row in result.named_results()]

    def insert(
        self,
        table: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        *,
        dedup_token: str | None = None,
        settings: Mapping[str, Any] | None = None,
        column_oriented: bool = False,
    ) -> None:
        """Insert rows (one value per column each); the same dedup_token twice inserts once.

        ``settings`` are query settings for this insert (and the views it feeds). With
        ``column_oriented``, ``rows`` is one sequence of values per column instead (the
        client then skips its row-to-column pivot; bench/README.md, B5).
        """
        if not rows or (column_oriented and not rows[0]):
            return
        if column_oriented:
            _refuse_naive_datetime_columns(table, columns, rows)
        else:
            _refuse_naive_datetimes(table, columns, rows)
        query_settings = dict(settings) if settings else {}
        if dedup_token:
            query_settings["insert_deduplication_token"] = dedup_token
        try:
            self._call(
                self._client.insert,
                table,
                rows,
                column_names=list(columns),
                settings=query_settings or None,
                column_oriented=column_oriented,
            )
        except (TypeError, ValueError, OverflowError, struct.error) as exc:
            raise ClickHouseError(
                f"insert into {table}: a value does not fit its column's type ({exc}); "
                "check the types of the row values",
            ) from exc

    def close(self) -> None:
        """Release the connection (for chdb: the engine handle). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._client.close()
        _log.debug("clickhouse_closed", backend=self._backend, where=self._where)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _select(self, sql: str, parameters: Mapping[str, Any] | None) -> Any:
        _check_parameters(sql, parameters)
        return self._call(
            self._client.query, sql, parameters=dict(parameters) if parameters else None
        )

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise ClickHouseError(
                f"the ClickHouse connection to {self._where} is closed; open a new one"
            )
        from clickhouse_connect.driver.exceptions import ClickHouseError as ConnectError

        try:
            return method(*args, **kwargs)
        except ConnectError as exc:
            raise translate_error(exc, self._where) from exc


def _check_parameters(sql: str, parameters: Mapping[str, Any] | None) -> None:
    """Parameters must bind server-side through {name:Type} placeholders."""
    if parameters and not _SERVER_PARAMETER.search(sql):
        raise ClickHouseError(
            "parameters were given but the SQL has no {name:Type} placeholder; "
            "write placeholders like {tenant:String} instead of formatting values into SQL"
        )


def _refuse_naive_datetimes(
    table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """Datetime columns (found from the first row) must hold aware datetimes in every row."""
    first = rows[0]
    if len(first) != len(columns):
        raise ClickHouseError(
            f"insert into {table}: rows have {len(first)} values but {len(columns)} columns "
            "were named; pass one value per column"
        )
    for index, value in enumerate(first):
        if not isinstance(value, datetime):
            continue
        if any(isinstance(v := row[index], datetime) and v.tzinfo is None for row in rows):
            raise ClickHouseError(
                f"insert into {table}: column {columns[index]} has a naive datetime; "
                "pass timezone-aware UTC datetimes or epoch-millisecond ints"
            )


def _refuse_naive_datetime_columns(
    table: str, columns: Sequence[str], data: Sequence[Sequence[Any]]
) -> None:
    """The column-oriented twin of _refuse_naive_datetimes."""
    if len(data) != len(columns) or len({len(values) for values in data}) != 1:
        raise ClickHouseError(
            f"insert into {table}: {len(data)} columns of values of unequal or wrong count for "
            f"{len(columns)} column names; pass one sequence of values per column, all as long"
        )
    for name, values in zip(columns, data, strict=True):
        if isinstance(values[0], datetime) and any(
            isinstance(v, datetime) and v.tzinfo is None for v in values
        ):
            raise ClickHouseError(
                f"insert into {table}: column {name} has a naive datetime; "
                "pass timezone-aware UTC datetimes or epoch-millisecond ints"
            )


def open_handle(
    client: Any, *, backend: str, where: str, database: str, create: bool
) -> ClickHouse:
    """A handle on a fresh clickhouse-connect client, its default database ``database``
    (created first when ``create``); the client is closed when that fails."""
    try:
        use_database(client, database, where, create=create)
    except BaseException:
        client.close()
        raise
    _log.info("clickhouse_opened", backend=backend, where=where, database=database)
    return ClickHouse(client, backend=backend, where=where, database=database)


def use_database(client: Any, database: str, where: str, *, create: bool) -> None:
    """Create or check ``database`` on a fresh client, then make it the client's default."""
    from clickhouse_connect.driver.exceptions import ClickHouseError as ConnectError

    try:
        if create:
            client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
        else:
            found = client.query(
                "SELECT count() FROM system.databases WHERE name = {name:String}",
                parameters={"name": database},
            ).result_rows[0][0]
            if not found:
                raise ClickHouseError(
                    f"database {database} does not exist at {where}; "
                    "run `authpipe clickhouse migrate` first"
                )
    except ConnectError as exc:
        raise translate_error(exc, where) from exc
    client.database = database
