"""What the worker sends: a stage's outputs, then, once they are acknowledged, its changelog.

Invariant: a stage's changelog records for an envelope reach the producer only after
every output of that envelope (decisions, alerts, notices, audit rows, forwards, shares)
is acknowledged. Decisions, alerts, forwards and audit rows are skipped for rows whose
state shows them applied, so they must be durable before that state is; the wait runs in
the background, one chain per changelog partition (``pipeline.stream.chains``).

The worker (``pipeline.stream.app``) owns the faust app and the stages; this module owns
the faust topics it writes to and the gathering of forwards and tenant shares
(``pipeline.stream.batching``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import Any

import faust
from aiokafka.partitioner import DefaultPartitioner

from pipeline.contracts.codec import dumps
from pipeline.core.familiar_store import FAMILIAR_ENGINE
from pipeline.core.outbox import ACCOUNT_SHARE, SOURCE_SHARE
from pipeline.logs import get_logger
from pipeline.stream.batching import Batcher
from pipeline.stream.chains import ChangelogChains
from pipeline.stream.envelopes import MAX_ROWS_PER_MESSAGE, StageOutput, latest_shares
from pipeline.stream.faust_app import RAW
from pipeline.stream.ingest import DeadLetter
from pipeline.stream.metrics import WorkerMetrics
from pipeline.stream.partitioning import tenant_partition
from pipeline.topics import Topics

log = get_logger("worker")

ROLLUP = "r"
"""The ``kind`` of the rollup stage's outputs (the account and source stages use their
share kinds, ACCOUNT_SHARE and SOURCE_SHARE)."""

_SLOTS: Any = getattr(FAMILIAR_ENGINE, "partition_slots", None)
"""The compiled engine's ``partition_slots``, or None (``AUTHPIPE_ENGINE=python``, or no
engine built): aiokafka's partitioner then places each decision."""

_STAGE_OF_KIND = {ACCOUNT_SHARE: "account", SOURCE_SHARE: "source", ROLLUP: "rollup"}
"""The stage whose outputs ``Emitter.emit`` sends, by its ``kind``."""


