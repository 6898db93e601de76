"""An edge's cold load read as record batches, not records (issue 45: 30M familiar records).

``bulk_load`` reads the decisions topic from each partition's position up to the end
offsets seen at start with Kafka fetch requests of its own, and hands each partition's
answer, the record batches as the broker sent them, to ``DecisionView.apply_fetched``: the compiled engine walks the
batches and applies the familiar exempts and their tombstones without a Python object per
record, and hands every other message back to the view's Python path, in order. aiokafka's
consumer makes a ``ConsumerRecord`` per record, 3.5 us of CPU each (bench/README.md, B8's
cold load), more than the engine's decode and store together.

Over TCP and TLS the fetches go on connections of its own (``pipeline.edge.fetchconn``:
each answer read once into its own buffer, its batches handed to the engine as slices of
it, with the feed's ``ssl_context``); with SASL, through aiokafka's client and its
handshake (each answer copied three times as it is read: about 0.7 us a record more).
Either way the broker sees the consumer's fetches, so the edge needs no other ACL.

It only ever reads ahead of the feed's consumer, never instead of it: a partition whose
answer carries an error, nothing, or a batch the engine does not read (another format, a
compression codec, a bad CRC) is left where it stands, and the feed's consumer, seeked to
every position reached, reads on from there and reports what it meets as before. So the
view holds the same decisions whichever reads a message (``tests/unit/test_edge_bulkload.py``
holds the two paths equal). A broker error raises (``KafkaError``): the feed starts over.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import defaultdict
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from aiokafka.errors import KafkaError
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.structs import TopicPartition

from pipeline.edge.fetchconn import READ_UNCOMMITTED, FetchConnection, FetchConnectionError
from pipeline.logs import get_logger

if TYPE_CHECKING:
    from aiokafka.client import AIOKafkaClient

    from pipeline.edge.view import DecisionView

log = get_logger("edge")


@dataclass(frozen=True, slots=True)
class BulkConfig:
    """How big the cold load's fetches are."""

    partition_bytes: int = 2 << 20
    """Bytes per partition per fetch: one engine call applies them (about 3,300 exempts of
    the worker's, about 5 ms), so the event loop is never held longer."""
    fetch_bytes: int = 64 << 20
    max_wait_ms: int = 100


@dataclass(slots=True)
class BulkResult:
    """What a cold load read: records, fetches, and the partitions it left to the consumer
    (by why: ``error``, ``empty``, ``unread``, ``no_leader``)."""

    records: int = 0
    fetches: int = 0
    left: dict[str, int] | None = None


class _Fetcher(Protocol):
    """Sends one node's fetch; answers (partition, error code, buffer, start, end)."""

    async def fetch(
        self, node: int, topics: list[tuple[str, list[tuple[int, int, int]]]]
    ) -> list[tuple[TopicPartition, int, Any, int, int]]: ...

    def close(self) -> None: ...


class _ClientFetcher:
    """Through aiokafka's client (any security protocol; each answer copied as read)."""

    def __init__(self, client: AIOKafkaClient, config: BulkConfig) -> None:
        self._client, self._config = client, config

    async def fetch(
        self, node: int, topics: list[tuple[str, list[tuple[int, int, int]]]]
    ) -> list[tuple[TopicPartition, int, Any, int, int]]:
        cfg = self._config
        request = FetchRequest(cfg.max_wait_ms, 1, cfg.fetch_bytes, READ_UNCOMMITTED, topics)
        answer = await self._client.send(node, request)
        out = []
        for topic, partitions in answer.topics:
            for partition, error_code, _high, *data in partitions:
                raw = data[-1] or b""
                out.append((TopicPartition(topic, partition), error_code, raw, 0, len(raw)))
        return out

    def close(self) -> None:
        pass


class _OwnFetcher:
    """On connections of its own, one per node (TCP or TLS): each answer read once."""

    def __init__(
        self,
        client: AIOKafkaClient,
        config: BulkConfig,
        ssl_context: ssl.SSLContext | None,
        client_id: str,
        timeout_s: float,
    ) -> None:
        self._client, self._config = client, config
        self._ssl, self._client_id, self._timeout_s = ssl_context, client_id, timeout_s
        self._connections: dict[int, FetchConnection] = {}

    async def fetch(
        self, node: int, topics: list[tuple[str, list[tuple[int, int, int]]]]
    ) -> list[tuple[TopicPartition, int, Any, int, int]]:
        connection = self._connections.get(node)
        if connection is None:
            broker = self._client.cluster.broker_metadata(node)
            if broker is None:
                raise KafkaError(f"broker {node} is not in the cluster's metadata")
            connection = await FetchConnection.open(
                broker.host, broker.port, self._ssl, self._client_id, self._timeout_s
            )
            self._connections[node] = connection
        cfg = self._config
        try:
            buf, answers = await connection.fetch(
                topics, cfg.max_wait_ms, cfg.fetch_bytes, self._timeout_s
            )
        except (FetchConnectionError, TimeoutError):
            del self._connections[node]
            raise
        return [
            (TopicPartition(a.topic, a.partition), a.error_code, buf, a.start, a.end)
            for a in answers
        ]

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()


