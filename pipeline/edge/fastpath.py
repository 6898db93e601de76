"""The fast path of ``GET /v1/check``: answered on the connection, without aiohttp.

``EdgeSite`` listens like aiohttp's ``TCPSite``, but each connection starts on a
``CheckConnection``, a small HTTP/1.1 protocol that answers the one request gateways send
thousands of times a second, a well-formed ``GET /v1/check`` to a ready view, with the
same answer, status, headers, metrics and refusal log as the aiohttp handler. The first
request on a connection that is anything else (another path or method, a body, HTTP/1.0,
a header or query it does not read exactly as aiohttp would, a missing or wrong token,
a parameter the handler would answer 400, a view not ready yet) hands the connection,
with every byte not yet answered, to aiohttp's own protocol, which then serves it to the
end; so every error and every other endpoint is aiohttp's, unchanged.

Why: aiohttp spends 180-280 us of CPU per check request on this machine (request and
response objects, the middleware chain, header multidicts, ``write_eof``); at 2,000
requests/s that is half a core, and on two shared cores the queueing that follows is
the latency tail. The fast path costs a few tens of microseconds.

What the fast path reads, strictly (anything outside it is handed off, not refused):

* a head of at most ``HEAD_MAX_BYTES`` with at most ``HEADERS_MAX`` header lines;
* a request line ``GET /v1/check?<query> HTTP/1.1``, the query printable ASCII;
* header lines ``name: value`` with a token name, no folding, no ``Transfer-Encoding``,
  ``Upgrade`` or ``Expect``, ``Content-Length`` at most ``0``, at most one
  ``Authorization`` and ``Connection``; ``Connection: close`` closes after the answer;
* a query of ``name=value`` pairs joined by ``&``, names without escapes, values
  percent-decoded as UTF-8 (no ``+``: aiohttp reads it as a space, so it is handed off).

Idle connections (no byte for ``KEEPALIVE_TIMEOUT_S``, as aiohttp's keep-alive timeout)
are closed by a sweep every ``SWEEP_INTERVAL_S``.
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE

if TYPE_CHECKING:
    from pipeline.edge.service import Edge

HEAD_MAX_BYTES = 8190
"""A request head longer than this goes to aiohttp (its line and field limits are 8190)."""
HEADERS_MAX = 100
KEEPALIVE_TIMEOUT_S = 75.0
SWEEP_INTERVAL_S = 15.0
_TOKEN_CHARS = frozenset(
    b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
_HANDED_OFF_HEADERS = frozenset({b"transfer-encoding", b"upgrade", b"expect"})
_SERVER = SERVER_SOFTWARE.encode()


def parse_query(raw: bytes, known: frozenset[str]) -> dict[str, str] | None:
    """The query's parameters as aiohttp would read them, or None where the fast path does
    not read it exactly so (empty pairs, a pair without ``=``, ``+``, escapes that are not
    UTF-8) or the handler would refuse it (a name not in ``known``, a name given twice)."""
    if b"+" in raw:
        return None
    params: dict[str, str] = {}
    try:
        for pair in raw.split(b"&"):
            name_bytes, sep, value = pair.partition(b"=")
            name = name_bytes.decode("ascii")
            if not sep or name not in known or name in params:
                return None
            params[name] = (unquote_to_bytes(value) if b"%" in value else value).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return params


class _Head:
    """What the fast path takes from a request head (``parse_head``)."""

    __slots__ = ("authorization", "close", "query")

    def __init__(self, query: dict[str, str], authorization: bytes | None, close: bool) -> None:
        self.query = query
        self.authorization = authorization
        self.close = close


_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
_VALUE = rb"[^\x00-\x08\x0a-\x1f\x7f]*"
_HEAD = re.compile(rb"GET /v1/check\?([!\x22$-~]+) HTTP/1\.1((?:\r\n%s:%s)*)" % (_TOKEN, _VALUE))
"""The heads the fast path reads: the request line (a query of printable ASCII without
'#'), then header lines of a token name, a
colon and a value without control characters but tab (so no folded lines, no bare CR or
LF); the query and the header lines are its groups."""
_NOTABLE = re.compile(
    rb"\n(?:transfer-encoding|upgrade|expect|content-length|authorization|connection):", re.I
)
"""The headers the fast path must look at."""


def parse_head(head: bytes, known: frozenset[str]) -> _Head | None:
    """A ``GET /v1/check`` head (without its blank line), or None for any other."""
    match = _HEAD.fullmatch(head)
    if match is None:
        return None
    query = parse_query(match[1], known)
    if query is None:
        return None
    lines = match[2]
    if lines.count(b"\n") > HEADERS_MAX:
        return None
    if _NOTABLE.search(lines) is None:
        return _Head(query, None, False)  # the common case: nothing to look at
    authorization: bytes | None = None
    connection: bytes | None = None
    for line in lines.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name, value = name.lower(), value.strip(b" \t")
        if name in _HANDED_OFF_HEADERS:
            return None
        if name == b"content-length":
            if value != b"0":
                return None
        elif name == b"authorization":
            if authorization is not None:
                return None
            authorization = value
        elif name == b"connection":
            if connection is not None:
                return None
            connection = value.lower()
    close = connection is not None and b"close" in connection
    if connection is not None and not close and connection != b"keep-alive":
        return None  # e.g. "Upgrade": aiohttp's to judge
    return _Head(query, authorization, close)


class _Date:
    """The ``Date`` header's value, formatted once per second (as aiohttp does)."""

    __slots__ = ("second", "value")

    def __init__(self) -> None:
        self.second = -1
        self.value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self.second:
            self.second = second
            self.value = email.utils.formatdate(second, usegmt=True).encode()
        return self.value


