"""The cold load's own fetch connection (``pipeline.edge.fetchconn``): its Fetch v4
request is aiokafka's byte for byte, its answer parser finds every partition's records
where aiokafka's decoder does, a malformed answer is an error that says so, and the
connection reads whole answers however the socket splits them."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiokafka.protocol.fetch import FetchRequest_v4, FetchResponse_v4
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.edge.fetchconn import (
    FetchConnection,
    FetchConnectionError,
    encode_fetch,
    parse_fetch,
)

TOPICS = st.lists(
    st.tuples(
        st.text("abc.-_", min_size=1, max_size=12),
        st.lists(
            st.tuples(
                st.integers(0, 2**31 - 1),
                st.integers(-(2**63), 2**63 - 1),
                st.integers(0, 2**31 - 1),
            ),
            max_size=4,
        ),
    ),
    max_size=3,
)
PARTITIONS = st.lists(
    st.tuples(
        st.integers(0, 100),
        st.integers(-1, 100),
        st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=2),
        st.one_of(st.none(), st.binary(max_size=40)),
    ),
    max_size=4,
)


def framed(correlation_id: int, body: bytes) -> bytes:
    return struct.pack(">ii", 4 + len(body), correlation_id) + body


@given(st.integers(0, 2**31 - 1), st.text(max_size=20), TOPICS)
def test_the_request_is_aiokafkas_fetch_v4(
    correlation_id: int, client_id: str, topics: list[tuple[str, list[tuple[int, int, int]]]]
) -> None:
    """After its size and header (api key 1, version 4, the correlation id, the client
    id), the request's body is aiokafka's ``FetchRequest_v4`` encoding."""
    frame = encode_fetch(correlation_id, client_id, 100, 64 << 20, topics)
    client = client_id.encode()
    header = struct.pack(">hhih", 1, 4, correlation_id, len(client)) + client
    body = FetchRequest_v4(-1, 100, 1, 64 << 20, 0, topics).encode()
    assert frame == struct.pack(">i", len(header) + len(body)) + header + body


@settings(max_examples=200)
@given(st.lists(st.tuples(st.text("xyz", min_size=1, max_size=5), PARTITIONS), max_size=3))
def test_the_parser_finds_each_partitions_records_where_aiokafka_encodes_them(
    topics: list[tuple[str, list[tuple[int, int, list[tuple[int, int]], bytes | None]]]],
) -> None:
    """A ``FetchResponse_v4`` encoded by aiokafka (aborted transactions, null records):
    every partition in order, its error code, and ``buf[start:end]`` its records (empty
    for null)."""
    wire = [
        (topic, [(p, err, 5, 5, aborted, records) for p, err, aborted, records in parts])
        for topic, parts in topics
    ]
    buf = bytearray(framed(7, FetchResponse_v4(0, wire).encode())) + b"spare"
    got = parse_fetch(buf, 7)
    want = [
        (topic, p, err, records or b"") for topic, parts in topics for p, err, _, records in parts
    ]
    assert [(a.topic, a.partition, a.error_code, bytes(buf[a.start : a.end])) for a in got] == want


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (lambda b: b[:10], "malformed fetch answer"),
        (lambda b: b[:-2], "a fetch answer of 55 bytes, 53 of them read"),
        (lambda b: b[:4] + struct.pack(">i", 8) + b[8:], "answered request 8 to request 7"),
    ],
    ids=["truncated", "short_frame", "out_of_turn"],
)
def test_a_malformed_answer_is_an_error_that_says_so(
    cut: Callable[[bytes], bytes], message: str
) -> None:
    """A truncated answer, a frame longer than what arrived and another request's answer
    raise FetchConnectionError."""
    body = FetchResponse_v4(0, [("t", [(0, 0, 5, 5, [], b"abcdef")])]).encode()
    with pytest.raises(FetchConnectionError, match=message):
        parse_fetch(cut(framed(7, body)), 7)


def test_records_running_past_the_frame_are_refused() -> None:
    """A partition whose records length runs past the frame's end is an error."""
    body = bytearray(FetchResponse_v4(0, [("t", [(0, 0, 5, 5, [], b"abcdef")])]).encode())
    struct.pack_into(">i", body, len(body) - 10, 60)
    with pytest.raises(FetchConnectionError, match="run past its end"):
        parse_fetch(framed(7, bytes(body)), 7)


