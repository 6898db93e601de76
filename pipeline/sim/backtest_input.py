"""The backtest's input: a range of the input topic, or a file, as unlabelled events.

The input is a time range of the input topic (by record timestamps, which are event
times for simulated runs and for producers that set them, then filtered by
``occurred_at``), an offset range (the same bounds for every partition), or a JSONL
file of events or truth rows. The topic is read with a throwaway consumer (no group, no
commits). Invalid events are skipped and counted, as the worker would dead-letter them;
the events are sorted in the stream's order (event time, then event id) and, given a truth
file, labelled by event id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.contracts.codec import DecodeError, decode_attempt
from pipeline.core.attempt import Normaliser
from pipeline.core.errors import InvalidAttempt
from pipeline.errors import AuthpipeError
from pipeline.sim.topics import read_range
from pipeline.sim.truth import UNKNOWN, TruthEvent, reindex


class BacktestError(AuthpipeError):
    """A backtest input (range, file, topic) is missing or inconsistent."""


@dataclass(frozen=True, slots=True)
class TopicRange:
    """Which records of the input topic to replay. Times are epoch ms, ``to`` exclusive;
    offsets apply to every partition, ``to_offset`` exclusive."""

    from_ms: int | None = None
    to_ms: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None


async def read_input_range(
    bootstrap: str,
    topic: str,
    rng: TopicRange,
    timeout_s: float = 120.0,
    security: dict[str, Any] | None = None,
) -> list[tuple[int, int, bytes | None]]:
    """(partition, offset, value) of the records in range, read without a consumer group.
    ``security``: ``pipeline.kafka_client.security_kwargs``."""

    async def bounds(consumer: Any, tps: list[Any]) -> tuple[dict[Any, int], dict[Any, int]]:
        return await _bounds(consumer, tps, rng)

    records, _ = await read_range(
        bootstrap, topic, bounds, timeout_s=timeout_s, security=security, error=BacktestError
    )
    return [(m.partition, m.offset, m.value) for m in records]


async def _bounds(
    consumer: Any, tps: list[Any], rng: TopicRange
) -> tuple[dict[Any, int], dict[Any, int]]:
    firsts = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    starts, stops = dict(firsts), dict(ends)
    if rng.from_ms is not None:
        found = await consumer.offsets_for_times({tp: rng.from_ms for tp in tps})
        starts = {tp: ends[tp] if found[tp] is None else found[tp].offset for tp in tps}
    if rng.to_ms is not None:
        found = await consumer.offsets_for_times({tp: rng.to_ms for tp in tps})
        stops = {tp: ends[tp] if found[tp] is None else found[tp].offset for tp in tps}
    if rng.from_offset is not None:
        starts = {tp: max(firsts[tp], rng.from_offset) for tp in tps}
    if rng.to_offset is not None:
        stops = {tp: min(ends[tp], rng.to_offset) for tp in tps}
    return starts, stops


def events_from_records(
    records: Sequence[tuple[int, int, bytes | None]],
    normaliser: Normaliser,
    rng: TopicRange,
) -> tuple[list[TruthEvent], int]:
    """Decoded, normalised, unlabelled events in event-time order; and the invalid count."""
    rows: list[tuple[int, int, int, TruthEvent]] = []
    invalid = 0
    for partition, offset, value in records:
        try:
            wire = decode_attempt(value, max_bytes=1 << 20)
            attempt = normaliser.normalise(wire)
        except (DecodeError, InvalidAttempt):
            invalid += 1
            continue
        t = attempt.occurred_ms
        if (rng.from_ms is not None and t < rng.from_ms) or (
            rng.to_ms is not None and t >= rng.to_ms
        ):
            continue
        event = TruthEvent(
            0, wire.event_id, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, wire.account, attempt
        )
        rows.append((t, partition, offset, event))
    # Event time, then event id: the stream's order (pipeline.core.engine.replay_order).
    rows.sort(key=lambda r: (r[0], r[3].event_id, r[1], r[2]))
    return [reindex(e, i) for i, (*_, e) in enumerate(rows)], invalid


def label(events: Sequence[TruthEvent], truth: Sequence[TruthEvent]) -> list[TruthEvent]:
    """The events with their ground-truth labels (joined by event id) where known."""
    by_id = {t.event_id: t for t in truth}
    out = []
    for e in events:
        t = by_id.get(e.event_id)
        if t is None:
            out.append(e)
        else:
            out.append(
                TruthEvent(
                    e.index,
                    e.event_id,
                    t.scenario,
                    t.role,
                    t.actor,
                    t.cohort,
                    e.account_plain,
                    e.attempt,
                )
            )
    return out
