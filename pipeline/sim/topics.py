"""Reading a whole topic to its end without a consumer group or commits, and the policy's
outputs from the decision and alert topics.

Records from a topic carry no position in the events (``DecisionRecord.after`` is None);
on a compacted decision topic a decision superseded by a later one for the same key may be
gone: the offsets with no record are counted (``Outputs.missing_decision_records``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pipeline.contracts.codec import decision_model, decode_decision
from pipeline.contracts.models import Alert, Decision
from pipeline.core.grouping import within_grouping
from pipeline.errors import AuthpipeError
from pipeline.logs import get_logger
from pipeline.sim.errors import ScorecardError
from pipeline.sim.outputs import AlertRecord, DecisionRecord, Outputs

log = get_logger("scorecard")


def parse_decision(raw: bytes | None, source_ok: Callable[[str], bool]) -> Decision | None:
    """A decisions-topic value (None: a tombstone), read by the one decision decoder."""
    return None if raw is None else decision_model(decode_decision(raw, source_ok=source_ok))


def parse_alert(raw: bytes) -> Alert:
    return Alert.model_validate_json(raw)


@dataclass
class TopicRead:
    """Records of a topic in partition order, offset order within a partition, and how many
    offsets between the log start and the end had no record (removed by compaction)."""

    records: list[tuple[bytes | None, bytes | None]]
    gaps: int


async def assign_whole_topic(
    consumer: Any, topic: str, bootstrap: str, error: type[AuthpipeError]
) -> list[Any]:
    """Assign every partition of ``topic`` to a started group-less ``consumer``, in
    partition order; raises ``error`` if the topic does not exist."""
    from aiokafka import TopicPartition

    partitions = sorted(consumer.partitions_for_topic(topic) or set())
    if not partitions:
        await consumer._client.force_metadata_update()  # the topic may be brand new
        partitions = sorted(consumer.partitions_for_topic(topic) or set())
    if not partitions:
        raise error(
            f"topic {topic} does not exist at {bootstrap}; check the name and the bootstrap servers"
        )
    tps = [TopicPartition(topic, p) for p in partitions]
    consumer.assign(tps)
    return tps


Offsets = dict[Any, int]
"""Per ``TopicPartition``: an offset."""
Bounds = Callable[[Any, list[Any]], Awaitable[tuple[Offsets, Offsets]]]
"""Given the started consumer and the topic's partitions: where to start and where to stop
(exclusive) reading each partition."""


async def read_range(
    bootstrap: str,
    topic: str,
    bounds: Bounds,
    *,
    timeout_s: float,
    security: dict[str, Any] | None,
    error: type[AuthpipeError],
    what: str = "",
) -> tuple[list[Any], int]:
    """The records of every partition of ``topic`` between its ``bounds``, in partition
    order, offset order within a partition, read without a consumer group or commits; and
    how many offsets in the bounds had no record (removed by compaction). Raises ``error``
    if the topic does not exist or the read takes longer than ``timeout_s`` (``what`` says
    how far it was to read). ``security``: ``pipeline.kafka_client.security_kwargs``."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **(security or {})
    )
    await consumer.start()
    try:
        tps = await assign_whole_topic(consumer, topic, bootstrap, error)
        starts, stops = await bounds(consumer, tps)
        wanted = [tp for tp in tps if starts[tp] < stops[tp]]
        for tp in wanted:
            consumer.seek(tp, starts[tp])
        records: dict[Any, list[Any]] = {tp: [] for tp in tps}
        async with asyncio.timeout(timeout_s):
            while True:
                behind = [tp for tp in wanted if await consumer.position(tp) < stops[tp]]
                if not behind:
                    break
                batch = await consumer.getmany(*behind, timeout_ms=500)
                for tp, messages in batch.items():
                    records[tp].extend(m for m in messages if m.offset < stops[tp])
        gaps = sum(stops[tp] - starts[tp] - len(records[tp]) for tp in wanted)
        return [record for tp in tps for record in records[tp]], gaps
    except TimeoutError:
        raise error(f"could not read {topic}{what} within {timeout_s:.0f} s") from None
    finally:
        await consumer.stop()


async def _whole(consumer: Any, tps: list[Any]) -> tuple[Offsets, Offsets]:
    return await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)


async def read_topic(
    bootstrap: str, topic: str, timeout_s: float, security: dict[str, Any] | None = None
) -> TopicRead:
    """Every record of ``topic`` up to its end offsets at the call; no consumer group, no
    commits. ``security``: ``pipeline.kafka_client.security_kwargs``."""
    records, gaps = await read_range(
        bootstrap,
        topic,
        _whole,
        timeout_s=timeout_s,
        security=security,
        error=ScorecardError,
        what=" to its end",
    )
    return TopicRead([(m.key, m.value) for m in records], gaps)


async def read_outputs_from_topics(
    bootstrap: str,
    decisions_topic: str,
    alerts_topic: str,
    timeout_s: float = 60.0,
    security: dict[str, Any] | None = None,
    source_ok: Callable[[str], bool] = within_grouping,
) -> Outputs:
    """The decision topic from the beginning (tombstones included) and the alerts topic."""
    outputs = Outputs(origin=f"topics:{decisions_topic},{alerts_topic}")
    decisions = await read_topic(bootstrap, decisions_topic, timeout_s, security)
    for key, value in decisions.records:
        if key is None:
            continue
        outputs.decisions.append(DecisionRecord(key.decode(), parse_decision(value, source_ok)))
    outputs.missing_decision_records = decisions.gaps
    for _, value in (await read_topic(bootstrap, alerts_topic, timeout_s, security)).records:
        if value is not None:
            outputs.alerts.append(AlertRecord(parse_alert(value)))
    if decisions.gaps:
        log.warning("decision_records_compacted", topic=decisions_topic, missing=decisions.gaps)
    return outputs