class Emitter:
    """The faust topics of one worker and the sends to them."""

    def __init__(
        self,
        app: faust.App,
        topics: Topics,
        partitions: int,
        metrics: WorkerMetrics,
        linger_ms: int,
    ) -> None:
        self.app = app
        self.partitions = partitions
        self.metrics = metrics
        t = topics
        self.by_account = app.topic(t.by_account, partitions=partitions, **RAW)
        self.by_source = app.topic(t.by_source, partitions=partitions, **RAW)
        self.shares = app.topic(t.shares, partitions=partitions, **RAW)
        self.decisions = app.topic(t.decisions, partitions=partitions, **RAW)
        self.decisions_topic = t.decisions
        self.alerts = app.topic(t.alerts, partitions=partitions, **RAW)
        self.notices = app.topic(t.notices, partitions=partitions, **RAW)
        self.dlq = app.topic(t.dlq, partitions=partitions, **RAW)
        self.audit = app.topic(t.audit, partitions=partitions, **RAW)
        self.chains = ChangelogChains()
        # Forwards and tenant shares of several envelopes go out together (batching.py).
        self.forwarder = Batcher(
            self._send_forwards, linger_ms=linger_ms, max_rows=MAX_ROWS_PER_MESSAGE
        )
        self.sharer = Batcher(
            self._send_shares,
            linger_ms=linger_ms,
            max_rows=MAX_ROWS_PER_MESSAGE,
            merge=latest_shares,
        )

    async def send_envelope(self, partition: int, envelope: bytes) -> Awaitable[Any]:
        """One ingest envelope to its ``attempts-by-account`` partition."""
        return await self.by_account.send(
            key=str(partition).encode(), value=envelope, partition=partition
        )

    async def send_dead(self, dead: DeadLetter) -> Awaitable[Any]:
        """A dead letter, the original bytes with the reason in its headers."""
        return await self.dlq.send(
            key=dead.record.key, value=dead.record.value, headers=dead.headers()
        )

    async def send_decision(self, key: bytes, value: bytes | None) -> Awaitable[Any]:
        """A decision or (``value`` None) its tombstone."""
        return await self.decisions.send(key=key, value=value)

    async def emit(
        self, result: StageOutput, changelog: str, partition: int, kind: str = ROLLUP
    ) -> None:
        """Send a stage's outputs; once they are acknowledged, its changelog. A new mark of
        the account (``kind`` ACCOUNT_SHARE) or source (SOURCE_SHARE) stage goes to every
        downstream partition, with rows or alone."""
        pending: list[Awaitable[Any]] = []
        if result.decisions:
            pending.extend(await self._send_decisions(result.decisions))
        for alert in result.alerts:
            pending.append(await self.alerts.send(value=alert))
        for key, notice in result.notices:
            pending.append(await self.notices.send(key=key, value=notice))
        for audit in result.audit_messages():
            pending.append(
                await self.audit.send(key=str(partition).encode(), value=audit, partition=partition)
            )
        gathering = {self.forwarder.add(target, rows) for target, rows in result.forwards.items()}
        for share in result.shares:
            gathering.add(self.sharer.add(tenant_partition(share[0], self.partitions), [share]))
        if result.mark_ms is not None and kind != ROLLUP:
            # Marks carry no state, so the changelog does not wait for them (a forward's
            # linger would hold every envelope's changelog); a mark lost in a crash is sent
            # again by the first envelope after the restore (``_Stage.rebuild``).
            for target in range(self.partitions):
                if kind == ACCOUNT_SHARE:
                    self.forwarder.add(target, [[partition, -1, result.mark_ms]])
                self.sharer.add(target, [[None, result.mark_ms, kind, partition]])
        pending.extend(gathering)
        # The changelog could overtake the outputs on the producer: it waits for them.
        if result.changelog:
            records = result.changelog
            await self.chains.add(
                (changelog, partition),
                pending,
                lambda: self._send_changelog(changelog, partition, records),
            )
        self.metrics.emitted(result, _STAGE_OF_KIND[kind])

    async def drain(self, keys: Iterable[Any] | None) -> None:
        """Write the changelogs still waiting, of ``keys`` (changelog, partition) or (None)
        all of them; a failed send is logged (the agent that owns it crashes on it too)."""
        try:
            # The chains wait for forwards and shares still gathering: send those first.
            await self.forwarder.flush_all()
            await self.sharer.flush_all()
            await self.chains.drain(keys)
        except Exception as exc:
            log.error("changelog_write_failed", error=repr(exc))

    async def _send_decisions(self, records: list[tuple[bytes, bytes | None]]) -> list[Any]:
        """An envelope's decisions (a first sign-in's two exempts among them) as whole
        record batches, one per decisions partition, on faust's aiokafka producer; their
        acknowledgements. Each key goes to the partition aiokafka's own partitioner gives
        it (the producer's ``_partition``: murmur2 of the key, as a plain ``send`` and
        every earlier worker placed it), so a key's records stay on one partition, in
        order, and compaction keeps its latest. One ``Topic.send`` a decision cost tens of
        microseconds in faust's buffer (B7 with first sign-ins, bench/README.md)."""
        faust_producer: Any = self.app.producer
        producer = faust_producer._ensure_producer()
        topic = self.decisions_topic
        await producer.partitions_for(topic)  # the metadata ``_partition`` reads
        targets = place_keys(producer, topic, [key for key, _ in records])
        by_partition: dict[int, list[tuple[bytes, bytes | None]]] = {}
        for target, record in zip(targets, records, strict=True):
            by_partition.setdefault(target, []).append(record)
        sent: list[Any] = []
        for target, batch in by_partition.items():
            sent.extend(await send_records(producer, topic, target, batch))
        return sent

    async def _send_forwards(self, target: int, rows: list[list[Any]]) -> Awaitable[Any]:
        envelope = dumps({"v": 1, "rows": rows})
        return await self.by_source.send(key=str(target).encode(), value=envelope, partition=target)

    async def _send_shares(self, target: int, shares: list[list[Any]]) -> Awaitable[Any]:
        return await self.shares.send(
            key=str(target).encode(), value=dumps(shares), partition=target
        )

    async def _send_changelog(
        self, topic: str, partition: int, records: list[tuple[bytes, bytes | None]]
    ) -> None:
        """An envelope's changed keys as whole record batches on the stage's changelog, on
        faust's own aiokafka producer (faust flushes it before it commits input offsets)."""
        faust_producer: Any = self.app.producer
        await send_records(faust_producer._ensure_producer(), topic, partition, records)


def place_keys(producer: Any, topic: str, keys: list[bytes]) -> list[int]:
    """Each key's partition of ``topic`` as the aiokafka ``producer``'s own partitioner
    gives it (``_partition``: Kafka's murmur2 of the key over the partitions its metadata
    lists, in that list's order). With aiokafka's default partitioner and the compiled
    engine installed, the hash runs in the engine (``partition_slots``, one call for all
    ``keys``; aiokafka's is Python, about 13 us a key); the differential test
    (tests/unit/test_engine_partition.py) holds the two equal."""
    if _SLOTS is None or type(producer._partitioner) is not DefaultPartitioner:
        return [producer._partition(topic, None, key, None, key, None) for key in keys]
    partitions = list(producer._metadata.partitions_for_topic(topic))
    return [partitions[slot] for slot in _SLOTS(keys, len(partitions))]


async def send_records(
    producer: Any, topic: str, partition: int, records: list[tuple[bytes, bytes | None]]
) -> list[Awaitable[Any]]:
    """``records`` as whole record batches to ``topic`` ``partition`` on an aiokafka
    producer; the batches' acknowledgements.

    A faust table's ``send_changelog`` cost one trip through faust's producer buffer and
    one produce future per key (tens of microseconds each); a record batch costs about a
    microsecond per key."""
    sent = []
    batch = producer.create_batch()
    for key, value in records:
        if batch.append(key=key, value=value, timestamp=None) is None:
            sent.append(await producer.send_batch(batch, topic, partition=partition))
            batch = producer.create_batch()
            batch.append(key=key, value=value, timestamp=None)
    sent.append(await producer.send_batch(batch, topic, partition=partition))
    return sent
