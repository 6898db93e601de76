"""The edge's HTTP paths under hostile clients (issue 15 #8, #10, #11): a deadline for
request heads and a cap on connections on the fast path and aiohttp's, write flow control
kept across the hand-off, and a hand-off wherever the fast path would read a request
differently from aiohttp (checked by a bounded differential fuzz against aiohttp's parser)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import quote

import pytest
from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser, HttpRequestParserPy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.edge.check_head import parse_head
from pipeline.edge.fastpath import CheckConnections, EdgeSite
from pipeline.edge.handlers import EDGE_KEY, create_app
from pipeline.edge.http_input import CHECK_FIELDS
from pipeline.settings import Settings
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

WAIT_S = 5.0
CHECK = f"GET /v1/check?account={quote(ACCOUNT)}&ip={PEER} HTTP/1.1\r\nHost: edge\r\n\r\n"
HEALTH = "GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n"
REFUSED = b'{"allowed":false,"retry_after_ms":360000,"challenge":null,"step_up":false}'


@dataclass
class Site:
    runner: web.AppRunner
    site: EdgeSite

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.site.port)

    @property
    def connections(self) -> CheckConnections:
        connections = self.site._connections
        assert connections is not None
        return connections

    def metric(self, name: str) -> float:
        text = self.runner.app[EDGE_KEY].metrics.render().decode()
        return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[-1])


async def _site(**limits: float) -> Site:
    clock = Clock()
    view = new_view(clock)
    view.apply(*message(account_key(), T0 + 10 * MIN))
    clock.now = T0 + 4 * MIN
    runner = web.AppRunner(create_app(view, FakeHealth()), access_log=None)
    await runner.setup()
    site = EdgeSite(runner, "127.0.0.1", 0, edge=runner.app[EDGE_KEY], known=CHECK_FIELDS, **limits)  # type: ignore[arg-type]
    await site.start()
    return Site(runner, site)


@pytest.fixture
async def slow_heads() -> AsyncIterator[Site]:
    harness = await _site(head_timeout_s=0.4)
    try:
        yield harness
    finally:
        await harness.runner.cleanup()


async def _response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    status, *lines = head[:-4].split(b"\r\n")
    length = next(
        int(v) for n, _, v in (x.partition(b":") for x in lines) if n.lower() == b"content-length"
    )
    return status, await asyncio.wait_for(reader.readexactly(length), WAIT_S)


async def _trickle_until_closed(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes
) -> int:
    """Send ``raw`` one byte every 50 ms until the server closes; the bytes it took."""
    for sent, byte in enumerate(raw):
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except ConnectionError:
            return sent
        try:
            if await asyncio.wait_for(reader.read(1), 0.05) == b"":
                return sent + 1
        except TimeoutError:
            continue
    return len(raw)


# -- 8: the head deadline and the connection cap -------------------------------------------------


async def test_a_slow_head_on_the_fast_path_is_closed_at_the_deadline(slow_heads: Site) -> None:
    """Issue 15 #8: a head trickled a byte every 50 ms is closed about head_timeout_s after
    its first byte, although every byte refreshes the idle clock; counted in metrics."""
    reader, writer = await slow_heads.connect()
    raw = (CHECK.replace("Host: edge", "Host: edge\r\nX-Pad: " + "p" * 200)).encode()
    started = asyncio.get_running_loop().time()
    sent = await _trickle_until_closed(reader, writer, raw)
    assert sent < len(raw)
    assert asyncio.get_running_loop().time() - started < 0.4 + 3.0
    assert slow_heads.metric("authpipe_edge_head_timeouts_total") == 1.0
    writer.close()


async def test_a_connection_that_sends_nothing_is_closed_at_the_deadline(
    slow_heads: Site,
) -> None:
    """Issue 15 #8: the first head is due head_timeout_s after the connection opened."""
    reader, writer = await slow_heads.connect()
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
    assert slow_heads.metric("authpipe_edge_head_timeouts_total") == 1.0
    writer.close()


