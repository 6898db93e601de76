"""The fast path of GET /v1/check (pipeline.edge.fastpath): what it reads and what it hands
to aiohttp, answers identical to aiohttp's, pipelining, Connection: close, hand-off in the
middle of a connection, metrics, idle connections and shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import quote

import pytest
from aiohttp import web

from pipeline.edge import fastpath
from pipeline.edge.check_head import parse_head, parse_query
from pipeline.edge.fastpath import EdgeSite
from pipeline.edge.handlers import EDGE_KEY, create_app
from pipeline.edge.http_input import CHECK_FIELDS
from tests.unit.test_edge_service import FakeHealth
from tests.unit.test_edge_support import (
    ACCOUNT,
    MIN,
    PEER,
    T0,
    Clock,
    account_key,
    message,
    new_view,
)

TOKEN = "s3cret-edge-token"
WAIT_S = 5.0
CHECK = f"GET /v1/check?account={quote(ACCOUNT)}&ip={PEER} HTTP/1.1\r\nHost: edge\r\n\r\n"
ALLOWED = b'{"allowed":true,"retry_after_ms":0,"challenge":null,"step_up":false}'


# -- what the fast path reads -----------------------------------------------------------


def test_query_is_decoded_as_aiohttp_decodes_it() -> None:
    """Known names once each, values percent-decoded as UTF-8, empty values kept."""
    raw = b"account=al%C3%A9x%40example.com&ip=198.51.100.7&device=&flow=uia"
    assert parse_query(raw, CHECK_FIELDS) == {
        "account": "al\u00e9x@example.com",
        "ip": "198.51.100.7",
        "device": "",
        "flow": "uia",
    }
    assert parse_query(b"account=%zz%41&ip=x", CHECK_FIELDS) == {"account": "%zzA", "ip": "x"}


@pytest.mark.parametrize(
    "raw",
    [
        b"account=a+b&ip=x",  # aiohttp reads + as a space
        b"account=a&&ip=x",  # an empty pair
        b"account&ip=x",  # a name without a value
        b"account=a&acount=b",  # an unknown name
        b"account=a&account=b",  # a name twice
        b"account=%FF&ip=x",  # not UTF-8
        b"%61ccount=a&ip=x",  # an escaped name
    ],
)
def test_query_the_fast_path_does_not_read_exactly_is_handed_off(raw: bytes) -> None:
    """Every query the fast path cannot read exactly as aiohttp (or the handler would refuse)
    is None: aiohttp answers it."""
    assert parse_query(raw, CHECK_FIELDS) is None


def test_head_takes_the_query_the_token_and_connection_close() -> None:
    """Authorization and Connection: close are read; other headers are passed over."""
    head = parse_head(
        b"GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.1\r\nHost: edge\r\n"
        b"AUTHORIZATION:  Bearer t \r\nConnection: close\r\nAccept: */*",
        CHECK_FIELDS,
    )
    assert head is not None
    assert (head.query, head.authorization, head.close) == (
        {"account": "a", "ip": "192.0.2.1"},
        b"Bearer t",
        True,
    )


@pytest.mark.parametrize(
    "head",
    [
        b"POST /v1/check?account=a&ip=192.0.2.1 HTTP/1.1",
        b"GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.0",
        b"GET /v1/check HTTP/1.1",
        b"GET /v1/checks?account=a&ip=192.0.2.1 HTTP/1.1",
        b"GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.1\r\nContent-Length: 3",
        b"GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.1\r\nTransfer-Encoding: chunked",
        b"GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.1\r\nUpgrade: websocket",
        b"GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.1\r\nConnection: upgrade",
        b"GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.1\r\nHost: a\r\n folded",
        b"GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.1\r\nbad header: x",
        b"GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.1\r\nX: a\nY: b",
        b"GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.1\r\nAuthorization: a\r\nAuthorization: b",
        "GET /v1/check?account=\u00e9&ip=192.0.2.1 HTTP/1.1".encode(),
        b"GET /v1/check?account=a&ip=192.0.2.1#x HTTP/1.1",
        b"GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.1" + b"\r\nX: y" * 101,
    ],
)
def test_other_heads_are_handed_off(head: bytes) -> None:
    """Other methods, paths, versions, bodies, upgrades and odd header lines are None."""
    assert parse_head(head, CHECK_FIELDS) is None


# -- on a socket -----------------------------------------------------------------------


@dataclass
class Served:
    runner: web.AppRunner
    port: int
    clock: Clock

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)

    def aiohttp_requests(self) -> int:
        """Requests aiohttp's own protocol has handled (the fast path's are not counted)."""
        assert self.runner.server is not None
        return self.runner.server.requests_count


async def _serve(token: str | None = None) -> Served:
    clock = Clock()
    view = new_view(clock)
    view.apply(*message(account_key(), T0 + 10 * MIN))
    clock.now = T0 + 4 * MIN
    runner = web.AppRunner(create_app(view, FakeHealth(), token=token), access_log=None)
    await runner.setup()
    site = EdgeSite(runner, "127.0.0.1", 0, edge=runner.app[EDGE_KEY], known=CHECK_FIELDS)
    await site.start()
    return Served(runner, site.port, clock)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    harness = await _serve()
    try:
        yield harness
    finally:
        await harness.runner.cleanup()


async def _response(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One response: status line, headers (lowered names), body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    status, *lines = head[:-4].split(b"\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (x.partition(b":") for x in lines)}
    body = await asyncio.wait_for(reader.readexactly(int(headers[b"content-length"])), WAIT_S)
    return status, headers, body


async def test_pipelined_checks_are_answered_in_order_without_aiohttp(served: Served) -> None:
    """Three checks in one write get three answers in order; aiohttp handles none."""
    reader, writer = await served.connect()
    refused = CHECK
    allowed = CHECK.replace(quote(ACCOUNT), "bob")
    writer.write((refused + allowed + refused).encode())
    bodies = [(await _response(reader))[2] for _ in range(3)]
    refused_body = b'{"allowed":false,"retry_after_ms":360000,"challenge":null,"step_up":false}'
    assert bodies == [refused_body, ALLOWED, refused_body]
    assert served.aiohttp_requests() == 0
    writer.close()


async def test_answers_are_aiohttps_answers(served: Served) -> None:
    """The fast path's status line, headers (but Date) and body equal aiohttp's for the same
    check (sent again with a trailing '+', which only aiohttp reads: a space, trimmed)."""
    reader, writer = await served.connect()
    writer.write(CHECK.encode())
    fast = await _response(reader)
    writer.write(CHECK.replace(quote(ACCOUNT), quote(ACCOUNT) + "+").encode())
    slow = await _response(reader)
    assert served.aiohttp_requests() == 1
    assert (
        (fast[0], fast[2])
        == (slow[0], slow[2])
        == (
            b"HTTP/1.1 200 OK",
            b'{"allowed":false,"retry_after_ms":360000,"challenge":null,"step_up":false}',
        )
    )
    assert {k: v for k, v in fast[1].items() if k != b"date"} == {
        k: v for k, v in slow[1].items() if k != b"date"
    }
    assert set(fast[1]) == {b"content-type", b"content-length", b"date", b"server"}
    writer.close()


async def test_other_requests_hand_the_connection_to_aiohttp(served: Served) -> None:
    """A /healthz after a check on one connection is aiohttp's, and so is what follows."""
    reader, writer = await served.connect()
    writer.write((CHECK + "GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n" + CHECK).encode())
    first, health, last = [await _response(reader) for _ in range(3)]
    assert (first[2], health[2], last[2]) == (
        b'{"allowed":false,"retry_after_ms":360000,"challenge":null,"step_up":false}',
        b'{"status":"ok"}',
        b'{"allowed":false,"retry_after_ms":360000,"challenge":null,"step_up":false}',
    )
    assert served.aiohttp_requests() == 2
    writer.write(b"GET /v1/check?account=bob&ip=bad HTTP/1.1\r\nHost: edge\r\n\r\n")
    status, _, body = await _response(reader)
    assert status == b"HTTP/1.1 400 Bad Request"
    assert b'"parameter":"ip"' in body
    writer.close()


