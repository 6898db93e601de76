"""Reading the stages' changelogs back at assignment: one aiokafka reader, whole fetches.

Invariant: a partition's state is read with ``getmany`` in fetches of megabytes, never a
record at a time through faust's table recovery (which replays a memory-store changelog
message by message; the restart figures that decided this are B6 in bench/README.md).

``read_changelogs`` folds each partition into its live records (the last value per key,
deleted keys dropped: what a fully compacted changelog holds, and what faust's memory store
held), in first-write order like faust's store, and yields each partition once it has read
up to the end offset it saw at start. Only whole messages count (``ChangelogFold``): a stage
writes one message's records in order and its commit record last, so the records after a
partition's last commit record are a crash's torn tail, and are dropped. The previous owner of a partition writes its pending
changelog before it gives the partition up (the worker drains its chains on revocation),
so that end offset covers every record of the state it left.

``ChangelogRestore`` runs one reader per assignment in the background and tells a waiter
when a partition's state is installed; a partition asked for before its assignment's
reader reached it gets a reader of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Hashable, Mapping
from types import MappingProxyType
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from pipeline.errors import AuthpipeError
from pipeline.logs import get_logger

log = get_logger("restore")

LiveRecords = dict[bytes, bytes]
_PLAIN: Mapping[str, Any] = MappingProxyType({})  # no TLS/SASL options (PLAINTEXT)
# Whole partitions in few round trips: a changelog record is 100-300 bytes.
FETCH_PARTITION_BYTES = 16 * 1024 * 1024
FETCH_TOTAL_BYTES = 64 * 1024 * 1024


class RestoreError(AuthpipeError):
    """A changelog could not be read back: the broker is unreachable or the topic is gone."""


class ChangelogFold:
    """One changelog partition folded to its live records, whole messages only.

    Invariant: ``live`` holds exactly the records up to the last one keyed ``commit_key``
    (the stage's "next" record, the last of every message it applies). A crash may leave
    any prefix of a message's records written (a message can span several record
    batches); that torn tail is held in ``pending`` and never reaches ``live``, so the state
    restored is the state after a whole message, and the stage applies the torn message
    again from its start, writing the same records (it is deterministic). With
    ``commit_key`` None every record counts at once."""

    def __init__(self, commit_key: bytes | None) -> None:
        self.commit_key = commit_key
        self.live: LiveRecords = {}
        self.pending: dict[bytes, bytes | None] = {}

    def add(self, key: bytes, value: bytes | None) -> None:
        if self.commit_key is None:
            self._apply(key, value)
            return
        self.pending[key] = value
        if key == self.commit_key:
            for pending_key, pending_value in self.pending.items():
                self._apply(pending_key, pending_value)
            self.pending.clear()

    def _apply(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            self.live.pop(key, None)
        else:
            self.live[key] = value

    @property
    def torn(self) -> int:
        """Records after the last commit record: a torn tail, not part of ``live``."""
        return len(self.pending)


CommitKey = Callable[[int], bytes]
"""The commit record's key in a changelog partition (``pipeline.stream.envelopes.commit_key``)."""


