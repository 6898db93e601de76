"""A fetch-only connection to one broker, for the edge's cold load: each answer is read
once, straight into a buffer of its own, and its record batches are handed to the engine
as slices of that buffer.

aiokafka reads an answer through asyncio's ``StreamReader``, which grows a buffer with
every read, copies the answer out of it and copies it again to decode it: a third of the
cold load's CPU (bench/README.md, B8, "The cold load as record batches"). This
connection is an ``asyncio.BufferedProtocol``: the socket reads into the answer's buffer.

It speaks one request, Fetch version 4 (every broker since Kafka 0.11 serves it; Kafka 4
still does), over TCP or TLS (the feed's ``ssl_context``). SASL is left to aiokafka's
client (``pipeline.edge.bulkload`` uses it when the feed's protocol is ``SASL_*``).
Invariant: one request at a time; an answer is complete, or an error is raised.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from dataclasses import dataclass

from aiokafka.protocol.fetch import FetchRequest_v4

from pipeline.edge.errors import EdgeError

FETCH_KEY = FetchRequest_v4.API_KEY
FETCH_VERSION = FetchRequest_v4.API_VERSION
READ_UNCOMMITTED = 0
"""As the feed's consumer reads (aiokafka's default): the worker writes no transactions."""
MAX_ANSWER_BYTES = 1 << 30
"""An answer larger than this is refused (a fetch asks at most ``fetch_bytes``; one batch
larger than that still comes whole, bounded by the topic's ``max.message.bytes``)."""
_FIRST_BUFFER = 1 << 20
_READ_SLACK = 1 << 16


class FetchConnectionError(EdgeError):
    """The broker closed the connection, answered out of turn or sent a malformed answer."""


@dataclass(frozen=True, slots=True)
class PartitionAnswer:
    """One partition of a fetch answer: its error code and where its record batches lie
    in the answer's buffer (``start == end``: none)."""

    topic: str
    partition: int
    error_code: int
    start: int
    end: int


def encode_fetch(
    correlation_id: int,
    client_id: str,
    max_wait_ms: int,
    max_bytes: int,
    topics: list[tuple[str, list[tuple[int, int, int]]]],
) -> bytes:
    """A Fetch v4 request, framed: ``topics`` as (topic, [(partition, offset, max bytes)]).
    The body is aiokafka's own encoding (``FetchRequest_v4``); only the header is ours."""
    client = client_id.encode()
    header = struct.pack(">hhih", FETCH_KEY, FETCH_VERSION, correlation_id, len(client)) + client
    body: bytes = FetchRequest_v4(-1, max_wait_ms, 1, max_bytes, READ_UNCOMMITTED, topics).encode()
    return struct.pack(">i", len(header) + len(body)) + header + body


def parse_fetch(buf: bytearray | bytes, correlation_id: int) -> list[PartitionAnswer]:
    """The partitions of a framed Fetch v4 answer in ``buf``; FetchConnectionError if it is
    not one (a wrong correlation id, a field past the frame's end)."""
    view = memoryview(buf)
    try:
        (size, got_id, _throttle, topics) = struct.unpack_from(">iiii", view, 0)
        end_of_frame = 4 + size
        if end_of_frame > len(buf):
            raise FetchConnectionError(
                f"a fetch answer of {size} bytes, {len(buf) - 4} of them read"
            )
        if got_id != correlation_id:
            raise FetchConnectionError(
                f"the broker answered request {got_id} to request {correlation_id}"
            )
        at = 16
        out: list[PartitionAnswer] = []
        for _ in range(topics):
            (length,) = struct.unpack_from(">h", view, at)
            topic = bytes(view[at + 2 : at + 2 + length]).decode()
            at += 2 + length
            (partitions,) = struct.unpack_from(">i", view, at)
            at += 4
            for _ in range(partitions):
                partition, error_code, _high, _stable, aborted = struct.unpack_from(
                    ">ihqqi", view, at
                )
                at += 26 + 16 * max(aborted, 0)
                (records,) = struct.unpack_from(">i", view, at)
                at += 4
                records = max(records, 0)
                if at + records > end_of_frame:
                    raise FetchConnectionError("a fetch answer's records run past its end")
                out.append(PartitionAnswer(topic, partition, error_code, at, at + records))
                at += records
        return out
    except (struct.error, UnicodeDecodeError) as exc:
        raise FetchConnectionError(f"a malformed fetch answer: {exc}") from None
    finally:
        view.release()


class _Answers(asyncio.BufferedProtocol):
    """Reads one framed answer at a time into ``buf`` (grown, never shrunk)."""

    def __init__(self) -> None:
        self.buf = bytearray(_FIRST_BUFFER)
        self.have = 0
        self.need = -1
        self.waiter: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None
        self.lost: BaseException | None = None

    def expect(self) -> asyncio.Future[None]:
        self.have, self.need = 0, -1
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.resume_reading()
        return self.waiter

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.pause_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        want = self.need if self.need > 0 else self.have + _READ_SLACK
        if len(self.buf) < want:
            grown = bytearray(max(want, 2 * len(self.buf)) if self.need < 0 else want)
            grown[: self.have] = memoryview(self.buf)[: self.have]
            self.buf = grown
        stop = self.need if self.need > 0 else len(self.buf)
        return memoryview(self.buf)[self.have : stop]

    def buffer_updated(self, nbytes: int) -> None:
        self.have += nbytes
        if self.need < 0 and self.have >= 4:
            size = int.from_bytes(self.buf[:4], "big", signed=True)
            if not 8 <= size <= MAX_ANSWER_BYTES:
                self._fail(FetchConnectionError(f"a fetch answer of {size} bytes"))
                return
            self.need = 4 + size
        if 0 < self.need <= self.have:
            assert self.transport is not None
            self.transport.pause_reading()
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self.lost = exc
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost is None:
            self._fail(FetchConnectionError(f"the broker closed the connection ({exc!r})"))


class FetchConnection:
    """``await FetchConnection.open(host, port, ssl_context)``, then ``fetch`` and
    ``close``."""

    def __init__(self, answers: _Answers, client_id: str) -> None:
        self._answers = answers
        self._client_id = client_id
        self._correlation = 0

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        client_id: str,
        timeout_s: float = 30.0,
    ) -> FetchConnection:
        """Connect (and shake hands, with TLS) within ``timeout_s``; raises OSError
        (TimeoutError included)."""
        answers = _Answers()
        async with asyncio.timeout(timeout_s):
            await asyncio.get_running_loop().create_connection(
                lambda: answers,
                host,
                port,
                ssl=ssl_context,
                server_hostname=host if ssl_context else None,
            )
        return cls(answers, client_id)

    async def fetch(
        self,
        topics: list[tuple[str, list[tuple[int, int, int]]]],
        max_wait_ms: int,
        max_bytes: int,
        timeout_s: float,
    ) -> tuple[bytearray, list[PartitionAnswer]]:
        """One Fetch v4 round trip: the answer's buffer (valid until the next fetch) and
        its partitions. Raises FetchConnectionError (and TimeoutError after
        ``timeout_s``)."""
        answers = self._answers
        transport = answers.transport
        if answers.lost is not None or transport is None or transport.is_closing():
            raise FetchConnectionError("the fetch connection is closed")
        self._correlation += 1
        done = answers.expect()
        transport.write(
            encode_fetch(self._correlation, self._client_id, max_wait_ms, max_bytes, topics)
        )
        try:
            async with asyncio.timeout(timeout_s):
                await done
        except BaseException:
            self.close()  # an answer may still come: this connection is done
            raise
        return answers.buf, parse_fetch(answers.buf, self._correlation)

    def close(self) -> None:
        transport = self._answers.transport
        if transport is not None:
            transport.close()