async def test_a_head_split_over_writes_is_read_whole(served: Served) -> None:
    """A request arriving in pieces is answered once it is complete."""
    reader, writer = await served.connect()
    raw = CHECK.encode()
    for piece in (raw[:7], raw[7:30], raw[30:]):
        writer.write(piece)
        await writer.drain()
    assert (await _response(reader))[
        2
    ] == b'{"allowed":false,"retry_after_ms":360000,"challenge":null,"step_up":false}'
    assert served.aiohttp_requests() == 0
    writer.close()


async def test_a_head_over_the_limit_is_aiohttps_to_refuse(served: Served) -> None:
    """A check whose head is longer than aiohttp's limits is not answered by the fast path:
    aiohttp refuses it with a 400."""
    reader, writer = await served.connect()
    writer.write(CHECK.replace("Host: edge", "Host: edge\r\nX-Long: " + "x" * 9000).encode())
    status = await asyncio.wait_for(reader.readline(), WAIT_S)
    assert status.endswith(b" 400 Bad Request\r\n"), status
    writer.close()


async def test_connection_close_is_answered_then_closed(served: Served) -> None:
    """Connection: close gets its answer with Connection: close, then the end of stream."""
    reader, writer = await served.connect()
    writer.write(CHECK.replace("Host: edge", "Host: edge\r\nConnection: close").encode())
    _, headers, body = await _response(reader)
    assert (headers[b"connection"], body) == (
        b"close",
        b'{"allowed":false,"retry_after_ms":360000,"challenge":null,"step_up":false}',
    )
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
    writer.close()