async def test_idle_time_between_requests_is_not_a_slow_head(slow_heads: Site) -> None:
    """After an answer, the connection may idle past head_timeout_s (the keep-alive timeout
    governs that); the next head is timed from its first byte."""
    reader, writer = await slow_heads.connect()
    writer.write(CHECK.encode())
    assert (await _response(reader))[1] == REFUSED
    await asyncio.sleep(0.8)  # twice the head deadline, idle
    writer.write(CHECK.encode())
    assert (await _response(reader))[1] == REFUSED
    assert slow_heads.metric("authpipe_edge_head_timeouts_total") == 0.0
    writer.close()


async def test_a_slow_head_after_a_hand_off_is_closed_at_the_deadline(slow_heads: Site) -> None:
    """Issue 15 #8: on a connection aiohttp serves (after /healthz), a trickled head is
    closed at the deadline too."""
    reader, writer = await slow_heads.connect()
    writer.write(HEALTH.encode())
    assert (await _response(reader))[0] == b"HTTP/1.1 200 OK"
    raw = HEALTH.replace("Host: edge", "Host: edge\r\nX-Pad: " + "p" * 200).encode()
    sent = await _trickle_until_closed(reader, writer, raw)
    assert sent < len(raw)
    assert slow_heads.metric("authpipe_edge_head_timeouts_total") == 1.0
    writer.close()


