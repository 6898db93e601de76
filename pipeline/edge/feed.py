"""The decision feed: follows the compacted decisions topic into a ``DecisionView``.

``DecisionFeed`` reads without a consumer group: it assigns every partition, seeks to the
beginning and then follows, applying each fetch to the view in chunks so the checks served
on the same event loop never wait for more than about ``APPLY_BUDGET_S``. A gateway offline
for longer than the topic's ``delete.retention.ms`` misses tombstones, never expiries (the
view drops a decision at its ``expires_at``); a restarted edge that finds only a malformed
value for a key after compaction has no decision for that key.

The feed is ready once it has read up to the end offsets it saw at start, and while the
worker's normalisation fingerprint (``pipeline.fingerprint``, checked every
``fingerprint_check_s``) does not differ from the edge's; it exposes lag
(messages not yet read) and staleness (time since the broker last answered a fetch of
every partition). A broker error, or a bug, is logged and the topic read again after
``retry_backoff_s``: enforcement never stops for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from pipeline.clock import wall_ms
from pipeline.edge.bulkload import BulkConfig, BulkResult, bulk_load, fetcher_for
from pipeline.edge.errors import EdgeError
from pipeline.edge.view import DecisionView
from pipeline.fingerprint import fingerprint, mismatch, read_fingerprint
from pipeline.logs import get_logger
from pipeline.wiring import build_normaliser, load_policy

if TYPE_CHECKING:
    from pipeline.settings import Settings

log = get_logger("edge")

APPLY_CHUNK = 32
"""Messages applied between two looks at the clock (about 0.5 ms of work here)."""
APPLY_BUDGET_S = 0.001
"""The longest the feed applies messages before it yields to the event loop."""
LOAD_CHUNK = 2048
"""Messages applied between two looks at the clock before the view is ready (the cold
load): about 1 ms of familiar exempts decoded in the engine (``DecisionView.apply_encoded``),
up to about 40 ms of messages the Python decoder reads."""
TOPIC_MISSING_LOG_S = 60.0
"""While the decisions topic is missing, the warning is repeated this often."""


def settle_heap() -> None:
    """Move every object alive now out of the cyclic collector's reach (``gc.freeze``).

    A loaded view is hundreds of thousands of long-lived objects (decisions, keys, cache
    entries) that a full collection would walk, a pause every request in flight waits out
    (measured in bench/README.md, B4). Frozen objects are never walked again; they are
    still freed by reference counting when a decision goes (the view holds no reference
    cycles). No collection first: that would be one such pause. Called once the feed has
    caught up.
    """
    gc.freeze()


class FeedNotReady(EdgeError):
    """The feed did not catch up in time."""


@dataclass(frozen=True, slots=True)
class FeedConfig:
    """How a feed reads the topic."""

    bootstrap_servers: str
    topic: str
    client_id: str = "authpipe-edge"
    poll_interval_ms: int = 200
    max_records_per_poll: int = 20_000
    max_partition_fetch_bytes: int = 8 << 20
    fetch_max_bytes: int = 64 << 20
    retry_backoff_s: float = 1.0
    request_timeout_ms: int = 30_000
    # aiokafka fetches one request at a time per broker, for the partitions with nothing
    # left to consume: a partition consumed while such a fetch waits is read only once it
    # returns. aiokafka's 500 ms would be that wait when every other partition is quiet.
    fetch_max_wait_ms: int = 100
    # TLS/SASL options of every client the feed opens (pipeline.kafka_client.security_kwargs).
    security: Mapping[str, Any] = field(default_factory=dict)
    # This edge's normalisation (pipeline.fingerprint), compared with the worker's; None:
    # not compared.
    fingerprint: Mapping[str, str] | None = None
    fingerprint_check_s: float = 30.0
    # The cold load read as record batches by the engine (pipeline.edge.bulkload), when the
    # view keeps familiar exempts in the compiled store; False: the consumer reads it all.
    bulk_load: bool = True
    bulk: BulkConfig = field(default_factory=BulkConfig)


class DecisionFeed:
    """Follows the decisions topic into ``view``: ``await start()``, ``await stop()``."""

    def __init__(self, view: DecisionView, config: FeedConfig) -> None:
        self.view = view
        self.config = config
        self._task: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._targets: dict[TopicPartition, int] = {}
        self._starts: dict[TopicPartition, int] = {}
        self._positions: dict[TopicPartition, int] = {}
        self.bulk: BulkResult | None = None
        """What the last cold load read as record batches (None: it did not)."""
        self._bulk_broken = False
        self._ready = asyncio.Event()
        self._waiting: str | None = f"connecting to the broker at {config.bootstrap_servers}"
        self._started_wall_ms = 0
        self._watch: asyncio.Task[None] | None = None
        self.mismatch: str | None = None
        """What differs from the worker's normalisation (None: nothing known to differ)."""
        self._fingerprint_unknown = False
        self._fingerprint_checked = config.fingerprint is None
        self.load_ms: int | None = None
        self.errors = 0

    @classmethod
    def from_settings(
        cls, settings: Settings, *, now_ms: Callable[[], int] = wall_ms
    ) -> DecisionFeed:
        """A feed of ``settings.kafka.decisions_topic`` into a view normalising exactly as
        the worker does (``build_normaliser``)."""
        policy = load_policy(settings.policy_path)
        view = DecisionView(build_normaliser(settings, policy), now_ms=now_ms, policy=policy)
        from pipeline.kafka_client import security_kwargs

        kafka = settings.kafka
        config = FeedConfig(
            kafka.bootstrap_servers,
            kafka.decisions_topic,
            security=security_kwargs(kafka),
            fingerprint=fingerprint(settings),
        )
        return cls(view, config)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start following in the background (returns at once; see ``wait_ready``)."""
        if self._task is None:
            self._started_wall_ms = wall_ms()
            self._task = asyncio.create_task(self._supervise(), name="authpipe-edge-feed")
        if self._watch is None and self.config.fingerprint is not None:
            self._watch = asyncio.create_task(
                self._watch_fingerprint(), name="authpipe-edge-fingerprint"
            )

    async def stop(self) -> None:
        for task in (self._task, self._watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._watch = None

    async def __aenter__(self) -> DecisionFeed:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_ready(self, timeout_s: float) -> None:
        """Return once caught up with the end offsets seen at start; FeedNotReady after
        ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._ready.wait()
        except TimeoutError:
            raise FeedNotReady(
                f"the decision feed of {self.config.topic!r} did not catch up within "
                f"{timeout_s:g}s (lag {self.lag_messages()} messages); check the broker at "
                f"{self.config.bootstrap_servers}"
            ) from None

    # -- health --------------------------------------------------------------------------

    def ready(self) -> bool:
        return self._ready.is_set() and self._fingerprint_checked and self.mismatch is None

    def not_ready_reason(self) -> str | None:
        """Why the view is not ready (None once it is): what it waits for, in words."""
        if self.mismatch is not None:
            return self.mismatch
        if self._ready.is_set():
            if not self._fingerprint_checked:
                return (
                    f"reading the worker's normalisation fingerprint beside {self.config.topic!r}"
                )
            return None
        if self._waiting is not None:
            return self._waiting
        return (
            f"catching up with topic {self.config.topic!r} ({self.lag_messages()} messages behind)"
        )

    def lag_messages(self) -> int:
        """Messages on the broker not applied yet (end offsets as last seen)."""
        consumer = self._consumer
        lag = 0
        for tp, target in self._targets.items():
            high = consumer.highwater(tp) if consumer is not None else None
            lag += max(0, (high if high is not None else target) - self._positions.get(tp, 0))
        return lag

    def staleness_ms(self) -> int | None:
        """Milliseconds since the broker last answered a fetch for every partition (None
        before the first answers)."""
        consumer = self._consumer
        if consumer is None or not self._targets:
            return None
        stamps: list[int | None] = [consumer.last_poll_timestamp(tp) for tp in self._targets]
        known = [stamp for stamp in stamps if stamp is not None]
        if len(known) < len(stamps):
            return None
        return max(0, wall_ms() - min(known))

    # -- the worker's fingerprint ---------------------------------------------------------

    async def check_fingerprint(self) -> None:
        """Read the worker's fingerprint and compare it with this edge's (``mismatch``)."""
        cfg = self.config
        if cfg.fingerprint is None:
            return
        worker = await read_fingerprint(cfg.bootstrap_servers, cfg.topic, cfg.security)
        self._fingerprint_checked = True
        if worker is None:  # none published (yet), or unreadable: the last verdict stands
            if not self._fingerprint_unknown:
                log.warning("edge_normalisation_unknown", topic=cfg.topic)
                self._fingerprint_unknown = True
            return
        self._fingerprint_unknown = False
        line = mismatch(worker, cfg.fingerprint, "edge")
        if line != self.mismatch:
            if line is not None:
                log.error("edge_normalisation_mismatch", topic=cfg.topic, reason=line)
            else:
                log.info("edge_normalisation_matches", topic=cfg.topic)
        self.mismatch = line

    async def _watch_fingerprint(self) -> None:
        while True:
            try:
                await self.check_fingerprint()
            except asyncio.CancelledError:
                raise
            except Exception:
                self._fingerprint_checked = True  # a bug here must not hold readiness back
                log.exception("edge_fingerprint_check_crashed", topic=self.config.topic)
            await asyncio.sleep(self.config.fingerprint_check_s)

    # -- the loop ------------------------------------------------------------------------

    async def _supervise(self) -> None:
        """Run the follow loop; on a broker error, log, back off and start over."""
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except (KafkaError, OSError, EdgeError) as exc:
                self.errors += 1
                self._waiting = f"the broker at {self.config.bootstrap_servers} failed: {exc!r}"[
                    :300
                ]
                log.warning("edge_feed_error", topic=self.config.topic, error=repr(exc)[:300])
            except Exception:
                # A bug must not end enforcement: log it, then read the topic again.
                self.errors += 1
                self._waiting = "the decision feed failed; see edge_feed_crashed in the edge's log"
                log.exception("edge_feed_crashed", topic=self.config.topic)
            await asyncio.sleep(self.config.retry_backoff_s)

    async def _follow(self) -> None:
        cfg = self.config
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg.bootstrap_servers,
            client_id=cfg.client_id,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=cfg.request_timeout_ms,
            fetch_max_wait_ms=cfg.fetch_max_wait_ms,
            max_partition_fetch_bytes=cfg.max_partition_fetch_bytes,
            fetch_max_bytes=cfg.fetch_max_bytes,
            **cfg.security,
        )
        await consumer.start()
        self._consumer = consumer
        try:
            partitions = await self._assign(consumer)
            if cfg.bulk_load and self._starts and not self._bulk_broken and self.view.reads_batches:
                await self._bulk_load(consumer, partitions)
            await self._read(consumer, partitions)
        finally:
            self._consumer = None
            await consumer.stop()

    async def _assign(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        topic = self.config.topic
        warned_at: float | None = None
        while not (ids := await self._partition_ids()):
            self._waiting = (
                f"topic {topic!r} does not exist on {self.config.bootstrap_servers}: start the "
                "worker that creates it, or set AUTHPIPE_KAFKA_DECISIONS_TOPIC to the topic "
                "your worker writes decisions to"
            )
            if warned_at is None or time.monotonic() - warned_at >= TOPIC_MISSING_LOG_S:
                log.warning("edge_topic_missing", topic=topic, reason=self._waiting)
                warned_at = time.monotonic()
            await asyncio.sleep(self.config.retry_backoff_s)
        self._waiting = None
        partitions = [TopicPartition(topic, pid) for pid in ids]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        self._targets = dict(await consumer.end_offsets(partitions))
        self._starts = {}
        if not self._ready.is_set():
            self._starts = starts = dict(await consumer.beginning_offsets(partitions))
            self._reserve(sum(end - starts.get(tp, 0) for tp, end in self._targets.items()))
        log.info(
            "edge_feed_assigned",
            topic=topic,
            partitions=len(partitions),
            messages_at_start=sum(self._targets.values()),
        )
        return partitions

    async def _bulk_load(
        self, consumer: AIOKafkaConsumer, partitions: list[TopicPartition]
    ) -> None:
        """The cold load as record batches (``pipeline.edge.bulkload``), the consumer
        paused, then seeked to every position reached to read on. A broker error raises
        (the feed starts over); a malformed answer (``FetchConnectionError``) or a bug is
        logged and the consumer reads everything, now and on every later start."""
        cfg = self.config
        consumer.pause(*partitions)
        client = AIOKafkaClient(
            bootstrap_servers=cfg.bootstrap_servers,
            client_id=cfg.client_id,
            request_timeout_ms=cfg.request_timeout_ms,
            **cfg.security,
        )
        positions = self._positions
        positions.update(self._starts)
        t0 = time.perf_counter()
        try:
            await client.bootstrap()
            await client.add_topic(cfg.topic)
            fetcher = fetcher_for(
                client, cfg.bulk, cfg.security, cfg.client_id, cfg.request_timeout_ms / 1000
            )
            try:
                self.bulk = await bulk_load(
                    fetcher, client, self.view, positions, self._targets, cfg.bulk
                )
            finally:
                fetcher.close()
        except (KafkaError, OSError):
            raise
        except Exception:
            self._bulk_broken = True
            log.exception("edge_bulk_load_crashed", topic=cfg.topic)
            positions.update(self._starts)
            return
        finally:
            await client.close()
            for tp in partitions:
                consumer.seek(tp, positions.get(tp, 0))
            consumer.resume(*partitions)
        log.info(
            "edge_bulk_load_done",
            topic=cfg.topic,
            records=self.bulk.records,
            fetches=self.bulk.fetches,
            left=self.bulk.left,
            seconds=round(time.perf_counter() - t0, 3),
        )

    def _reserve(self, messages: int) -> None:
        """Before a cold load, room in the view's compiled store for the topic's messages
        (at most that many familiar exempts), so it never grows while loading (a grown
        store holds 16 % more and peaks at twice its size: bench/README.md, B8). A
        reservation the machine cannot hold is logged and skipped: the store grows."""
        more = messages - len(self.view.index)
        if more <= 0:
            return
        try:
            self.view.index.reserve_familiar(more)
        except (MemoryError, ValueError) as exc:
            log.warning(
                "edge_reserve_failed", topic=self.config.topic, records=more, error=str(exc)
            )

    async def _partition_ids(self) -> list[int]:
        """The topic's partitions from a metadata request for all topics (asking by name
        could auto-create the topic); empty while it does not exist."""
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.config.bootstrap_servers,
            client_id=self.config.client_id,
            request_timeout_ms=self.config.request_timeout_ms,
            **self.config.security,
        )
        await admin.start()
        try:
            described: list[dict[str, Any]] = await admin.describe_topics()
        finally:
            await admin.close()
        for entry in described:
            if entry.get("topic") == self.config.topic and entry.get("error_code", 0) == 0:
                return sorted(int(p["partition"]) for p in entry.get("partitions") or [])
        return []

    async def _read(self, consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> None:
        view = self.view
        cfg = self.config
        while True:
            batches = await consumer.getmany(
                *partitions, timeout_ms=cfg.poll_interval_ms, max_records=cfg.max_records_per_poll
            )
            # In chunks, yielding to the loop once APPLY_BUDGET_S has passed: a large batch
            # (a burst of decisions) must not stall the checks served on this loop by more
            # than about a millisecond once the view is ready; before (the cold load), by
            # more than one chunk of LOAD_CHUNK.
            chunk = LOAD_CHUNK if self._loading() else APPLY_CHUNK
            deadline_s = time.perf_counter() + APPLY_BUDGET_S
            for records in batches.values():
                for start in range(0, len(records), chunk):
                    if time.perf_counter() >= deadline_s:
                        await asyncio.sleep(0)
                        deadline_s = time.perf_counter() + APPLY_BUDGET_S
                    view.apply_batch(records[start : start + chunk])
            view.prune()
            for tp in partitions:
                self._positions[tp] = await consumer.position(tp)
            self._note_ready()

    def _loading(self) -> bool:
        """The cold load: not ready, and messages left below the end offsets seen at start."""
        if self._ready.is_set():
            return False
        positions = self._positions
        return any(positions.get(tp, 0) < end for tp, end in self._targets.items())

    def _note_ready(self) -> None:
        if self._ready.is_set():
            return
        if all(self._positions.get(tp, 0) >= end for tp, end in self._targets.items()):
            settle_heap()
            self.load_ms = wall_ms() - self._started_wall_ms
            self._ready.set()
            log.info(
                "edge_view_ready",
                topic=self.config.topic,
                decisions=len(self.view),
                load_ms=self.load_ms,
                bad_messages=self.view.stats.outcomes["bad"],
            )
