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

Invariant: a client cannot tell the two paths apart. Every answer the fast path writes is
byte for byte aiohttp's (but ``Date``, formatted once a second as aiohttp does), counted
and logged alike; what it does not read exactly as aiohttp would is handed off, never
refused. What each path costs per request is measured in bench/README.md (B4).

The fast path knows the handlers only through the ``Edge`` protocol below (the service
passes its ``pipeline.edge.handlers.Edge``): it imports nothing of the service. Which
heads it reads, and how strictly, is ``pipeline.edge.check_head``.

Idle connections (no byte for ``KEEPALIVE_TIMEOUT_S``, as aiohttp's keep-alive timeout)
are closed by a sweep every ``SWEEP_INTERVAL_S``. Hostile clients are bounded on both
paths: a request head must be complete ``head_timeout_s`` (10 s) after its first byte,
or after the connection opened for its first request (a trickle of bytes does not extend
it; idle time between requests does not count), and at most ``max_connections`` connections are
open at once (fast path and handed off together; further ones are closed at once). A
connection handed off keeps its write flow control: aiohttp's protocol is installed
before the answers already made are written.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE

from pipeline.edge.check_head import HEAD_MAX_BYTES, parse_head
from pipeline.edge.slowclients import HeadDeadline, HeadDeadlineHandler


class Counters(Protocol):
    def connection_refused(self) -> None: ...
    def head_timeout(self) -> None: ...


class Edge(Protocol):
    """What the fast path needs of the edge's handlers (``pipeline.edge.handlers.Edge``):
    the check itself, answered as body bytes (None: hand the request to aiohttp), and the
    metrics it counts into."""

    @property
    def metrics(self) -> Counters: ...

    def quick_check(
        self, query: Mapping[str, str], authorization: bytes | None
    ) -> bytes | None: ...


HEAD_TIMEOUT_S = 10.0
"""A request head must be complete this long after its first byte (``edge.head_timeout_s``)."""
MAX_CONNECTIONS = 10_000
"""Open connections at most (``edge.max_connections``); further ones are closed at once."""
KEEPALIVE_TIMEOUT_S = 75.0
SWEEP_INTERVAL_S = 15.0
_SERVER = SERVER_SOFTWARE.encode()


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
    return b"".join(
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ",
            str(len(body)).encode(),
            b"\r\nDate: ",
            date,
            b"\r\nServer: ",
            _SERVER,
            b"\r\nConnection: close\r\n\r\n" if close else b"\r\n\r\n",
            body,
        )
    )


class CheckConnections:
    """The protocol factory of an ``EdgeSite``: makes ``CheckConnection``s, keeps the live
    ones (to close them at shutdown), sweeps out idle ones, counts every open connection
    (fast path and handed off) against ``max_connections`` and closes the ones over it."""

    def __init__(
        self,
        edge: Edge,
        server: web.Server,
        known: frozenset[str],
        *,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.edge = edge
        self.known = known
        self.server = server
        self.head_timeout_s = head_timeout_s
        self.max_connections = max_connections
        self.live: set[CheckConnection] = set()
        self.open = 0
        self.date = _Date()
        self._sweep: asyncio.TimerHandle | None = None

    def __call__(self) -> CheckConnection:
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(SWEEP_INTERVAL_S, self.sweep)
        return CheckConnection(self)

    def fallback(self) -> HeadDeadlineHandler:
        """aiohttp's protocol for a connection the fast path hands off."""
        return HeadDeadlineHandler(self, self.server)

    def admit(self) -> bool:
        """Count a new connection; False (and counted as refused) when over the cap."""
        if self.open >= self.max_connections:
            self.edge.metrics.connection_refused()
            return False
        self.open += 1
        return True

    def closed(self) -> None:
        self.open -= 1

    def head_timed_out(self) -> None:
        self.edge.metrics.head_timeout()

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

    __slots__ = ("_buffer", "_connections", "_deadline", "_loop", "_transport", "last_data_s")

    def __init__(self, connections: CheckConnections) -> None:
        self._connections = connections
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._loop = asyncio.get_running_loop()
        self._deadline = HeadDeadline(connections)
        self.last_data_s = self._loop.time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._connections.admit():
            # Over the cap: no answer, nothing buffered (connection_lost follows).
            transport.abort()  # type: ignore[attr-defined]
            return
        self._transport = transport  # type: ignore[assignment]
        self._connections.live.add(self)
        self._deadline.start(transport)  # the first head is due from the connection's start

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.cancel()
        if self._transport is not None:
            self._connections.closed()
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
            if head is not None and not (head.close and len(buffer) > head_end + 4):
                # (aiohttp refuses a request followed by data after Connection: close)
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
        # The head deadline runs from the first byte of a head until the head is complete.
        if answers or not buffer:
            self._deadline.cancel()
        if buffer:
            self._deadline.start(transport)
        if answers:
            transport.write(answers[0] if len(answers) == 1 else b"".join(answers))
        if close:
            transport.close()

    def _hand_off(self, answers: list[bytes], unanswered: bytes) -> None:
        """Give the connection to aiohttp, then write the answers already made.

        The protocol is switched before writing, so a pause of writing that the answers
        cause (the client reads slowly) reaches aiohttp's protocol, which then holds its
        own writes until the transport resumes it (flow control kept across the switch)."""
        transport = self._transport
        self._deadline.cancel()
        self._connections.live.discard(self)
        self._transport = None
        self._buffer = b""
        if transport is None or transport.is_closing():
            if transport is not None:
                self._connections.closed()
            return
        protocol = self._connections.fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if answers:
            transport.write(b"".join(answers))
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
        edge: Edge,
        known: frozenset[str],
        backlog: int = 128,
        reuse_port: bool | None = None,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._edge = edge
        self._known = known
        self._head_timeout_s = head_timeout_s
        self._max_connections = max_connections
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
        await super().start()
        server = self._edge_runner.server
        assert server is not None  # BaseSite refuses a runner that was not set up
        self._connections = CheckConnections(
            self._edge,
            server,
            self._known,
            head_timeout_s=self._head_timeout_s,
            max_connections=self._max_connections,
        )
        self._server = listener = await asyncio.get_running_loop().create_server(
            self._connections,
            self._host,
            self._requested_port,
            backlog=self._edge_backlog,
            reuse_port=self._reuse_port,
        )
        sockets: Any = listener.sockets
        self.port = int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        await super().stop()  # closes the listening socket (``_server``, as TCPSite sets it)
        if self._connections is not None:
            self._connections.close()
