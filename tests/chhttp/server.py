"""A chdb-backed endpoint speaking ClickHouse's HTTP interface (test fixture, not a product part).

What it implements, as a ClickHouse server does, enough for clickhouse-connect:

* ``GET /ping`` → ``Ok.``; any other path but ``/`` → 404.
* The statement is the ``query`` URL parameter, then a newline, then the request body
  (either may be empty); ``multipart/form-data`` bodies carry ``query`` and ``param_*``.
* ``INSERT … FORMAT <fmt>`` followed by data (in the body, after the statement's newline)
  is streamed into chdb's inserter (a refusal it swallows is found in ``system.errors``);
  other statements run with chdb's ``query``.
* Request bodies may be chunked and compressed (``Content-Encoding`` lz4, gzip, deflate,
  and zstd/br where their modules are installed); responses are compressed with lz4,
  gzip or deflate when ``enable_http_compression=1`` and the client accepts it.
* ``database`` selects the default database; ``param_<name>`` binds ``{name:Type}``;
  ``default_format`` picks the output format when the SQL names none; every other URL
  parameter that is not an HTTP transport option is a setting, applied with ``SET``.
* Headers: X-ClickHouse-Summary, X-ClickHouse-Format (for statements that return a
  result), X-ClickHouse-Query-Id, X-ClickHouse-Timezone, X-ClickHouse-Server-Display-Name.
* Errors: HTTP 500, ``X-ClickHouse-Exception-Code``, body ``Code: N. DB::Exception: …``.

Not implemented: sessions (``session_id`` is accepted and ignored: every request gets a
fresh chdb connection), external data, ClickHouse's own ``compress``/``decompress``
framing, ``client_protocol_version`` (clickhouse-connect then falls back to protocol 0,
as it does behind proxies), authentication (any user and password are accepted).
Statements run one at a time (a process-wide lock around the engine).
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import chdb

SERVER_NAME = "chhttp"

TRANSPORT_PARAMS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "session_id",
        "session_timeout",
        "session_check",
        "query_id",
        "compress",
        "decompress",
        "user",
        "password",
        "quota_key",
        "buffer_size",
        "wait_end_of_query",
        "client_protocol_version",
        "role",
        "enable_http_compression",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
    }
)

_INSERT_WITH_DATA = re.compile(
    rb"^\s*(INSERT\s+INTO\s.*?)\s+FORMAT\s+([A-Za-z0-9_]+)[ \t]*(?:\r?\n|$)",
    re.IGNORECASE | re.DOTALL,
)
_TRAILING_FORMAT = re.compile(r"\bFORMAT\s+([A-Za-z0-9_]+)\s*;?\s*$", re.IGNORECASE)
_LEADING_NOISE = re.compile(r"^(?:\s+|--[^\n]*\n|/\*.*?\*/|\()*", re.DOTALL)
_RESULT_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN"})
_CODE = re.compile(r"Code: (\d+)\.")
_SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class QueryFailed(Exception):
    """A ClickHouse error to send back: code and ``Code: N. DB::Exception: …`` text."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Request:
    """One decoded HTTP request: statement bytes, settings, parameters and options."""

    sql: bytes
    params: dict[str, str] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)


@dataclass
class Reply:
    """What to send: body, format (None for statements without a result) and summary."""

    body: bytes
    fmt: str | None
    summary: dict[str, str]


def engine_error(exc: Exception) -> QueryFailed:
    """A chdb exception as a ClickHouse error (its text from ``Code: `` on)."""
    text = str(exc)
    start = text.find("Code: ")
    text = text[start:] if start >= 0 else f"Code: 1001. DB::Exception: {text}"
    match = _CODE.search(text)
    return QueryFailed(text.strip(), int(match.group(1)) if match else 1001)


