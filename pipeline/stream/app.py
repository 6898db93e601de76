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
own disjoint partitions, so a limit is enforced once, never twice. What the stages send,
and the changelog's wait for it, is ``pipeline.stream.emit``'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import faust
from aiokafka.structs import TopicPartition

from pipeline.clock import wall_ms
from pipeline.contracts.codec import loads
from pipeline.core.outbox import ACCOUNT_SHARE, SOURCE_SHARE
from pipeline.core.policy import Policy
from pipeline.kafka_client import security_kwargs
from pipeline.logs import get_logger
from pipeline.settings import Settings
from pipeline.stream.emit import Emitter
from pipeline.stream.envelopes import commit_key
from pipeline.stream.faust_app import new_app
from pipeline.stream.ingest import Ingest
from pipeline.stream.ingest_loop import IngestLoop
from pipeline.stream.metrics import WorkerMetrics, log_late
from pipeline.stream.progress import Admit, InputOrder
from pipeline.stream.restore import ChangelogRestore, LiveRecords
from pipeline.stream.rollup_stage import RollupStage
from pipeline.stream.stages import AccountStage, SourceStage
from pipeline.stream.watch import StuckWatch
from pipeline.topics import Topics

log = get_logger("worker")

SEEK_TIMEOUT_S = 30.0
"""A seek back not done in this long is given up (logged) and tried again later: faust's
consumer thread answers it, and a timer waiting on it for good would stop every check."""
WATCH_INTERVAL_S = 5.0
"""How often the stuck watch (``pipeline.stream.watch``) looks at every partition."""


class Worker:
    """Builds the faust app and holds the stages; faust callbacks are thin calls in."""

    def __init__(self, settings: Settings, policy: Policy) -> None:
        self.policy = policy
        kafka = settings.kafka
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
        self.app = new_app(settings)
        self.out = Emitter(
            self.app,
            self.topics,
            kafka.partitions,
            self.metrics,
            linger_ms=settings.worker.forward_linger_ms,
        )
        self.ingest_loop = IngestLoop(
            settings,
            self.topics,
            self.ingest,
            self.metrics,
            send_envelope=self.out.send_envelope,
            send_dead=self.out.send_dead,
            applied=self._account_applied,
        )
        # Envelopes in offset order whatever faust delivers (pipeline.stream.progress);
        # per agent topic, its channel (queue) and whether it is mid-envelope.
        self.order = InputOrder()
        self.watch = StuckWatch(settings.worker.stuck_after_s, lambda: self.out.drain(None))
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
        self._wire(self.app)

    # -- the faust app ------------------------------------------------------------------

    def _wire(self, app: faust.App) -> None:
        """Register the agents, tasks, timer, signals and pages on ``app``."""
        # No faust tables: the changelog topics are created with the others
        # (pipeline.topics, compacted) and read back by pipeline.stream.restore.
        app.agent(self.out.by_account, name="account-stage")(self._account_agent)
        app.agent(self.out.by_source, name="source-stage")(self._source_agent)
        app.agent(self.out.shares, name="rollup-stage")(self._rollup_agent)
        app.task(self._quiet_library_logging)
        app.task(self.ingest_loop.run)
        app.timer(1.0)(self._expire_tick)
        app.timer(WATCH_INTERVAL_S)(self._watch_tick)
        app.on_partitions_revoked.connect(self._on_revoked)  # type: ignore[arg-type]
        app.on_partitions_assigned.connect(self._on_assigned)  # type: ignore[arg-type]
        app.on_before_shutdown.connect(self._on_shutdown)  # type: ignore[arg-type]
        self._add_views(app)

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

    # -- agents -------------------------------------------------------------------------

    def _account_applied(self, partition: int) -> int | None:
        """The account stage's next offset on ``partition`` if it holds it here (ingest's
        backpressure, ``pipeline.stream.ingest_loop``)."""
        return self.accounts.expected(partition) if self.accounts.owns(partition) else None

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
        await self.out.emit(
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
            await self.out.emit(result, changelog, partition, name[0])
            if stage is self.accounts:
                self.ingest_loop.stage_progressed()
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
        try:
            await asyncio.wait_for(self.app.consumer.seek_wait({tp: offset}), SEEK_TIMEOUT_S)
        except Exception as exc:  # a failed seek is tried again, never fatal
            log.error(
                "stream_seek_failed",
                topic=tp.topic,
                partition=tp.partition,
                offset=offset,
                error=repr(exc),
                action="tried again by the stranded or hole check",
            )

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
            await self.out.emit(result, changelog, partition)
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

    # -- timers, rebalances, web ----------------------------------------------------------

    async def _expire_tick(self) -> None:
        self._restore_assigned()
        await self._seek_stranded()
        now = wall_ms()
        for key, value in [*self.accounts.expire(now), *self.sources.expire(now)]:
            await self.out.send_decision(key, value)
            self.metrics.decisions_total.labels(kind="tombstone").inc()

    def _unrestored(self, assigned: Iterable[TopicPartition]) -> list[TopicPartition]:
        """The changelog partitions of ``assigned`` whose stage does not hold them yet."""
        stages = self._stages()
        return [
            TopicPartition(self.changelogs[tp.topic], tp.partition)
            for tp in assigned
            if tp.topic in stages and not stages[tp.topic].owns(tp.partition)
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

    def _stages(self) -> dict[str, AccountStage | SourceStage | RollupStage]:
        return {
            self.topics.by_account: self.accounts,
            self.topics.by_source: self.sources,
            self.topics.shares: self.rollup,
        }

    async def _watch_tick(self) -> None:
        """End the worker if a partition is stuck (``pipeline.stream.watch``); runs whether
        or not the worker is ready, since a restore that never ends keeps it unready."""
        consumer: Any = self.app.consumer
        await self.watch.tick(
            consumer.assignment(), self._stages(), consumer.highwater, self.restore.records_read
        )

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
        await self.out.drain(None)

    async def _on_revoked(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        revoked: Iterable[TopicPartition] = args[0] if args else kwargs.get("revoked", ())
        # The next owner rebuilds from the changelog: write what is waiting first.
        revoked = list(revoked)
        changelogs = [
            (self.changelogs[tp.topic], tp.partition)
            for tp in revoked
            if tp.topic in self.changelogs
        ]
        await self.out.drain(changelogs)
        self.restore.cancel([TopicPartition(topic, partition) for topic, partition in changelogs])
        self.watch.forget(revoked)
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
