"""Limits on slow and numerous clients shared by the edge's two HTTP paths: the deadline
of a request head (``HeadDeadline``) and aiohttp's protocol with that deadline and the
connection count (``HeadDeadlineHandler``, the protocol a connection is handed off to)."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from aiohttp import web
from aiohttp.web_protocol import RequestHandler


class ConnectionLimits(Protocol):
    """What the limits report to: the deadline, and the counts (``CheckConnections``)."""

    @property
    def head_timeout_s(self) -> float: ...

    def closed(self) -> None: ...

    def head_timed_out(self) -> None: ...


class HeadDeadline:
    """The deadline of a connection's request head: started at its first byte (a start
    while running changes nothing), cancelled once the head is complete; when it passes,
    the connection is closed and counted."""

    __slots__ = ("_connections", "_timer")

    def __init__(self, connections: ConnectionLimits) -> None:
        self._connections = connections
        self._timer: asyncio.TimerHandle | None = None

    def start(self, transport: asyncio.BaseTransport) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self._connections.head_timeout_s, self._expired, transport
            )

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, transport: asyncio.BaseTransport) -> None:
        self._timer = None
        if not transport.is_closing():
            self._connections.head_timed_out()
            transport.close()


class HeadDeadlineHandler(RequestHandler):
    """aiohttp's own protocol, with the edge's limits: a request head not complete within
    ``head_timeout_s`` of its first byte closes the connection (aiohttp alone waits for
    it as long as bytes trickle in), and the connection counts towards
    ``CheckConnections.open`` until it is lost.

    The deadline starts when bytes arrive that complete no request while no body is being
    read, and ends when aiohttp has parsed a head."""

    def __init__(self, connections: ConnectionLimits, manager: web.Server) -> None:
        # As ``web.Server.__call__`` builds its handlers (its loop and handler arguments).
        super().__init__(manager, loop=manager._loop, **manager._kwargs)
        self._connections = connections
        self._deadline = HeadDeadline(connections)
        self._body: Any = None

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._deadline.cancel()
            self._body = self._messages[-1][1] if self._messages else None
        elif (
            data
            and self.transport is not None
            and not self._upgraded
            and self._payload_parser is None
            and (self._body is None or self._body.is_eof())
        ):
            self._deadline.start(self.transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._deadline.cancel()
        self._connections.closed()
        super().connection_lost(exc)