async def test_a_slow_body_is_not_a_slow_head(slow_heads: Site) -> None:
    """The deadline is for heads: a POST whose body arrives slowly (after a complete head)
    is answered."""
    reader, writer = await slow_heads.connect()
    body = f'{{"account": "{ACCOUNT}", "ip": "{PEER}"}}'.encode()
    writer.write(
        f"POST /v1/check HTTP/1.1\r\nHost: edge\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    )
    for start in range(0, len(body), len(body) // 6 + 1):
        writer.write(body[start : start + len(body) // 6 + 1])
        await writer.drain()
        await asyncio.sleep(0.15)  # the body takes about 1 s: longer than the head deadline
    status, answer = await _response(reader)
    assert (status, answer) == (b"HTTP/1.1 200 OK", REFUSED)
    assert slow_heads.metric("authpipe_edge_head_timeouts_total") == 0.0
    writer.close()


async def test_connections_over_the_cap_are_closed_at_once() -> None:
    """Issue 15 #8: with max_connections=2 (one on the fast path, one handed off to
    aiohttp) a third connection is closed unanswered; once one closes, a new one is served."""
    harness = await _site(max_connections=2)
    try:
        fast_reader, fast_writer = await harness.connect()
        fast_writer.write(CHECK.encode())
        assert (await _response(fast_reader))[1] == REFUSED
        slow_reader, slow_writer = await harness.connect()
        slow_writer.write(HEALTH.encode())
        assert (await _response(slow_reader))[0] == b"HTTP/1.1 200 OK"
        reader, writer = await harness.connect()
        writer.write(CHECK.encode())
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await _response(reader)
        assert harness.metric("authpipe_edge_connections_refused_total") == 1.0
        slow_writer.close()
        async with asyncio.timeout(WAIT_S):
            while harness.connections.open > 1:
                await asyncio.sleep(0.01)
        reader, writer = await harness.connect()
        writer.write(CHECK.encode())
        assert (await _response(reader))[1] == REFUSED
        writer.close()
        fast_writer.close()
    finally:
        await harness.runner.cleanup()


def test_edge_settings_carry_the_limits() -> None:
    """edge.head_timeout_s (default 10 s) and edge.max_connections are settings."""
    edge = Settings().edge
    assert (edge.head_timeout_s, edge.max_connections) == (10.0, 10_000)


# -- 10: flow control across the hand-off -------------------------------------------------------


async def test_a_pause_of_writing_at_hand_off_reaches_aiohttps_protocol() -> None:
    """Issue 15 #10: answers written at the hand-off that fill the transport's buffer pause
    aiohttp's protocol (which then holds its writes), and its resume arrives where the pause
    did; every answer reaches the client once it reads."""
    harness = await _site()
    loop = asyncio.get_running_loop()
    errors: list[object] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    server_sock, client_sock = socket.socketpair()
    try:
        server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        client_sock.setblocking(False)
        transport, protocol = await loop.connect_accepted_socket(harness.connections, server_sock)
        transport.set_write_buffer_limits(high=4096)
        protocol.data_received((CHECK * 300 + HEALTH).encode())
        handler = transport.get_protocol()
        assert isinstance(handler, BaseProtocol) and handler is not protocol
        assert handler.writing_paused is True
        received = b""
        async with asyncio.timeout(WAIT_S):
            while received.count(b"HTTP/1.1 200 OK") < 301:
                received += await loop.sock_recv(client_sock, 1 << 16)
        assert received.count(REFUSED) == 300 and received.endswith(b'{"status":"ok"}')
        assert handler.writing_paused is False
        assert errors == []
        transport.close()
    finally:
        client_sock.close()
        loop.set_exception_handler(None)
        await harness.runner.cleanup()


# -- 11: where the fast path and aiohttp would disagree, hand off ----------------------------------


_LINE = "GET /v1/check?account=a&ip=192.0.2.1 HTTP/1.1"


@pytest.mark.parametrize(
    "lines",
    [
        [],  # no Host: aiohttp answers 400
        ["Host: a", "host: b"],
        ["Host: a", "Content-Length: 0", "Content-Length: 0"],
        ["Host: a", "Content-Type: text/plain", "content-type: text/plain"],
        ["Host: a", "User-Agent: x", "User-Agent: y"],
        ["Host: a", "Proxy-Connection: close"],
        ["Host: a", "Proxy-Connection: keep-alive"],
        ["Host: a", "Connection: closed"],
        ["Host: a", "Connection: close, upgrade"],
        ["Host: a", "Connection: close", "Connection: close"],
    ],
)
def test_heads_aiohttp_reads_differently_are_handed_off(lines: list[str]) -> None:
    """Issue 15 #11: missing or duplicate Host, a duplicate singleton header (Content-Length:
    0 too), Proxy-Connection, and Connection values other than close/keep-alive: None."""
    assert parse_head("\r\n".join([_LINE, *lines]).encode(), CHECK_FIELDS) is None


def test_connection_tokens_are_read_as_aiohttp_reads_them() -> None:
    """Connection: Close and ' keep-alive ' are read; close is honoured."""
    head = parse_head(f"{_LINE}\r\nHost: a\r\nConnection: Close".encode(), CHECK_FIELDS)
    assert head is not None and head.close is True
    head = parse_head(f"{_LINE}\r\nHost: a\r\nConnection:  keep-alive ".encode(), CHECK_FIELDS)
    assert head is not None and head.close is False


async def test_data_after_connection_close_is_aiohttps_to_refuse() -> None:
    """A request after one with Connection: close (in the same write) goes to aiohttp,
    which refuses the pair with a 400, as it would without the fast path."""
    harness = await _site()
    try:
        reader, writer = await harness.connect()
        writer.write(
            (CHECK.replace("Host: edge", "Host: edge\r\nConnection: close") + CHECK).encode()
        )
        status, _ = await _response(reader)
        assert status.endswith(b" 400 Bad Request")
        writer.close()
    finally:
        await harness.runner.cleanup()


_NAMES = st.sampled_from(
    [
        "Accept",
        "Accept",
        "X-Forwarded-For",
        "Authorization",
        "Connection",
        "connection",
        "User-Agent",
        "Host",
        "host",
        "Content-Length",
        "content-length",
        "Content-Type",
        "Proxy-Connection",
        "Transfer-Encoding",
        "Upgrade",
        "Expect",
        "ETag",
        "Server",
        "Max-Forwards",
        "Content-Location",
        "Content-Range",
        "X-Host",
        "Host ",
        "Ho st",
    ]
)
_VALUES = st.sampled_from(
    [
        "edge",
        "*/*",
        "0",
        "0",
        "close",
        "keep-alive",
        "",
        "00",
        "1",
        " 0 ",
        "-0",
        "Close",
        "closed",
        "close, keep-alive",
        "keep-alive, close",
        "upgrade",
        "Upgrade, close",
        "chunked",
        "Bearer t",
        "Bearer  t ",
        "websocket",
        "100-continue",
        "a\tb",
        "a\x7fb",
        "caf\u00e9",
        "text/plain",
        "x" * 100,
        "a\x00b",
        "\tedge\t",
    ]
)
_SEPARATORS = st.sampled_from([": ", ": ", ": ", ":", ":  ", " : ", ":\t"])
_HEADER = st.tuples(_NAMES, _SEPARATORS, _VALUES).map(lambda h: f"{h[0]}{h[1]}{h[2]}")
_PARAM = st.tuples(
    st.sampled_from([*sorted(CHECK_FIELDS), "x", "%61ccount"]),
    st.sampled_from(
        [
            "a",
            "192.0.2.1",
            "al%C3%A9x",
            "b",
            "a%20b",
            "%3D",
            "1.2.3.4%2C10.0.0.1",
            "%zz",
            "a+b",
            "%FF",
            "",
            "%E2%80%8Bb",
        ]
    ),
).map(lambda p: f"{p[0]}={p[1]}")
_REQUEST_LINE = st.tuples(
    st.sampled_from(["GET"] * 8 + ["get", "POST", "HEAD"]),
    st.lists(_PARAM, min_size=1, max_size=4).map(lambda ps: "/v1/check?" + "&".join(ps)),
    st.sampled_from(["HTTP/1.1"] * 8 + ["HTTP/1.0", "HTTP/1.10", "HTTP/2.0"]),
).map(" ".join)
_HEADERS = st.tuples(
    st.lists(_HEADER, max_size=5),
    st.sampled_from([True, True, True, True, False]),  # usually one plain Host line
    st.integers(0, 5),
).map(lambda h: h[0][: h[2]] + ["Host: edge"] * h[1] + h[0][h[2] :])
_TAILS = st.sampled_from([b"", b"", CHECK.encode(), HEALTH.encode(), b"GET /v1/ch"])


def _aiohttp_read(parser_class: type, raw: bytes) -> list[object] | None:
    """aiohttp's messages for ``raw`` (as the server builds its parser), None on a 400."""
    loop = asyncio.new_event_loop()
    try:
        parser = parser_class(
            BaseProtocol(loop),
            loop,
            2**16,
            max_line_size=8190,
            max_field_size=8190,
            max_headers=128,
        )
        try:
            messages, _, _ = parser.feed_data(raw)
        except HttpProcessingError:
            return None
        return [message for message, _ in messages]
    finally:
        loop.close()


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    line=_REQUEST_LINE,
    headers=_HEADERS,
    ending=st.sampled_from(["\r\n"] * 6 + ["\n"]),
    tail=_TAILS,
)
def test_differential_every_head_the_fast_path_answers_aiohttp_reads_the_same(
    line: str, headers: list[str], ending: str, tail: bytes
) -> None:
    """Issue 15 #11 (bounded differential fuzz): whenever the fast path would answer a head
    (parse_head is not None, and no data follows a Connection: close), aiohttp's parsers
    (the C one the server uses, and the pure-Python one) read it without error as the same
    GET /v1/check: the same query, each name once, the same Authorization and the same
    keep-alive decision. Everything else is handed off, which is always safe."""
    head = ending.join([line, *headers]).encode()
    fast = parse_head(head, CHECK_FIELDS)
    if fast is None or (fast.close and tail):
        return
    raw = head + b"\r\n\r\n" + tail
    for parser_class in (HttpRequestParser, HttpRequestParserPy):
        messages = _aiohttp_read(parser_class, raw)
        assert messages, (parser_class, raw)
        first = messages[0]
        assert (first.method, first.version, first.should_close) == ("GET", (1, 1), fast.close)  # type: ignore[attr-defined]
        query = first.url.query  # type: ignore[attr-defined]
        assert len(query) == len(fast.query) and dict(query) == fast.query
        authorization = first.headers.get("Authorization")  # type: ignore[attr-defined]
        sent = None if authorization is None else authorization.encode("utf-8", "surrogateescape")
        assert sent == fast.authorization
