"""Reading a whole topic to its end without a consumer group or commits, and the policy's
outputs from the decision and alert topics.

Records from a topic carry no position in the events (``DecisionRecord.after`` is None);
on a compacted decision topic a decision superseded by a later one for the same key may be
gone: the offsets with no record are counted (``Outputs.missing_decision_records``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from pipeline.contracts.models import Alert, Decision
from pipeline.errors import AuthpipeError
from pipeline.logs import get_logger
from pipeline.sim.errors import ScorecardError
from pipeline.sim.outputs import AlertRecord, DecisionRecord, Outputs

log = get_logger("scorecard")


def parse_decision(raw: bytes | None) -> Decision | None:
    return None if raw is None else Decision.model_validate_json(raw)


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


async def read_topic(
    bootstrap: str, topic: str, timeout_s: float, security: dict[str, Any] | None = None
) -> TopicRead:
    """Every record of ``topic`` up to its end offsets at the call; no consumer group, no
    commits. ``security``: ``pipeline.kafka_client.security_kwargs``."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **(security or {})
    )
    await consumer.start()
    try:
        tps = await assign_whole_topic(consumer, topic, bootstrap, ScorecardError)
        partitions = [tp.partition for tp in tps]
        await consumer.seek_to_beginning(*tps)
        firsts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        records: dict[int, list[tuple[bytes | None, bytes | None]]] = {p: [] for p in partitions}
        async with asyncio.timeout(timeout_s):
            while True:
                behind = [tp for tp in tps if await consumer.position(tp) < ends[tp]]
                if not behind:
                    break
                batch = await consumer.getmany(*behind, timeout_ms=500)
                for tp, messages in batch.items():
                    records[tp.partition].extend(
                        (m.key, m.value) for m in messages if m.offset < ends[tp]
                    )
        gaps = sum(ends[tp] - firsts[tp] - len(records[tp.partition]) for tp in tps)
        return TopicRead([record for p in partitions for record in records[p]], gaps)
    except TimeoutError:
        raise ScorecardError(
            f"could not read {topic} to its end within {timeout_s:.0f} s"
        ) from None
    finally:
        await consumer.stop()


async def read_outputs_from_topics(
    bootstrap: str,
    decisions_topic: str,
    alerts_topic: str,
    timeout_s: float = 60.0,
    security: dict[str, Any] | None = None,
) -> Outputs:
    """The decision topic from the beginning (tombstones included) and the alerts topic."""
    outputs = Outputs(origin=f"topics:{decisions_topic},{alerts_topic}")
    decisions = await read_topic(bootstrap, decisions_topic, timeout_s, security)
    for key, value in decisions.records:
        if key is None:
            continue
        outputs.decisions.append(DecisionRecord(key.decode(), parse_decision(value)))
    outputs.missing_decision_records = decisions.gaps
    for _, value in (await read_topic(bootstrap, alerts_topic, timeout_s, security)).records:
        if value is not None:
            outputs.alerts.append(AlertRecord(parse_alert(value)))
    if decisions.gaps:
        log.warning("decision_records_compacted", topic=decisions_topic, missing=decisions.gaps)
    return outputs
