"""An edge's cold load read as record batches, not records (issue 45: 30M familiar records).

``bulk_load`` reads the decisions topic from each partition's position up to the end
offsets seen at start with Kafka fetch requests of its own (aiokafka's client sends them:
the feed's TLS and SASL options), and hands each partition's answer, the record batches as
the broker sent them, to ``DecisionView.apply_fetched``: the compiled engine walks the
batches and applies the familiar exempts and their tombstones without a Python object per
record, and hands every other message back to the view's Python path, in order. aiokafka's
consumer makes a ``ConsumerRecord`` per record, 3.5 us of CPU each (bench/README.md, B8's
cold load), more than the engine's decode and store together.

It only ever reads ahead of the feed's consumer, never instead of it: a partition whose
answer carries an error, nothing, or a batch the engine does not read (another format, a
compression codec, a bad CRC) is left where it stands, and the feed's consumer, seeked to
every position reached, reads on from there and reports what it meets as before. So the
view holds the same decisions whichever reads a message (``tests/unit/test_edge_bulkload.py``
holds the two paths equal). A broker error raises (``KafkaError``): the feed starts over.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiokafka.protocol.fetch import FetchRequest
from aiokafka.structs import TopicPartition

from pipeline.logs import get_logger

if TYPE_CHECKING:
    from aiokafka.client import AIOKafkaClient

    from pipeline.edge.view import DecisionView

log = get_logger("edge")

READ_UNCOMMITTED = 0
"""As the feed's consumer reads (aiokafka's default): the worker writes no transactions."""


@dataclass(frozen=True, slots=True)
class BulkConfig:
    """How big the cold load's fetches are."""

    partition_bytes: int = 2 << 20
    """Bytes per partition per fetch: one engine call applies them (about 8,000 exempts,
    about 12 ms), so the event loop is never held longer."""
    fetch_bytes: int = 64 << 20
    max_wait_ms: int = 100


@dataclass(slots=True)
class BulkResult:
    """What a cold load read: records, fetches, and the partitions it left to the consumer
    (by why: ``error``, ``empty``, ``unread``, ``no_leader``)."""

    records: int = 0
    fetches: int = 0
    left: dict[str, int] | None = None


async def bulk_load(
    client: AIOKafkaClient,
    view: DecisionView,
    positions: MutableMapping[TopicPartition, int],
    targets: Mapping[TopicPartition, int],
    config: BulkConfig = BulkConfig(),
) -> BulkResult:
    """Read every partition from ``positions`` (moved in place) up to ``targets`` into
    ``view``, as far as the engine reads; returns what it did."""
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
        answers = await asyncio.gather(
            *(client.send(node, _request(tps, positions, config)) for node, tps in by_node.items())
        )
        result.fetches += len(answers)
        for answer in answers:
            for topic, partitions in answer.topics:
                for partition, error_code, _high, *data in partitions:
                    tp = TopicPartition(topic, partition)
                    if tp not in open_:
                        continue
                    await _apply(view, tp, error_code, data[-1], positions, targets, open_, result)
                    await asyncio.sleep(0)
        view.prune()
    return result


def _request(
    tps: list[TopicPartition], positions: Mapping[TopicPartition, int], config: BulkConfig
) -> FetchRequest:
    by_topic: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for tp in tps:
        by_topic[tp.topic].append((tp.partition, positions.get(tp, 0), config.partition_bytes))
    return FetchRequest(
        config.max_wait_ms, 1, config.fetch_bytes, READ_UNCOMMITTED, list(by_topic.items())
    )


async def _apply(
    view: DecisionView,
    tp: TopicPartition,
    error_code: int,
    raw: Any,
    positions: MutableMapping[TopicPartition, int],
    targets: Mapping[TopicPartition, int],
    open_: set[TopicPartition],
    result: BulkResult,
) -> None:
    """One partition's answer: applied, its position moved, or the partition left."""
    if error_code != 0:
        _leave(open_, tp, "error", result, error_code=error_code)
        return
    if not raw:
        _leave(open_, tp, "empty", result)
        return
    at = positions.get(tp, 0)
    batch = view.apply_fetched(raw, at)
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