class Broker:
    """A loopback server that answers each request with ``answer(correlation_id)``, sent
    in pieces of ``piece`` bytes."""

    def __init__(self, answer: Callable[[int], bytes], piece: int) -> None:
        self.answer, self.piece = answer, piece
        self.requests: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                request = await reader.readexactly(size)
                self.requests.append(request)
                (correlation_id,) = struct.unpack_from(">i", request, 4)
                data = self.answer(correlation_id)
                for at in range(0, len(data), self.piece):
                    writer.write(data[at : at + self.piece])
                    await writer.drain()
                    await asyncio.sleep(0)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Broker], Awaitable[int]]]:
    servers: list[asyncio.Server] = []

    async def start(broker: Broker) -> int:
        server = await asyncio.start_server(broker.serve, "127.0.0.1", 0)
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    yield start
    for server in servers:
        server.close()


Serve = Callable[[Broker], Awaitable[int]]
TOPIC = [("t", [(0, 0, 1 << 20)])]


async def test_whole_answers_are_read_in_any_pieces_and_the_buffer_grows(serve: Serve) -> None:
    """Answers of 3 MB (past the first 1 MB buffer) sent 7 and 65,536 bytes at a time:
    each fetch returns the whole answer, its records where the parser says, twice on one
    connection."""
    records = bytes(range(256)) * (3 * 4096)

    def answer(correlation_id: int) -> bytes:
        return framed(
            correlation_id, FetchResponse_v4(0, [("t", [(0, 0, 9, 9, [], records)])]).encode()
        )

    for piece in (65_536, 7):
        port = await serve(Broker(answer, piece))
        connection = await FetchConnection.open("127.0.0.1", port, None, "test")
        try:
            for _ in range(2 if piece > 7 else 1):
                buf, got = await connection.fetch(TOPIC, 100, 1 << 20, 30.0)
                assert [(a.topic, a.partition, a.error_code) for a in got] == [("t", 0, 0)]
                assert bytes(buf[got[0].start : got[0].end]) == records
        finally:
            connection.close()


async def test_a_closed_connection_is_an_error_and_stays_closed(serve: Serve) -> None:
    """A broker that closes mid-answer fails the fetch with FetchConnectionError, and the
    next fetch on that connection too."""

    def answer(correlation_id: int) -> bytes:
        raise ConnectionError("gone")

    port = await serve(Broker(answer, 10))
    connection = await FetchConnection.open("127.0.0.1", port, None, "test")
    with pytest.raises(FetchConnectionError, match="closed the connection"):
        await connection.fetch(TOPIC, 100, 1 << 20, 30.0)
    with pytest.raises(FetchConnectionError, match="closed"):
        await connection.fetch(TOPIC, 100, 1 << 20, 30.0)


async def test_an_answer_that_does_not_come_times_out_and_closes(serve: Serve) -> None:
    """No answer within the timeout: TimeoutError, and the connection is closed (a late
    answer must not be read as the next one's)."""
    port = await serve(Broker(lambda c: b"", 10))
    connection = await FetchConnection.open("127.0.0.1", port, None, "test")
    with pytest.raises(TimeoutError):
        await connection.fetch(TOPIC, 100, 1 << 20, 0.2)
    with pytest.raises(FetchConnectionError, match="closed"):
        await connection.fetch(TOPIC, 100, 1 << 20, 0.2)


async def test_an_absurd_answer_size_closes_the_connection(serve: Serve) -> None:
    """A frame claiming 2 GiB (or less than its own header) fails the fetch."""
    port = await serve(Broker(lambda c: struct.pack(">i", -5) + b"x" * 20, 30))
    connection = await FetchConnection.open("127.0.0.1", port, None, "test")
    with pytest.raises(FetchConnectionError, match="a fetch answer of -5 bytes"):
        await connection.fetch(TOPIC, 100, 1 << 20, 5.0)
