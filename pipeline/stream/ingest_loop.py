"""Ingest's read loop: the input topic through an aiokafka ``getmany`` consumer of its own
(group ``<app id>-ingest``), validated and normalised in batches (``pipeline.stream.ingest``),
one envelope per account partition (``pipeline.stream.envelopes``) with the input
partitions' event-time marks (``pipeline.stream.marks``), bad events to the dead-letter
topic. Input offsets are committed only once every envelope and dead letter of the batch
is acknowledged: a crash re-reads the batch, and the account stage skips what it applied.

Backpressure: while this worker's account stage has more than
``worker.ingest_ahead_max_envelopes`` of ingest's envelopes still to apply, ingest waits
(at most ``HOLD_MAX_MS``) before reading its next batch. A saturated worker's backlog then
forms at the input, where the next batch takes up to ``batch_max_events`` of it, instead of
as a queue of small envelopes, each costing the stages a fixed amount (B2 in
bench/README.md). Ingest never waits longer than that, so a stalled or restoring stage
only makes its batches larger.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError
from aiokafka.structs import TopicPartition

from pipeline.clock import wall_ms
from pipeline.contracts.codec import dumps
from pipeline.kafka_client import client_kwargs
from pipeline.logs import get_logger
from pipeline.settings import Settings, WorkerSettings
from pipeline.stream.envelopes import account_envelopes
from pipeline.stream.inflation import bound_decompression
from pipeline.stream.ingest import DeadLetter, Ingest
from pipeline.stream.marks import InputMarks, MarkRounds
from pipeline.stream.metrics import WorkerMetrics
from pipeline.stream.undecodable import DECODE_ERRORS, salvage
from pipeline.topics import Topics

log = get_logger("worker")

SendEnvelope = Callable[[int, bytes], Awaitable[Awaitable[Any]]]
SendDead = Callable[[DeadLetter], Awaitable[Awaitable[Any]]]
Applied = Callable[[int], int | None]
GetMany = Callable[[int, int], Awaitable[dict[Any, list[Any]]]]
"""``(timeout_ms, max_records)`` to the records a consumer's ``getmany`` returns."""

HOLD_MAX_MS = 1000
"""The longest ingest waits for the account stage before it reads its next batch."""


def envelopes_ahead(sent_next: dict[int, int], applied: Applied) -> int:
    """Envelopes sent to the account partitions this worker's stage owns and has not
    applied: per partition, the offset after the last one sent, less the one the stage
    expects next (``applied`` is None for a partition another worker owns)."""
    ahead = 0
    for partition, sent in sent_next.items():
        expected = applied(partition)
        if expected is not None and sent > expected:
            ahead += sent - expected
    return ahead


def handed_ms(handed: dict[int, list[tuple[int, int]]], partition: int, offset: int) -> int | None:
    """When the consumer handed over the record at ``offset`` of ``partition``: the time of
    the first getmany answer whose last offset is at or past it (None: not stamped)."""
    for last, at_ms in handed.get(partition, ()):
        if offset <= last:
            return at_ms
    return None


def ingest_consumer_options(settings: Settings) -> dict[str, Any]:
    """How ingest's consumer is built: group ``<app id>-ingest``, offsets committed by
    ingest, fetch answers within ``worker.input_fetch_wait_ms``."""
    return {
        **client_kwargs(settings.kafka),
        "group_id": f"{settings.kafka.app_id}-ingest",
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": 4 * 1024 * 1024,
        "fetch_max_wait_ms": settings.worker.input_fetch_wait_ms,
    }


async def gather_batch(
    getmany: GetMany, worker: WorkerSettings, stop: Callable[[], bool] = lambda: False
) -> dict[Any, list[Any]]:
    """Records until ``batch_max_events`` or ``batch_max_wait_ms`` after the first one, or
    until ``stop()`` (checked after each ``getmany``); nothing when no record came within
    ``input_fetch_wait_ms`` (the loop then moves its quiet partitions' marks).

    ``getmany`` returns whatever the fetcher holds, a handful of records under light
    load, and every batch costs a fixed envelope per account partition downstream (and
    forwards per source partition from each): lingering keeps a trickle from turning
    into thousands of tiny envelopes a second, at a bounded cost in latency."""
    batch = await getmany(worker.input_fetch_wait_ms, worker.batch_max_events)
    count = sum(len(messages) for messages in batch.values())
    if not count or stop():
        return batch
    deadline = time.monotonic() + worker.batch_max_wait_ms / 1000
    while count < worker.batch_max_events:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            break
        more = await getmany(left_ms, worker.batch_max_events - count)
        for tp, messages in more.items():
            batch.setdefault(tp, []).extend(messages)
            count += len(messages)
        if stop():
            break
    return batch


def _not_here(partition: int) -> int | None:
    return None