async def test_fast_answers_are_counted_and_refusals_logged(served: Served) -> None:
    """The fast path counts requests and check results as the aiohttp handler does."""
    reader, writer = await served.connect()
    writer.write((CHECK + CHECK.replace(quote(ACCOUNT), "bob")).encode())
    await _response(reader)
    await _response(reader)
    text = served.runner.app[EDGE_KEY].metrics.render().decode()
    for line in (
        'authpipe_edge_http_requests_total{endpoint="/v1/check",status="200"} 2.0',
        'authpipe_edge_checks_total{result="block"} 1.0',
        'authpipe_edge_checks_total{result="allowed"} 1.0',
        'authpipe_edge_http_request_seconds_count{endpoint="/v1/check"} 2.0',
    ):
        assert line in text, line
    writer.close()


async def test_token_is_checked_on_the_fast_path() -> None:
    """With a token, a check without it is aiohttp's 401; with it, the fast path's 200."""
    harness = await _serve(TOKEN)
    try:
        reader, writer = await harness.connect()
        writer.write(
            CHECK.replace("Host: edge", f"Host: edge\r\nAuthorization: Bearer {TOKEN}").encode()
        )
        assert (await _response(reader))[0] == b"HTTP/1.1 200 OK"
        assert harness.aiohttp_requests() == 0
        writer.write(CHECK.encode())
        assert (await _response(reader))[0] == b"HTTP/1.1 401 Unauthorized"
        writer.close()
    finally:
        await harness.runner.cleanup()


async def test_idle_connections_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection idle past the keep-alive timeout is closed by the sweep."""
    monkeypatch.setattr(fastpath, "KEEPALIVE_TIMEOUT_S", 0.05)
    monkeypatch.setattr(fastpath, "SWEEP_INTERVAL_S", 0.05)
    harness = await _serve()
    try:
        reader, writer = await harness.connect()
        writer.write(CHECK.encode())
        await _response(reader)
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        writer.close()
    finally:
        await harness.runner.cleanup()


async def test_shutdown_closes_fast_path_connections() -> None:
    """Cleaning up the runner ends the fast path's keep-alive connections."""
    harness = await _serve()
    reader, writer = await harness.connect()
    writer.write(CHECK.encode())
    await _response(reader)
    await harness.runner.cleanup()
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
    writer.close()