def response(body: bytes, date: bytes, close: bool) -> bytes:
    """A 200 with a JSON body, headed as aiohttp heads it."""
    return b"".join((
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ",
        str(len(body)).encode(), b"\r\nDate: ", date, b"\r\nServer: ", _SERVER,
        b"\r\nConnection: close\r\n\r\n" if close else b"\r\n\r\n", body,
    ))  # fmt: skip


class CheckConnections:
    """The protocol factory of an ``EdgeSite``: makes ``CheckConnection``s, keeps the live
    ones (to close them at shutdown) and sweeps out idle ones."""

    def __init__(
        self, edge: Edge, fallback: Callable[[], asyncio.Protocol], known: frozenset[str]
    ) -> None:
        self.edge = edge
        self.known = known
        self.fallback = fallback
        self.live: set[CheckConnection] = set()
        self.date = _Date()
        self._sweep: asyncio.TimerHandle | None = None

    def __call__(self) -> CheckConnection:
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(SWEEP_INTERVAL_S, self.sweep)
        return CheckConnection(self)

    def sweep(self) -> None:
        """Close connections idle for longer than the keep-alive timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() - KEEPALIVE_TIMEOUT_S
        for connection in [c for c in self.live if c.last_data_s < deadline]:
            connection.close()
        self._sweep = loop.call_later(SWEEP_INTERVAL_S, self.sweep)

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for connection in list(self.live):
            connection.close()


class CheckConnection(asyncio.Protocol):
    """One connection: fast-path answers until the first request that is not for it."""

    __slots__ = ("_buffer", "_connections", "_loop", "_transport", "last_data_s")

    def __init__(self, connections: CheckConnections) -> None:
        self._connections = connections
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._loop = asyncio.get_running_loop()
        self.last_data_s = self._loop.time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._connections.live.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.live.discard(self)
        self._transport = None

    def pause_writing(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()  # the client is not reading: stop serving it

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        self.last_data_s = self._loop.time()
        buffer = self._buffer + data if self._buffer else data
        answers: list[bytes] = []
        close = False
        connections = self._connections
        edge = connections.edge
        while True:
            head_end = buffer.find(b"\r\n\r\n")
            if head_end < 0 and len(buffer) <= HEAD_MAX_BYTES:
                break
            if head_end < 0 or head_end > HEAD_MAX_BYTES:
                self._hand_off(answers, buffer)
                return
            head = parse_head(buffer[:head_end], connections.known)
            body = None
            if head is not None:
                body = edge.quick_check(head.query, head.authorization)
            if body is None:
                self._hand_off(answers, buffer)
                return
            answers.append(response(body, connections.date.now(), head.close))  # type: ignore[union-attr]
            buffer = buffer[head_end + 4 :]
            if head.close:  # type: ignore[union-attr]
                close = True
                buffer = b""
                break
        self._buffer = buffer
        transport = self._transport
        if transport is None:
            return
        if answers:
            transport.write(answers[0] if len(answers) == 1 else b"".join(answers))
        if close:
            transport.close()

    def _hand_off(self, answers: list[bytes], unanswered: bytes) -> None:
        """Give the connection to aiohttp, after writing the answers already made."""
        transport = self._transport
        self._connections.live.discard(self)
        self._transport = None
        self._buffer = b""
        if transport is None or transport.is_closing():
            return
        if answers:
            transport.write(b"".join(answers))
        protocol = self._connections.fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocol.data_received(unanswered)


class EdgeSite(web.BaseSite):
    """A TCP site of an edge app (``create_app``) whose connections start on the fast path
    (see the module docstring); everything else is served by the runner's aiohttp server."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str | None,
        port: int,
        *,
        backlog: int = 128,
        reuse_port: bool | None = None,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._edge_runner = runner
        self._host = host
        self._requested_port = port
        self._edge_backlog = backlog
        self._reuse_port = reuse_port
        self._connections: CheckConnections | None = None
        self.port = port

    @property
    def name(self) -> str:
        return f"http://{self._host or '0.0.0.0'}:{self.port}"

    async def start(self) -> None:
        from pipeline.edge.service import CHECK_FIELDS, EDGE_KEY

        await super().start()
        server = self._edge_runner.server
        assert server is not None  # BaseSite refuses a runner that was not set up
        edge = self._edge_runner.app[EDGE_KEY]
        self._connections = CheckConnections(edge, server, CHECK_FIELDS)
        self._server = listener = await asyncio.get_running_loop().create_server(
            self._connections, self._host, self._requested_port,
            backlog=self._edge_backlog, reuse_port=self._reuse_port,
        )  # fmt: skip
        sockets: Any = listener.sockets
        self.port = int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        await super().stop()  # closes the listening socket (``_server``, as TCPSite sets it)
        if self._connections is not None:
            self._connections.close()
