"""The sink's Kafka side: its topics, its consumer and admin client, rebalances as
events, and lanes loaded from the group's committed offsets and plans."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import ConsumerRebalanceListener

from pipeline.errors import AuthpipeError
from pipeline.settings import KafkaSettings
from pipeline.sinks.lanes import Lane
from pipeline.sinks.plan import SinkError, decode_marks, decode_plan
from pipeline.sinks.ratecap import RateCapConfig
from pipeline.sinks.tables import LaneKind
from pipeline.topics import Topics

Events = deque[tuple[str, Any]]
"""Rebalances as they come: ("revoked" | "assigned" | "reload", [TopicPartition, ...])."""


async def open_kafka(
    kafka: KafkaSettings, group_id: str, topics: list[str], events: Events
) -> tuple[Any, Any]:
    """(consumer, admin client) of the sink's group, subscribed to ``topics`` (created if
    missing); rebalances are appended to ``events``. Raises SinkError without a broker."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient

    from pipeline.kafka_admin import TopicSpec, ensure_topics, wait_for_broker
    from pipeline.kafka_client import client_kwargs, security_kwargs

    security = security_kwargs(kafka)
    try:
        await wait_for_broker(kafka.bootstrap_servers, 30.0, security=security)
        specs: list[TopicSpec] = [
            spec
            for spec in Topics.from_settings(kafka).specs(kafka.partitions)
            if spec.name in topics
        ]
        await ensure_topics(
            kafka.bootstrap_servers,
            specs,
            replication_factor=kafka.replication_factor,
            security=security,
        )
    except AuthpipeError as exc:
        raise SinkError(f"the sink cannot start: {exc}") from exc
    admin = AIOKafkaAdminClient(**client_kwargs(kafka))
    await admin.start()
    consumer = AIOKafkaConsumer(
        **client_kwargs(kafka),
        group_id=group_id,
        client_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    consumer.subscribe(topics, listener=_Listener(events))
    return consumer, admin


async def committed_lanes(
    admin: Any,
    group_id: str,
    tps: Iterable[Any],
    kinds: Mapping[str, LaneKind],
    cap: RateCapConfig,
) -> dict[Any, Lane]:
    """A lane per partition at its committed offset (None: never committed), with the
    plan and (audit lanes) the marks its commit metadata carries."""
    tps = list(tps)
    committed = await admin.list_consumer_group_offsets(group_id, partitions=tps)
    lanes = {}
    for tp in tps:
        found = committed.get(tp)
        offset = found.offset if found is not None and found.offset >= 0 else None
        metadata = found.metadata if offset is not None else None
        kind = kinds[tp.topic]
        marks = decode_marks(metadata) if kind == "audit" else None
        lanes[tp] = Lane.start(
            tp.topic, tp.partition, kind, offset, decode_plan(metadata), cap, marks
        )
    return lanes


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Records rebalances; the sink's loop applies them between polls."""

    def __init__(self, events: deque[tuple[str, Any]]) -> None:
        self._events = events

    async def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
        self._events.append(("revoked", list(revoked)))

    async def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
        self._events.append(("assigned", list(assigned)))