class RereadLast(ConsumerRebalanceListener):  # type: ignore[misc]
    """On assignment, ingest re-reads each input partition's last committed record.

    Its event time is that partition's mark (``pipeline.stream.marks``): an ingest that
    restarts with its input already read would otherwise send no marks, and the stages
    would hold the rows they had not released before the restart until new input came.
    The account stage skips the re-read row as a replay (it remembers the highest input
    offset it applied per input partition)."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked: Any) -> None:
        return None

    async def on_partitions_assigned(self, assigned: Any) -> None:
        for tp in assigned:
            committed = await self.consumer.committed(tp)
            if committed:
                self.consumer.seek(tp, committed - 1)


class IngestLoop:
    """The read loop and its state: the marks it sent, and whether its consumer started."""

    def __init__(
        self,
        settings: Settings,
        topics: Topics,
        ingest: Ingest,
        metrics: WorkerMetrics,
        *,
        send_envelope: SendEnvelope,
        send_dead: SendDead,
        applied: Applied = _not_here,
    ) -> None:
        self.settings = settings
        self.topics = topics
        self.partitions = settings.kafka.partitions
        self.ingest = ingest
        self.metrics = metrics
        self.send_envelope = send_envelope
        self.send_dead = send_dead
        # The account stage's next expected offset on a partition it owns here (None:
        # not here), and the offset after the last envelope ingest sent to each partition.
        self.applied = applied
        self.sent_next: dict[int, int] = {}
        self.progressed = asyncio.Event()
        # Event-time marks of the input partitions ingest reads (pipeline.stream.marks).
        self.marks = InputMarks(
            idle_ms=settings.worker.input_idle_ms,
            live_slack_ms=settings.worker.input_live_slack_ms,
            live_slack_max_ms=settings.worker.input_live_slack_max_ms,
        )
        # Which account partitions each batch sends to (marks.py, MarkRounds).
        self.rounds = MarkRounds(self.partitions, settings.worker.marks_interval_ms)
        # Per input partition of the batch being gathered: (last offset, wall ms) of each
        # getmany answer, so each event's delay is measured when the consumer handed it
        # over, not after the batch's linger (the live marks' guard, marks.py).
        self.handed: dict[int, list[tuple[int, int]]] = {}
        self.ready = asyncio.Event()

    async def run(self) -> None:
        """Read, validate and send until cancelled (a faust task)."""
        s = self.settings
        bound_decompression(s.ingest.max_batch_bytes, s.ingest.max_event_bytes)  # bombs
        consumer = AIOKafkaConsumer(**ingest_consumer_options(s))
        consumer.subscribe(self.ingest.input_topics, listener=RereadLast(consumer))
        await consumer.start()
        self.ready.set()
        try:
            while True:
                await self._hold()
                undecodable: list[DeadLetter] = []
                batch = await self._gather_batch(consumer, undecodable)
                await self._ingest_batch(consumer, batch, undecodable)
        finally:
            await consumer.stop()

    def stage_progressed(self) -> None:
        """The account stage applied an envelope: a held ingest looks again."""
        self.progressed.set()

    async def _hold(self) -> None:
        """Wait while the account stage here is more than ``ingest_ahead_max_envelopes``
        behind ingest, for ``HOLD_MAX_MS`` at most (a saturated worker's batches grow).
        Woken by ``stage_progressed``, so the stage never idles while ingest is held."""
        limit = self.settings.worker.ingest_ahead_max_envelopes
        if not limit or envelopes_ahead(self.sent_next, self.applied) <= limit:
            return
        started = time.monotonic()
        deadline = started + HOLD_MAX_MS / 1000
        while envelopes_ahead(self.sent_next, self.applied) > limit:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                break
            self.progressed.clear()
            try:
                await asyncio.wait_for(self.progressed.wait(), left_s)
            except TimeoutError:
                break
        self.metrics.ingest_held_seconds_total.inc(time.monotonic() - started)

    async def _gather_batch(
        self, consumer: AIOKafkaConsumer, undecodable: list[DeadLetter]
    ) -> dict[Any, list[Any]]:
        """``gather_batch`` over ``_getmany``, ending at the first undecodable batch."""

        async def getmany(timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
            return await self._getmany(
                consumer, undecodable, timeout_ms=timeout_ms, max_records=max_records
            )

        return await gather_batch(getmany, self.settings.worker, lambda: bool(undecodable))

    async def _getmany(
        self,
        consumer: AIOKafkaConsumer,
        undecodable: list[DeadLetter],
        *,
        timeout_ms: int,
        max_records: int,
    ) -> dict[Any, list[Any]]:
        """``consumer.getmany``; a batch it cannot decode goes to ``undecodable`` (and the
        consumer past it), the records it had drained are kept (pipeline.stream.undecodable)."""
        try:
            got: dict[Any, list[Any]] = await consumer.getmany(
                timeout_ms=timeout_ms, max_records=max_records
            )
            if got:
                now = wall_ms()
                for tp, messages in got.items():
                    if messages:
                        slot = self.ingest.slot(tp.topic, tp.partition)
                        self.handed.setdefault(slot, []).append((messages[-1].offset, now))
            return got
        except DECODE_ERRORS as exc:
            found = salvage(exc)
            if found is None:
                raise
            if found.tp not in consumer.assignment():  # revoked meanwhile: its next owner meets it
                return found.records
            consumer.seek(found.tp, found.next_offset)
            dead = found.dead_letter(exc)
            undecodable.append(dead)
            log.error(
                "ingest_undecodable_batch",
                topic=found.tp.topic,
                partition=found.tp.partition,
                first_offset=found.first_offset,
                last_offset=found.next_offset - 1,
                codec=found.codec,
                error=dead.detail,
            )
            return found.records

    async def _marks(
        self, consumer: AIOKafkaConsumer, now_ms: int, quiet: bool
    ) -> tuple[list[list[int]], int]:
        """Ingest's marks for the input partitions it reads, and the input topic's
        partition count (``pipeline.stream.marks``)."""
        assigned = consumer.assignment()
        slot = self.ingest.slot
        caught_up = []
        # When the fetch answer that showed each caught-up partition's end came (aiokafka
        # stamps every partition of a fetch answer with the wall time it arrived).
        fetched_ms: dict[int, int] = {}
        for tp in assigned:
            highwater = consumer.highwater(tp)
            if highwater is not None and await consumer.position(tp) >= highwater:
                caught_up.append(slot(tp.topic, tp.partition))
                stamp = consumer.last_poll_timestamp(tp)
                if stamp is not None:
                    fetched_ms[slot(tp.topic, tp.partition)] = int(stamp)
        inputs = self.ingest.input_count(consumer.partitions_for_topic, self.partitions)
        marks = self.marks.marks(
            [slot(tp.topic, tp.partition) for tp in assigned], caught_up, now_ms, fetched_ms, quiet
        )
        return marks, inputs

    async def _ingest_batch(
        self, consumer: AIOKafkaConsumer, batch: dict[Any, Any], undecodable: list[DeadLetter]
    ) -> None:
        # aiokafka's ConsumerRecords carry what ingest reads (topic, partition, offset,
        # key, value): no copy into Record objects.
        records = [m for messages in batch.values() for m in messages]
        now_ms = wall_ms()
        result = self.ingest.process(records, now_ms)
        commits = {tp: messages[-1].offset + 1 for tp, messages in batch.items() if messages}
        for dead in undecodable:
            # Committed past, once its dead letter is acknowledged: never read again.
            tp = TopicPartition(dead.record.topic, dead.record.partition)
            commits[tp] = max(commits.get(tp, 0), dead.record.offset + dead.offsets)
            result.dead.append(dead)
            result.reasons[dead.reason] += dead.offsets
        observe, slot = self.marks.observe, self.ingest.slot
        for record in records:
            observe(slot(record.topic, record.partition), None, now_ms)
        handed, self.handed = self.handed, {}
        for rows in result.rows.values():
            for row in rows:
                observe(row[0], row[5], now_ms, handed_ms(handed, row[0], row[1]))  # type: ignore[arg-type]
        slow = self.marks.slow_arrivals
        if slow:
            self.marks.slow_arrivals = 0
            self.metrics.ingest_slow_arrivals_total.inc(slow)
        marks, inputs = await self._marks(consumer, now_ms, not records and not undecodable)
        targets = self.rounds.targets(result.rows, marks, now_ms)
        if not records and not undecodable and not targets:
            return
        pending: list[Awaitable[Any]] = []
        for partition, rows, envelope_marks in account_envelopes(
            result.rows, marks, self.partitions, targets=targets
        ):
            envelope = dumps({"v": 1, "rows": rows, "marks": envelope_marks, "inputs": inputs})
            pending.append(await self.send_envelope(partition, envelope))
        envelopes = len(pending)
        for dead in result.dead:
            pending.append(await self.send_dead(dead))
        # Offsets are committed only once every envelope and dead letter is acknowledged:
        # a crash before that re-reads the batch, and the account stage skips what it
        # already applied (it remembers the highest input offset per input partition).
        acks = await asyncio.gather(*pending)
        sent_next = self.sent_next
        for ack in acks[:envelopes]:
            sent_next[ack.partition] = max(sent_next.get(ack.partition, 0), ack.offset + 1)
        if not commits:
            return
        try:
            await consumer.commit(commits)
        except CommitFailedError:
            # The group rebalanced meanwhile (its coordinator was cut off or died and this
            # member's session expired): the batch is acknowledged, the partitions' next
            # owner re-reads it from the last commit and the account stage skips it.
            log.warning("ingest_commit_failed_rebalanced", partitions=len(commits))
            self.metrics.ingested(result.valid, result.reasons)
            return
        self.metrics.ingested(result.valid, result.reasons)
        for tp, messages in batch.items():
            highwater = consumer.highwater(tp)
            if highwater is not None and messages:
                self.metrics.lag(tp.partition, highwater - messages[-1].offset - 1)