class Engine:
    """The chdb engine of this process, one data directory, one statement at a time."""

    def __init__(self, path: Path) -> None:
        self.path = str(path.resolve())
        path.mkdir(parents=True, exist_ok=True)
        self._keeper = chdb.connect(self.path)  # keeps the engine up between requests
        self._lock = threading.Lock()
        self.version, self.timezone = self._scalar_pair("SELECT version(), timezone()")
        # chdb's default is the server's default: responses are compressed unless turned off.
        self.compression_default, _ = self._scalar_pair(
            "SELECT toString(getSetting('enable_http_compression')), ''"
        )

    def close(self) -> None:
        with self._lock:
            self._keeper.close()

    def execute(self, request: Request) -> Reply:
        with self._lock:
            conn = chdb.connect(self.path)
            try:
                self._prepare(conn, request)
                insert = _INSERT_WITH_DATA.match(request.sql)
                if insert is not None:
                    return self._insert(conn, request, insert)
                return self._query(conn, request)
            finally:
                conn.close()

    def _scalar_pair(self, sql: str) -> tuple[str, str]:
        row = json.loads(self._keeper.query(sql, "JSONCompactEachRow").bytes())
        return str(row[0]), str(row[1])

    def _prepare(self, conn: Any, request: Request) -> None:
        database = request.options.get("database")
        for name, value in request.settings.items():
            if not _SETTING_NAME.match(name):
                raise QueryFailed(
                    f"Code: 115. DB::Exception: Unknown setting '{name}'. (UNKNOWN_SETTING)", 115
                )
            quoted = value.replace("\\", "\\\\").replace("'", "\\'")
            _run(conn, f"SET {name} = '{quoted}'", "TabSeparated")
        if database:
            _run(conn, f"USE `{database.replace('`', '``')}`", "TabSeparated")

    def _insert(self, conn: Any, request: Request, match: re.Match[bytes]) -> Reply:
        header = match.group(1).decode()
        fmt = match.group(2).decode()
        data = request.sql[match.end() :]
        started = time.monotonic()
        # chdb's streaming inserter reports success for a block the engine refused
        # (verified with code 252, too many partitions for one INSERT block: rows_written
        # 101, nothing stored), and one query of statement and data cuts binary data short;
        # the refusal is still counted in system.errors, so a count that grew is raised.
        before = _error_counts(conn)
        try:
            inserter = conn.send_insert(header, fmt)
            if data:
                inserter.append(data)
            result = inserter.finish()
        except Exception as exc:
            raise engine_error(exc) from exc
        _raise_new_errors(conn, before)
        summary = {
            "written_rows": str(result.rows_written),
            "written_bytes": str(result.bytes_written),
            "elapsed_ns": str(int((time.monotonic() - started) * 1e9)),
        }
        return Reply(b"", None, summary)

    def _query(self, conn: Any, request: Request) -> Reply:
        sql = request.sql.decode("utf-8", errors="surrogateescape")
        named = _TRAILING_FORMAT.search(sql)
        fmt = named.group(1) if named else request.options.get("default_format", "TabSeparated")
        result = _run(conn, sql, fmt, request.params)
        summary = {
            "read_rows": str(result.rows_read()),
            "read_bytes": str(result.bytes_read()),
            "elapsed_ns": str(int(result.elapsed() * 1e9)),
        }
        keyword = _LEADING_NOISE.sub("", sql, count=1).split(None, 1)
        returns_result = bool(keyword) and keyword[0].upper() in _RESULT_KEYWORDS
        return Reply(result.bytes() or b"", fmt if returns_result else None, summary)


_ERRORS_SQL = "SELECT code, name, value, last_error_message FROM system.errors WHERE NOT remote"


def _errors(conn: Any) -> dict[int, tuple[str, int, str]]:
    """code -> (name, count, last message) of the engine's error counters."""
    text = _run(conn, _ERRORS_SQL, "JSONCompactEachRow").bytes().decode()
    rows = [json.loads(line) for line in text.splitlines() if line]
    return {int(code): (name, int(count), message) for code, name, count, message in rows}


def _error_counts(conn: Any) -> dict[int, int]:
    return {code: count for code, (_, count, _) in _errors(conn).items()}