def fetcher_for(
    client: AIOKafkaClient,
    config: BulkConfig,
    security: Mapping[str, Any],
    client_id: str,
    timeout_s: float,
) -> _Fetcher:
    """Connections of its own over TCP and TLS; aiokafka's client with SASL."""
    protocol = security.get("security_protocol", "PLAINTEXT")
    if protocol in ("PLAINTEXT", "SSL"):
        return _OwnFetcher(client, config, security.get("ssl_context"), client_id, timeout_s)
    return _ClientFetcher(client, config)


async def bulk_load(
    fetcher: _Fetcher,
    client: AIOKafkaClient,
    view: DecisionView,
    positions: MutableMapping[TopicPartition, int],
    targets: Mapping[TopicPartition, int],
    config: BulkConfig = BulkConfig(),
) -> BulkResult:
    """Read every partition from ``positions`` (moved in place) up to ``targets`` into
    ``view``, as far as the engine reads; returns what it did. ``client`` knows the
    partitions' leaders; ``fetcher`` sends the fetches."""
    result = BulkResult(left={})
    open_ = {tp for tp, end in targets.items() if positions.get(tp, 0) < end}
    while open_:
        by_node: dict[int, list[TopicPartition]] = defaultdict(list)
        for tp in sorted(open_):
            leader = client.cluster.leader_for_partition(tp)
            if leader is None or leader < 0:
                _leave(open_, tp, "no_leader", result)
                continue
            by_node[leader].append(tp)
        # Every node's fetch ends before any error is raised: none is left in flight.
        outcomes = await asyncio.gather(
            *(
                fetcher.fetch(node, _topics(tps, positions, config))
                for node, tps in by_node.items()
            ),
            return_exceptions=True,
        )
        answers = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            answers.append(outcome)
        result.fetches += len(answers)
        for answer in answers:
            for tp, error_code, buf, start, end in answer:
                if tp not in open_:
                    continue
                _apply(view, tp, error_code, buf, start, end, positions, targets, open_, result)
                await asyncio.sleep(0)
        view.prune()
    return result


def _topics(
    tps: list[TopicPartition], positions: Mapping[TopicPartition, int], config: BulkConfig
) -> list[tuple[str, list[tuple[int, int, int]]]]:
    by_topic: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for tp in tps:
        by_topic[tp.topic].append((tp.partition, positions.get(tp, 0), config.partition_bytes))
    return list(by_topic.items())


def _apply(
    view: DecisionView,
    tp: TopicPartition,
    error_code: int,
    buf: Any,
    start: int,
    end: int,
    positions: MutableMapping[TopicPartition, int],
    targets: Mapping[TopicPartition, int],
    open_: set[TopicPartition],
    result: BulkResult,
) -> None:
    """One partition's answer: applied, its position moved, or the partition left."""
    if error_code != 0:
        _leave(open_, tp, "error", result, error_code=error_code)
        return
    if end <= start:
        _leave(open_, tp, "empty", result)
        return
    at = positions.get(tp, 0)
    batch = view.apply_fetched(buf, at, start, end)
    result.records += batch.records
    if batch.next_offset > at:
        positions[tp] = batch.next_offset
    if batch.unread:
        _leave(open_, tp, "unread", result)
    elif positions.get(tp, 0) >= targets[tp]:
        open_.discard(tp)
    elif batch.next_offset <= at:  # a batch larger than partition_bytes, cut short
        _leave(open_, tp, "partial", result)


def _leave(
    open_: set[TopicPartition], tp: TopicPartition, why: str, result: BulkResult, **extra: int
) -> None:
    """Leave ``tp`` to the consumer, from where it stands."""
    open_.discard(tp)
    assert result.left is not None
    result.left[why] = result.left.get(why, 0) + 1
    log.info("edge_bulk_load_left", topic=tp.topic, partition=tp.partition, reason=why, **extra)
