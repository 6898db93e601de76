"""The faust-streaming worker: ingest loop, agents over batch envelopes, changelogs, web.

Invariants: faust iterates envelopes, never single events. The input topic is read by an
aiokafka ``getmany`` loop inside the faust worker (``ingest``), which validates and
normalises a whole batch, dead-letters bad events, and writes ONE envelope per target
partition to the internal ``attempts-by-account`` topic; the agents iterate envelopes, and
each changed state key is written to its changelog once per envelope. (Why: faust's cost
per iterated message and per table write; figures in bench/README.md, "Where the time
goes".)

Flow inside one worker (every worker runs every stage; partitions spread the work):

    auth.login-attempts --ingest--> attempts-by-account --account agent--> decisions,
    alerts, audit, attempts-by-source --source agent--> decisions, alerts
    shares from both agents --> tenant-shares --rollup agent--> spray_tenant alerts

State lives in the stages' core shards, made durable by compacted changelog topics (one
per stage, written as record batches after an envelope's outputs are acknowledged). On
assignment the worker reads each assigned partition's changelog back with an aiokafka
reader (``pipeline.stream.restore``) and rebuilds the shard from it before the
partition's first envelope, expiring what was kept past its time. Two workers in one group
own disjoint partitions, so a limit is enforced once, never twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import Any

import faust
from aiokafka.structs import TopicPartition

from pipeline.clock import wall_ms
from pipeline.contracts.codec import dumps, loads
from pipeline.core.outbox import ACCOUNT_SHARE, SOURCE_SHARE
from pipeline.core.policy import Policy
from pipeline.kafka_client import security_kwargs
from pipeline.logs import get_logger
from pipeline.settings import Settings
from pipeline.stream.batching import Batcher
from pipeline.stream.chains import ChangelogChains
from pipeline.stream.envelopes import (
    MAX_ROWS_PER_MESSAGE,
    StageOutput,
    commit_key,
    latest_shares,
)
from pipeline.stream.faust_app import RAW, new_app
from pipeline.stream.ingest import DeadLetter, Ingest
from pipeline.stream.ingest_loop import IngestLoop
from pipeline.stream.metrics import WorkerMetrics, log_late
from pipeline.stream.partitioning import tenant_partition
from pipeline.stream.progress import Admit, InputOrder
from pipeline.stream.restore import ChangelogRestore, LiveRecords
from pipeline.stream.rollup_stage import RollupStage
from pipeline.stream.stages import AccountStage, SourceStage
from pipeline.topics import Topics

log = get_logger("worker")


_STAGE_OF_KIND = {ACCOUNT_SHARE: "account", SOURCE_SHARE: "source", "r": "rollup"}
"""The stage whose outputs ``Worker._emit`` sends, by its ``kind``."""


class Worker:
    """Builds the faust app and holds the stages; faust callbacks are thin calls in."""

    def __init__(self, settings: Settings, policy: Policy) -> None:
        self.settings = settings
        self.policy = policy
        kafka = settings.kafka
        self.partitions = kafka.partitions
        self.topics = Topics.from_settings(kafka)
        self.metrics = WorkerMetrics()
        self.ingest = Ingest.from_settings(settings, policy)
        dedupe = {
            "dedupe_horizon_ms": settings.ingest.dedupe_horizon_ms,
            "dedupe_capacity": settings.ingest.dedupe_capacity,
        }
        self.accounts = AccountStage(
            policy, kafka.partitions, input_topic=kafka.input_topic, **dedupe
        )
        self.sources = SourceStage(policy, kafka.partitions)
        self.rollup = RollupStage(policy, kafka.partitions)
        self.ingest_loop = IngestLoop(
            settings,
            self.topics,
            self.ingest,
            self.metrics,
            send_envelope=self._send_envelope,
            send_dead=self._send_dead,
        )
        # Envelopes in offset order whatever faust delivers (pipeline.stream.progress);
        # per agent topic, its channel (queue) and whether it is mid-envelope.
        self.order = InputOrder()
        self.chains = ChangelogChains()
        # Forwards and tenant shares of several envelopes go out together (batching.py).
        linger_ms = settings.worker.forward_linger_ms
        self.forwarder = Batcher(
            self._send_forwards, linger_ms=linger_ms, max_rows=MAX_ROWS_PER_MESSAGE
        )
        self.sharer = Batcher(
            self._send_shares,
            linger_ms=linger_ms,
            max_rows=MAX_ROWS_PER_MESSAGE,
            merge=latest_shares,
        )
        self.channels: dict[str, Any] = {}
        self.busy: dict[str, bool] = {}
        t = self.topics
        # Each agent topic's changelog: a partition's state lives in the same partition.
        self.changelogs = {
            t.by_account: t.changelog("account-state"),
            t.by_source: t.changelog("source-state"),
            t.shares: t.changelog("rollup-state"),
        }
        self.restore = ChangelogRestore(
            kafka.bootstrap_servers, self._install, security_kwargs(kafka), commit_key
        )
        self.app = self._build_app()

    # -- the faust app ------------------------------------------------------------------

    def _build_app(self) -> faust.App:
        app = new_app(self.settings)
        t = self.topics
        self.by_account = app.topic(t.by_account, partitions=self.partitions, **RAW)
        self.by_source = app.topic(t.by_source, partitions=self.partitions, **RAW)
        self.shares = app.topic(t.shares, partitions=self.partitions, **RAW)
        self.decisions = app.topic(t.decisions, partitions=self.partitions, **RAW)
        self.alerts = app.topic(t.alerts, partitions=self.partitions, **RAW)
        self.notices = app.topic(t.notices, partitions=self.partitions, **RAW)
        self.dlq = app.topic(t.dlq, partitions=self.partitions, **RAW)
        self.audit = app.topic(t.audit, partitions=self.partitions, **RAW)
        # No faust tables: the changelog topics are created with the others
        # (pipeline.topics, compacted) and read back by pipeline.stream.restore.
        app.agent(self.by_account, name="account-stage")(self._account_agent)
        app.agent(self.by_source, name="source-stage")(self._source_agent)
        app.agent(self.shares, name="rollup-stage")(self._rollup_agent)
        app.task(self._quiet_library_logging)
        app.task(self.ingest_loop.run)
        app.timer(1.0)(self._expire_tick)
        app.on_partitions_revoked.connect(self._on_revoked)  # type: ignore[arg-type]
        app.on_partitions_assigned.connect(self._on_assigned)  # type: ignore[arg-type]
        app.on_before_shutdown.connect(self._on_shutdown)  # type: ignore[arg-type]
        self._add_views(app)
        return app

    def _add_views(self, app: faust.App) -> None:
        # faust calls a page function as fun(view, request); plain closures, not methods.
        async def metrics(web: Any, request: Any) -> Any:
            self.metrics.observe_state(self.accounts, self.sources, self.rollup, self.ready())
            body, content_type = self.metrics.render()
            return web.bytes(body, content_type=content_type)

        async def readyz(web: Any, request: Any) -> Any:
            ready = self.ready()
            return web.json({"ready": ready}, status=200 if ready else 503)

        async def healthz(web: Any, request: Any) -> Any:
            return web.json({"ok": True})

        app.page("/metrics")(metrics)
        app.page("/readyz")(readyz)
        app.page("/healthz")(healthz)

    async def _quiet_library_logging(self) -> None:
        """Undo faust's terminal spinner: its worker sets the root logger to DEBUG (and adds
        a DEBUG handler) whatever ``loglevel`` says, so every debug call in aiokafka and
        faust built a LogRecord (about 10 % of the worker's CPU). Runs once at start."""
        root = logging.getLogger()
        root.setLevel(logging.WARNING)
        for handler in list(root.handlers):
            if type(handler).__name__ == "SpinnerHandler":
                root.removeHandler(handler)

    async def _send_envelope(self, partition: int, envelope: bytes) -> Awaitable[Any]:
        return await self.by_account.send(
            key=str(partition).encode(), value=envelope, partition=partition
        )

    async def _send_dead(self, dead: DeadLetter) -> Awaitable[Any]:
        return await self.dlq.send(
            key=dead.record.key, value=dead.record.value, headers=dead.headers()
        )

    # -- agents -------------------------------------------------------------------------

    async def _install(self, changelog: TopicPartition, live: LiveRecords) -> None:
        """Rebuild a stage's shard from its partition's live changelog records (called by
        ``ChangelogRestore`` once it has read the partition back)."""
        partition = changelog.partition
        if changelog.topic == self.changelogs[self.topics.shares]:
            self.rollup.rebuild(partition, live.items())
            return
        stage = (
            self.accounts
            if changelog.topic == self.changelogs[self.topics.by_account]
            else self.sources
        )
        rebuilt = stage.rebuild(partition, live.items())
        await self._emit(
            rebuilt,
            changelog.topic,
            partition,
            ACCOUNT_SHARE if stage is self.accounts else SOURCE_SHARE,
        )

    async def _restored(self, topic: str, partition: int) -> None:
        """Until the stage of ``topic`` holds ``partition``'s state, or the partition is
        revoked."""
        await self.restore.wait(TopicPartition(self.changelogs[topic], partition))

    async def _account_agent(self, stream: Any) -> None:
        await self._run_stage(
            stream, "account", self.accounts, self.changelogs[self.topics.by_account]
        )

    async def _source_agent(self, stream: Any) -> None:
        await self._run_stage(
            stream, "source", self.sources, self.changelogs[self.topics.by_source]
        )

    async def _run_stage(
        self, stream: Any, name: str, stage: AccountStage | SourceStage, changelog: str
    ) -> None:
        """Apply envelopes to ``stage`` strictly in offset order per partition."""
        async for message in self._messages(stream):
            partition = message.partition
            if not stage.owns(partition):
                await self._restored(message.topic, partition)
                if not stage.owns(partition):
                    continue  # revoked meanwhile: its next owner applies it
            if not await self._in_order(stage, message):
                continue
            started = time.perf_counter()
            envelope = loads(message.value)
            rows = envelope["rows"]
            if stage is self.accounts:
                result = self.accounts.process(
                    partition, message.offset, rows, envelope.get("marks"), envelope.get("inputs")
                )
            else:
                result = self.sources.process(partition, message.offset, rows)
            await self._emit(result, changelog, partition, name[0])
            self.metrics.stage(name, len(rows), result, time.perf_counter() - started)
            log_late(name, message, result)

    async def _in_order(
        self, stage: AccountStage | SourceStage | RollupStage, message: Any
    ) -> bool:
        """True if ``message`` is the envelope ``stage`` expects next on its partition; an
        out-of-order one is skipped and its partition sought back (pipeline.stream.progress)."""
        tp, partition = message.tp, message.partition
        expected = stage.expected(partition)
        if expected is None:
            # No state yet: this partition starts at its log start offset.
            expected = (await self.app.consumer.earliest_offsets(tp)).get(tp, 0)
            stage.next_envelope[partition] = expected
        verdict = self.order.admit(tp, message.offset, expected, time.monotonic())
        if verdict is Admit.APPLY:
            return True
        if verdict is Admit.REPLAY:
            self.metrics.replayed_envelopes_total.labels(topic=tp.topic).inc()
        elif verdict is Admit.SEEK:
            # Only a stage restored with rows held can expect an offset the topic deleted;
            # asking the broker on every seek stalled the agents (faust's consumer thread
            # answers it, and its delivery waits on the agents: B2 in bench/README.md).
            earliest = (
                (await self.app.consumer.earliest_offsets(tp)).get(tp, 0)
                if stage.reholding(partition, expected)
                else 0
            )
            if expected < earliest:
                # The input message holding the oldest held row is past the topic's
                # retention: its held rows are gone (counted, logged), the rest goes on.
                log.error(
                    "stage_held_rows_deleted",
                    topic=tp.topic,
                    partition=partition,
                    hold_from=expected,
                    log_start=earliest,
                )
                self.metrics.held_rows_deleted_total.labels(topic=tp.topic).inc()
                stage.skip_to(partition, earliest)
                return await self._in_order(stage, message)
            await self._seek_back(tp, expected, message.offset, "hole")
        return False

    async def _seek_back(self, tp: Any, offset: int, seen: int, reason: str) -> None:
        log.warning(
            "stream_seek_back",
            topic=tp.topic,
            partition=tp.partition,
            offset=offset,
            seen=seen,
            reason=reason,
        )
        self.metrics.seek_backs_total.labels(topic=tp.topic).inc()
        # seek_wait seeks in faust's consumer thread, which owns the aiokafka consumer;
        # ``consumer.seek`` calls into it from this thread, and a fetch in flight there
        # then crashed the worker (aiokafka's fetched_records: KeyError on the partition).
        await self.app.consumer.seek_wait({tp: offset})

    async def _rollup_agent(self, stream: Any) -> None:
        changelog = self.changelogs[self.topics.shares]
        async for message in self._messages(stream):
            partition = message.partition
            if not self.rollup.owns(partition):
                await self._restored(message.topic, partition)
                if not self.rollup.owns(partition):
                    continue  # revoked meanwhile: its next owner applies it
            if not await self._in_order(self.rollup, message):
                continue
            result = self.rollup.process(partition, loads(message.value), message.offset)
            await self._emit(result, changelog, partition)
            log_late("rollup", message, result)

    async def _messages(self, stream: Any) -> AsyncIterator[Any]:
        """The agent's messages, marking the agent busy while its body runs (for the
        stranded-partition check in ``_seek_stranded``)."""
        topic = stream.channel.get_topic_name()
        self.channels[topic] = stream.channel
        async for event in stream.events():
            self.busy[topic] = True
            try:
                yield event.message
            finally:
                self.busy[topic] = False

    async def _emit(
        self, result: StageOutput, changelog: str, partition: int, kind: str = "r"
    ) -> None:
        """Send a stage's outputs; once they are acknowledged, its changelog. A new mark of
        the account (``kind`` ACCOUNT_SHARE) or source (SOURCE_SHARE) stage goes to every downstream
        partition, with rows or alone."""
        pending: list[Awaitable[Any]] = []
        for key, value in result.decisions:
            pending.append(await self.decisions.send(key=key, value=value))
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
        if result.mark_ms is not None and kind != "r":
            # Marks carry no state, so the changelog does not wait for them (a forward's
            # linger would hold every envelope's changelog); a mark lost in a crash is sent
            # again by the first envelope after the restore (``_Stage.rebuild``).
            for target in range(self.partitions):
                if kind == ACCOUNT_SHARE:
                    self.forwarder.add(target, [[partition, -1, result.mark_ms]])
                self.sharer.add(target, [[None, result.mark_ms, kind, partition]])
        pending.extend(gathering)
        # The changelog is written once these are acknowledged: decisions, alerts, forwards
        # and audit rows are skipped for rows whose state shows them applied, so they must
        # be durable before that state is (the changelog goes straight to the producer and
        # could overtake them). The wait runs in the background (pipeline.stream.chains).
        if result.changelog:
            records = result.changelog
            await self.chains.add(
                (changelog, partition),
                pending,
                lambda: self._send_changelog(changelog, partition, records),
            )
        self.metrics.emitted(result, _STAGE_OF_KIND[kind])

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
        """An envelope's changed keys as whole record batches on the stage's changelog.

        A faust table's ``send_changelog`` cost one trip through faust's producer buffer
        and one produce future per key (tens of microseconds each); a record batch costs
        about a microsecond per key. The producer is faust's (it flushes it before it
        commits input offsets)."""
        faust_producer: Any = self.app.producer
        producer = faust_producer._ensure_producer()  # the aiokafka producer faust flushes
        batch = producer.create_batch()
        for key, value in records:
            if batch.append(key=key, value=value, timestamp=None) is None:
                await producer.send_batch(batch, topic, partition=partition)
                batch = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None)
        await producer.send_batch(batch, topic, partition=partition)

    # -- timers, rebalances, web ----------------------------------------------------------

    async def _expire_tick(self) -> None:
        self._restore_assigned()
        await self._seek_stranded()
        now = wall_ms()
        for key, value in [*self.accounts.expire(now), *self.sources.expire(now)]:
            await self.decisions.send(key=key, value=value)
            self.metrics.decisions_total.labels(kind="tombstone").inc()

    def _unrestored(self, assigned: Iterable[TopicPartition]) -> list[TopicPartition]:
        """The changelog partitions of ``assigned`` whose stage does not hold them yet."""
        owners = {
            self.topics.by_account: self.accounts.owns,
            self.topics.by_source: self.sources.owns,
            self.topics.shares: self.rollup.owns,
        }
        return [
            TopicPartition(self.changelogs[tp.topic], tp.partition)
            for tp in assigned
            if tp.topic in owners and not owners[tp.topic](tp.partition)
        ]

    async def _on_assigned(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        """Read the assigned partitions' changelogs back at once, in the background, so
        a restarted worker holds its counters and decisions before the first new event."""
        assigned: Iterable[TopicPartition] = args[0] if args else kwargs.get("assigned", ())
        self.restore.start(self._unrestored(assigned))

    def _restore_assigned(self) -> None:
        """Start reading back any assigned partition nobody is restoring (a safety net:
        ``_on_assigned`` starts them all)."""
        self.restore.start(self._unrestored(self.app.consumer.assignment()))

    async def _seek_stranded(self) -> None:
        """Seek partitions whose last messages faust dropped (nothing later arrives to
        reveal the hole) back to the offset their stage expects."""
        if not self.ready():
            return
        consumer: Any = self.app.consumer
        now_s = time.monotonic()
        stages: dict[str, tuple[str, AccountStage | SourceStage | RollupStage]] = {
            self.topics.by_account: ("account", self.accounts),
            self.topics.by_source: ("source", self.sources),
            self.topics.shares: ("rollup", self.rollup),
        }
        behind = {name: 0 for name, _ in stages.values()}
        for tp in consumer.assignment():
            name, stage = stages.get(tp.topic, ("", None))
            channel = self.channels.get(tp.topic)
            expected = stage.expected(tp.partition) if stage is not None else None
            if channel is None or expected is None:
                continue
            idle = not self.busy.get(tp.topic) and channel.queue.empty()
            highwater = consumer.highwater(tp)
            if highwater is not None and highwater > expected:
                behind[name] += highwater - expected
            if self.order.stranded(
                tp, expected=expected, highwater=highwater, idle=idle, now_s=now_s
            ):
                await self._seek_back(tp, expected, highwater, "stranded")
        for name, messages in behind.items():
            self.metrics.stage_behind.labels(stage=name).set(messages)

    async def _on_shutdown(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        """Write every changelog still waiting for acknowledgements before faust stops."""
        await self.restore.stop()
        await self._drain_chains(None)

    async def _drain_chains(self, keys: Iterable[Any] | None) -> None:
        try:
            # The chains wait for forwards and shares still gathering: send those first.
            await self.forwarder.flush_all()
            await self.sharer.flush_all()
            await self.chains.drain(keys)
        except Exception as exc:  # a send failed: the agent that owns it crashes on it too
            log.error("changelog_write_failed", error=repr(exc))

    async def _on_revoked(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        revoked: Iterable[TopicPartition] = args[0] if args else kwargs.get("revoked", ())
        # The next owner rebuilds from the changelog: write what is waiting first.
        revoked = list(revoked)
        changelogs = [
            (self.changelogs[tp.topic], tp.partition)
            for tp in revoked
            if tp.topic in self.changelogs
        ]
        await self._drain_chains(changelogs)
        self.restore.cancel([TopicPartition(topic, partition) for topic, partition in changelogs])
        for tp in revoked:
            self.order.forget(tp)
            if tp.topic == self.topics.by_account:
                self.accounts.drop(tp.partition)
            elif tp.topic == self.topics.by_source:
                self.sources.drop(tp.partition)
            elif tp.topic == self.topics.shares:
                self.rollup.drop(tp.partition)

    def ready(self) -> bool:
        recovery: Any = self.app.tables.recovery  # type: ignore[attr-defined]
        return (
            self.ingest_loop.ready.is_set()
            and recovery.completed.is_set()
            and not recovery.in_recovery
            and not self.app.rebalancing
            and not self._unrestored(self.app.consumer.assignment())
        )