def _raise_new_errors(conn: Any, before: dict[int, int]) -> None:
    """Raise the error whose counter grew since ``before`` (a refusal chdb swallowed)."""
    for code, (name, count, message) in sorted(_errors(conn).items()):
        if count > before.get(code, 0):
            raise QueryFailed(f"Code: {code}. DB::Exception: {message}. ({name})", code)


def _run(conn: Any, sql: str, fmt: str, params: dict[str, str] | None = None) -> Any:
    try:
        return conn.query(sql, fmt, params=params or {})
    except Exception as exc:
        raise engine_error(exc) from exc


def decode_body(body: bytes, encoding: str) -> bytes:
    """Undo Content-Encoding; a body that does not decode is CANNOT_DECOMPRESS (271)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    try:
        return _decompress(body, encoding)
    except QueryFailed:
        raise
    except Exception as exc:
        raise QueryFailed(
            f"Code: 271. DB::Exception: Cannot decompress the {encoding} request body: "
            f"{exc}. (CANNOT_DECOMPRESS)",
            271,
        ) from exc


def _decompress(body: bytes, encoding: str) -> bytes:
    """lz4 and gzip bodies may be several frames/members (one per insert block)."""
    if encoding == "lz4":
        return _lz4_frames(body)
    if encoding == "gzip":
        return gzip.decompress(body)  # handles several members
    if encoding == "deflate":
        return zlib.decompress(body)
    if encoding == "zstd":
        from clickhouse_connect.driver.compression import _zstd_decompress

        return bytes(_zstd_decompress(body))
    if encoding == "br":
        import brotli  # type: ignore[import-not-found]

        return bytes(brotli.decompress(body))
    raise QueryFailed(
        f"Code: 1. DB::Exception: Unknown HTTP Content-Encoding {encoding}. (UNSUPPORTED_METHOD)",
        1,
    )


def _lz4_frames(body: bytes) -> bytes:
    import lz4.frame  # type: ignore[import-untyped]

    out = bytearray()
    rest = body
    while rest:
        decompressor = lz4.frame.LZ4FrameDecompressor()
        out += decompressor.decompress(rest)
        rest = decompressor.unused_data
    return bytes(out)


def encode_body(body: bytes, accept: str) -> tuple[bytes, str | None]:
    """Compress a response for the first encoding of lz4, gzip, deflate the client accepts."""
    accepted = {item.split(";")[0].strip().lower() for item in accept.split(",")}
    if "lz4" in accepted:
        import lz4.frame  # type: ignore[import-untyped]

        return bytes(lz4.frame.compress(body)), "lz4"
    if "gzip" in accepted:
        return gzip.compress(body), "gzip"
    if "deflate" in accepted:
        return zlib.compress(body), "deflate"
    return body, None


def parse_request(target: str, body: bytes, content_type: str) -> Request:
    """Split URL parameters into options, settings and bound parameters; join the statement."""
    query_string = urlsplit(target).query
    pairs = parse_qsl(query_string, keep_blank_values=True)
    if content_type.lower().startswith("multipart/form-data"):
        form_pairs, body = _form_fields(body, content_type)
        pairs.extend(form_pairs)
    request = Request(b"")
    url_query = ""
    for name, value in pairs:
        if name == "query":
            url_query = value
        elif name.startswith("param_"):
            request.params[name[len("param_") :]] = value
        elif name in TRANSPORT_PARAMS:
            request.options[name] = value
        else:
            request.settings[name] = value
    head = url_query.encode()
    request.sql = head + b"\n" + body if head and body else head or body
    return request


def _form_fields(body: bytes, content_type: str) -> tuple[list[tuple[str, str]], bytes]:
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    pairs = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if part.get_filename():
            raise QueryFailed(
                "Code: 48. DB::Exception: external data is not supported by this test "
                "endpoint. (NOT_IMPLEMENTED)",
                48,
            )
        payload = part.get_payload(decode=True)
        text = payload.decode() if isinstance(payload, bytes) else str(payload or "")
        pairs.append((str(name), text))
    return pairs, b""


class Handler(BaseHTTPRequestHandler):
    """One request: /ping, or a statement on /."""

    protocol_version = "HTTP/1.1"
    server: ChServer

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            encoding = self.headers.get("Content-Encoding", "-") if self.headers else "-"
            super().log_message(format + " body-encoding=%s", *args, encoding)

    def _handle(self) -> None:
        body = self._read_body()
        path = urlsplit(self.path).path
        if path == "/ping":
            self._send(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
            return
        if path != "/":
            self._send(404, f"There is no handle {path}\n".encode(), {})
            return
        query_id = ""
        try:
            body = decode_body(body, self.headers.get("Content-Encoding", ""))
            request = parse_request(self.path, body, self.headers.get("Content-Type", ""))
            query_id = request.options.get("query_id") or str(uuid.uuid4())
            if request.options.get("decompress") == "1":
                raise QueryFailed(
                    "Code: 48. DB::Exception: decompress=1 is not supported by this test "
                    "endpoint. (NOT_IMPLEMENTED)",
                    48,
                )
            if not request.sql.strip():
                raise QueryFailed("Code: 62. DB::Exception: Empty query. (SYNTAX_ERROR)", 62)
            reply = self.server.engine.execute(request)
        except QueryFailed as exc:
            self._send_error(exc, query_id or str(uuid.uuid4()))
            return
        except Exception as exc:  # answer like a server would, never drop the connection
            failed = QueryFailed(f"Code: 1001. DB::Exception: {exc!r}. (STD_EXCEPTION)", 1001)
            self._send_error(failed, query_id or str(uuid.uuid4()))
            return
        self._send_reply(reply, request, query_id)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        out = bytearray()
        while True:
            size_line = self.rfile.readline()
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += self.rfile.read(size)
            self.rfile.readline()

    def _send_reply(self, reply: Reply, request: Request, query_id: str) -> None:
        headers = self._common_headers(query_id)
        summary = {"read_rows": "0", "read_bytes": "0", "written_rows": "0", "written_bytes": "0"}
        summary.update(reply.summary)
        headers["X-ClickHouse-Summary"] = json.dumps(summary)
        body = reply.body
        if reply.fmt is not None:
            headers["X-ClickHouse-Format"] = reply.fmt
            headers["Content-Type"] = _content_type(reply.fmt)
        else:
            headers["Content-Type"] = "text/plain; charset=UTF-8"
        compression = request.options.get(
            "enable_http_compression", self.server.engine.compression_default
        )
        if body and compression in ("1", "true"):
            body, encoding = encode_body(body, self.headers.get("Accept-Encoding", ""))
            if encoding:
                headers["Content-Encoding"] = encoding
        self._send(200, body, headers)

    def _send_error(self, exc: QueryFailed, query_id: str) -> None:
        text = str(exc)
        if "(version " not in text:
            text = f"{text} (version {self.server.engine.version})"
        headers = self._common_headers(query_id)
        headers["X-ClickHouse-Exception-Code"] = str(exc.code)
        headers["Content-Type"] = "text/plain; charset=UTF-8"
        self._send(500, (text + "\n").encode(), headers)

    def _common_headers(self, query_id: str) -> dict[str, str]:
        return {
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": self.server.engine.timezone,
            "X-ClickHouse-Server-Display-Name": SERVER_NAME,
        }

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Keep-Alive", "timeout=10")
        self.end_headers()
        self.wfile.write(body)


def _content_type(fmt: str) -> str:
    if fmt.startswith(("TabSeparated", "TSV")):
        return "text/tab-separated-values; charset=UTF-8"
    if fmt.startswith("CSV"):
        return "text/csv; charset=UTF-8; header=absent"
    if fmt.startswith("JSON"):
        return "application/json; charset=UTF-8"
    return "application/octet-stream"


class ChServer(ThreadingHTTPServer):
    """The HTTP server with its engine."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], engine: Engine, *, verbose: bool) -> None:
        super().__init__(address, Handler)
        self.engine = engine
        self.verbose = verbose