async def read_changelogs(
    bootstrap_servers: str,
    tps: Collection[TopicPartition],
    security: Mapping[str, Any] = _PLAIN,
    commit_key: CommitKey | None = None,
    on_read: Callable[[int], None] | None = None,
) -> AsyncIterator[tuple[TopicPartition, LiveRecords]]:
    """Each of ``tps`` read from its start to the end offset seen at start, folded to its
    live records (whole messages only, given ``commit_key``: see ``ChangelogFold``); yielded
    as each partition completes (in no particular order). ``on_read`` is told how many
    records each fetch brought (the worker's stuck watch counts them as progress)."""
    if not tps:
        return
    # "earliest", not the default "latest": ``assign`` starts a position reset in the
    # background with this strategy, and one that answers after ``seek_to_beginning``
    # would leave the reader at the end, reading nothing (seen on this broker: an empty
    # restore of a full changelog). The explicit seek below sets the position at once.
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=FETCH_PARTITION_BYTES,
        fetch_max_bytes=FETCH_TOTAL_BYTES,
        fetch_max_wait_ms=100,
        **security,
    )
    try:
        await consumer.start()
    except Exception as exc:
        raise RestoreError(
            f"cannot reach the broker at {bootstrap_servers} to read the changelogs back "
            f"({exc!r}); check kafka.bootstrap_servers and that the broker is up"
        ) from exc
    try:
        wanted = list(tps)
        consumer.assign(wanted)
        starts: dict[TopicPartition, int] = await consumer.beginning_offsets(wanted)
        ends: dict[TopicPartition, int] = await consumer.end_offsets(wanted)
        for tp in wanted:
            consumer.seek(tp, starts[tp])
        folds = {
            tp: ChangelogFold(commit_key(tp.partition) if commit_key else None) for tp in wanted
        }
        remaining: set[TopicPartition] = set()
        for tp in wanted:
            if await consumer.position(tp) >= ends[tp]:
                consumer.pause(tp)
                yield tp, folds.pop(tp).live
            else:
                remaining.add(tp)
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=500)
            for tp, messages in batch.items():
                add = folds[tp].add
                for message in messages:
                    add(message.key, message.value)
                if on_read is not None:
                    on_read(len(messages))
            for tp in list(remaining):
                # The position, not the last offset read: compaction and transaction
                # markers leave gaps, so the last record may sit below the end offset.
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
                    consumer.pause(tp)
                    fold = folds.pop(tp)
                    if fold.torn:
                        log.warning(
                            "changelog_torn_tail_dropped",
                            topic=tp.topic,
                            partition=tp.partition,
                            records=fold.torn,
                        )
                    yield tp, fold.live
    finally:
        await consumer.stop()


Install = Callable[[TopicPartition, LiveRecords], Awaitable[None]]


class ChangelogRestore:
    """Background readers of changelog partitions, and who is waiting for which.

    ``start`` begins one reader for a set of changelog partitions (an assignment);
    ``install`` is called with each partition's live records as soon as it is read, and
    ``wait`` returns once the partition is installed. ``cancel`` forgets partitions that
    were revoked before their reader finished: it still reads them, but installs nothing.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        install: Install,
        security: Mapping[str, Any] = _PLAIN,
        commit_key: CommitKey | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.security = security
        self.commit_key = commit_key
        self.install = install
        self.pending: dict[Hashable, asyncio.Future[None]] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.records_read = 0  # by every reader so far: restores that read are progressing

    def start(self, tps: Collection[TopicPartition]) -> None:
        """Read ``tps`` back (those not already being read) in one background task."""
        fresh = [tp for tp in tps if tp not in self.pending]
        if not fresh:
            return
        loop = asyncio.get_running_loop()
        for tp in fresh:
            self.pending[tp] = loop.create_future()
        task = asyncio.ensure_future(self._run(fresh))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def wait(self, tp: TopicPartition) -> None:
        """Until ``tp`` is installed (reading it back now if nobody is), or revoked."""
        if tp not in self.pending:
            self.start([tp])
        future = self.pending[tp]
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            if not future.cancelled():
                raise  # the waiter itself is being cancelled

    def restoring(self) -> int:
        """Partitions asked for and not yet installed."""
        return sum(1 for future in self.pending.values() if not future.done())

    def cancel(self, tps: Collection[TopicPartition]) -> None:
        """``tps`` were revoked: their state must not be installed any more."""
        for tp in tps:
            future = self.pending.pop(tp, None)
            if future is not None and not future.done():
                future.cancel()

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def _read(self, records: int) -> None:
        self.records_read += records

    async def _run(self, tps: list[TopicPartition]) -> None:
        started_s = asyncio.get_running_loop().time()
        records = 0
        try:
            async for tp, live in read_changelogs(
                self.bootstrap_servers, tps, self.security, self.commit_key, self._read
            ):
                future = self.pending.get(tp)
                if future is None or future.done():
                    continue  # revoked meanwhile
                records += len(live)
                await self.install(tp, live)
                if not future.done():
                    future.set_result(None)
        except Exception as exc:  # the waiters (the agents) raise it and crash the worker
            log.error("changelog_restore_failed", partitions=len(tps), error=repr(exc))
            for tp in tps:
                future = self.pending.get(tp)
                if future is not None and not future.done():
                    future.set_exception(exc)
            return
        log.info(
            "changelog_restored",
            partitions=len(tps),
            live_records=records,
            seconds=round(asyncio.get_running_loop().time() - started_s, 3),
        )
