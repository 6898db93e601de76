"""The sink: Kafka → ClickHouse, exactly once, with the audit rate cap.

``ClickHouseSink`` reads ``auth.audit``, ``auth.throttle-decisions``, ``auth.alerts`` and
``auth.login-attempts.dlq`` (consumer group ``<app_id>-sink``, manual commits) and writes
the ``attempts``, ``decisions``, ``alerts`` and ``dead_letters`` tables
(``pipeline.sinks.tables``) through the one ClickHouse interface. Messages become rows in
``pipeline.sinks.rows``; each partition is a lane (``pipeline.sinks.lanes``) whose plan
rides in its commit metadata (``pipeline.sinks.plan``). This module is the I/O shell: the
consumer, rebalances, flush timing, commits, and pausing while ClickHouse is away; the
inserts and their backoff are the writer's (``pipeline.sinks.writer``).

Failures
--------
* ClickHouse unavailable (or refusing): the planned items stay queued and are retried
  with capped exponential backoff (``writer.BACKOFF_START_S`` doubling to ``BACKOFF_CAP_S``);
  fetching is paused so the backlog waits in Kafka; it resumes once they are in.
  Nothing is dropped and the process does not exit.
* A message that is not valid (not JSON, wrong shape) is logged, counted and skipped,
  deterministically (a replay skips it again). Rows of a valid message that no column can
  hold (a time before 1970: ``past_timestamp``; wrong types or ranges: ``invalid_row``)
  are quarantined (:mod:`pipeline.sinks.quarantine`) before the lane plans past them.
* Every insert is cut into parts of at most ``MAX_DAYS_PER_INSERT`` days
  (:mod:`pipeline.sinks.partitions`), within the per-insert partition limit the inserts
  set. Rows ClickHouse still refuses for good (``BatchRefused``, e.g. code 252 "too many
  partitions for single INSERT block" under another partition key) are quarantined with
  the reason and the lane moves on: one batch never stops the sink.
* A failed commit (the group rebalanced under us) or a rebalance drops the lanes
  concerned and loads them again from the group's committed offsets and plans; the
  consumer is sought back to each committed offset and records the same poll had
  fetched from where the old lane had read to are dropped (they come again), so a
  replay sees every message of its plan and rebuilds the same rows under the same
  tokens. (Fed those records, a reloaded lane replayed its plan over a gap, planned
  new batches from a cap that had not seen the gap's rows and committed them: rows
  lost, or counted both as rows and in a later replay's summary.)
* ``after_insert`` (a constructor argument) is called after every successful non-empty
  insert with the insert count and token, before the next commit: crash tests kill the
  process there (``pipeline.sinks.command``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from pipeline.contracts.codec import DecodeError
from pipeline.kafka_client import client_kwargs
from pipeline.logs import get_logger
from pipeline.settings import Settings
from pipeline.sinks.clickhouse import (
    ClickHouse,
    ClickHouseError,
)
from pipeline.sinks.cluster import CLUSTER_INSERT_SETTINGS
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.consumer import Events, committed_lanes, open_kafka
from pipeline.sinks.lanes import Lane
from pipeline.sinks.plan import MAX_MARKS_CHARS, SinkError
from pipeline.sinks.quarantine import Quarantine
from pipeline.sinks.ratecap import RateCapConfig
from pipeline.sinks.rows import Message, decode_record
from pipeline.sinks.stats import SinkStats, monotonic_ms
from pipeline.sinks.tables import INSERT_SETTINGS, LaneKind
from pipeline.sinks.writer import AfterInsert, TableWriter
from pipeline.wiring import grouping_check

log = get_logger("sink")

POLL_TIMEOUT_MS: Final = 100
POLL_MAX_RECORDS: Final = 500
BUFFER_FACTOR: Final = 4
PROGRESS_LOG_INTERVAL_S: Final = 10.0
SHUTDOWN_TIMEOUT_S: Final = 30.0
MAX_TRACKED_KEYS: Final = 100_000


def _warn(record: Any, event: str, **fields: Any) -> None:
    """Log ``event`` about one consumer record, located by its coordinates."""
    log.warning(
        event, topic=record.topic, partition=record.partition, offset=record.offset, **fields
    )


class ClickHouseSink:
    """The sink process: one consumer, one ClickHouse handle, one lane per partition,
    four tables."""

    def __init__(
        self,
        settings: Settings,
        *,
        open_ch: Callable[[], ClickHouse] | None = None,
        after_insert: AfterInsert | None = None,
    ) -> None:
        self.settings = settings
        # The decisions' grouping check, NAT64 prefixes included: built once.
        self._source_ok = grouping_check(settings)
        kafka = settings.kafka
        self.group_id = f"{kafka.app_id}-sink"
        self.kinds: dict[str, LaneKind] = {
            kafka.audit_topic: "audit",
            kafka.decisions_topic: "decisions",
            kafka.alerts_topic: "alerts",
            kafka.dlq_topic: "dead_letters",
        }
        if len(self.kinds) != 4:
            raise SinkError(
                "the audit, decisions, alerts and DLQ topics must be four different topics; "
                "fix the kafka.*_topic settings"
            )
        audit = settings.audit
        self.flush_rows = audit.flush_rows
        self.flush_interval_ms = audit.flush_interval_ms
        self.cap_config = RateCapConfig(
            rows_per_minute=audit.rows_per_minute, max_keys=MAX_TRACKED_KEYS
        )
        self.lanes: dict[Any, Lane] = {}
        self.stats = SinkStats()
        self._consumer: Any = None
        self._admin: Any = None
        self._events: Events = deque()
        self._last_flush_ms = 0
        self._paused_outage = False
        self._paused_full: set[Any] = set()
        # A cluster's Distributed tables store an insert before it returns only when asked.
        self.insert_settings: Mapping[str, Any] = (
            {**INSERT_SETTINGS, **CLUSTER_INSERT_SETTINGS}
            if settings.clickhouse.cluster
            else INSERT_SETTINGS
        )
        self.quarantine = Quarantine(
            client_kwargs(kafka), kafka.dlq_topic, insert_settings=self.insert_settings
        )
        self.writer = TableWriter(
            open_ch or (lambda: open_clickhouse(settings.clickhouse)),
            insert_settings=self.insert_settings,
            quarantine=self.quarantine,
            stats=self.stats,
            after_insert=after_insert,
        )
        self._last_progress_s = time.monotonic()

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, then flush, close the caps and commit."""
        await self._start()
        try:
            while not stop.is_set():
                await self.poll_once()
            await self._shutdown()
        finally:
            await self._close()

    async def poll_once(self) -> None:
        """One round of the loop: fetch, apply rebalances, buffer, flush when due."""
        records = await self._consumer.getmany(
            timeout_ms=POLL_TIMEOUT_MS, max_records=POLL_MAX_RECORDS
        )
        loaded = await self._apply_events()
        self._ingest(records, skip=loaded)
        await self._tick(monotonic_ms())
        self._log_progress()

    async def _start(self) -> None:
        self._consumer, self._admin = await open_kafka(
            self.settings.kafka, self.group_id, list(self.kinds), self._events
        )
        log.info(
            "sink_started",
            group=self.group_id,
            topics=sorted(self.kinds),
            flush_rows=self.flush_rows,
            flush_interval_ms=self.flush_interval_ms,
            rows_per_minute=self.cap_config.rows_per_minute,
        )

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            if self._consumer is not None:
                await self._consumer.stop()
        with contextlib.suppress(Exception):
            await self.quarantine.stop()
        with contextlib.suppress(Exception):
            if self._admin is not None:
                await self._admin.close()
        await self.writer.close()
        self.stats.quarantined_rows = self.quarantine.rows
        log.info("sink_stopped", **self.stats.as_dict())

    async def _shutdown(self) -> None:
        """Plan what is buffered, close every cap, commit the plan, insert, commit."""
        await self._apply_events()
        now = monotonic_ms()
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        await self._flush(now, closing=True)
        while self._has_pending() and time.monotonic() < deadline:
            if await self._insert_pending():
                break
            await asyncio.sleep(min(self.writer.backoff_s, max(0.0, deadline - time.monotonic())))
        if self._has_pending():
            log.warning("sink_shutdown_with_pending", reason="clickhouse unavailable")
        await self._commit()

    # -- rebalances ----------------------------------------------------------------------

    async def _apply_events(self) -> set[Any]:
        """Apply rebalances and reloads; the partitions that got a new lane."""
        loaded: set[Any] = set()
        while self._events:
            what, tps = self._events.popleft()
            if what == "revoked":
                for tp in tps:
                    self.lanes.pop(tp, None)
                    self._paused_full.discard(tp)
                    loaded.discard(tp)
                continue
            try:
                loaded.update(await self._load_lanes(tps))
            except SinkError:
                raise
            except Exception as exc:  # Kafka hiccup: keep the event, retry after a poll
                log.warning("sink_load_failed", error=str(exc)[:300], partitions=len(tps))
                self._events.appendleft((what, tps))
                break
        return loaded

    async def _load_lanes(self, tps: Iterable[Any]) -> list[Any]:
        """New lanes at their committed offsets, replaying the committed plans; the
        partitions loaded.

        The consumer is sought back to each new lane's committed offset: records a poll
        fetched before the lane was loaded (after a failed commit, from where the old lane
        had read to) are not the lane's to buffer (``poll_once`` drops them); they come
        again from the committed offset, so the replay sees every message of its plan.
        """
        # A lane that exists is current: every path that outdates one (revocation, a
        # failed commit) removes it before asking for a reload.
        tps = [tp for tp in dict.fromkeys(tps) if tp not in self.lanes and self._assigned(tp)]
        if not tps:
            return []
        lanes = await committed_lanes(self._admin, self.group_id, tps, self.kinds, self.cap_config)
        for tp, lane in lanes.items():
            self.lanes[tp] = lane
            offset, plan = lane.committed, lane.plan
            if offset is None:
                await self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, offset)
            if plan:
                log.info(
                    "sink_replaying",
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=offset,
                    entries=len(plan),
                )
        return list(lanes)

    # -- ingest --------------------------------------------------------------------------

    def _ingest(self, records: Mapping[Any, list[Any]], skip: set[Any] | None = None) -> None:
        """Buffer fetched records; those of partitions in ``skip`` (loaded after the fetch,
        sought back) come again."""
        now = monotonic_ms()
        for tp, batch in records.items():
            if skip and tp in skip:
                continue
            lane = self.lanes.get(tp)
            if lane is None:
                self._events.append(("reload", [tp]))  # load it, seek back; these come again
                continue
            for record in batch:
                if lane.seen_to is not None and record.offset < lane.seen_to:
                    continue  # fetched again after a seek: buffered already
                message = self._decode(lane, record)
                if lane.add(message, now):
                    self.stats.messages += 1
                    self.stats.rows_in += len(message.rows)
            if lane.buffered_rows > BUFFER_FACTOR * self.flush_rows and tp not in self._paused_full:
                self._paused_full.add(tp)
                self._consumer.pause(tp)

    def _decode(self, lane: Lane, record: Any) -> Message:
        error = "written with defaults"
        try:
            message = decode_record(lane.kind, record, self._source_ok)
        except DecodeError as exc:
            message = Message(record.offset, [], bad_reason=exc.reason)
            error = str(exc)[:300]
        if message.bad_rows:
            self.stats.bad_rows += message.bad_rows
            _warn(record, "sink_bad_rows", rows=message.bad_rows, quarantined=True)
            self.quarantine.queue_rejects(
                record.topic, record.partition, record.offset, message.rejects
            )
        if message.bad_reason is not None:
            self.stats.bad_messages += 1
            _warn(record, "sink_bad_message", reason=message.bad_reason, error=error)
        return message

    async def _send_rejects(self) -> bool:
        """Quarantine the queued rejects; False (and back off) when that fails."""
        from aiokafka.errors import KafkaError

        try:
            await self.quarantine.put_pending(self.writer.handle)
        except (ClickHouseError, KafkaError) as exc:
            self._failed(exc)
            return False
        self._recovered()
        return True

    # -- flush, commit, insert -----------------------------------------------------------

    def _has_pending(self) -> bool:
        return any(lane.pending for lane in self.lanes.values())

    async def _tick(self, now_ms: int) -> None:
        if self.quarantine.pending and now_ms < self.writer.retry_at_ms:
            return
        if self._has_pending():
            if now_ms < self.writer.retry_at_ms:
                return
            if not await self._insert_pending():
                return
        due = now_ms - self._last_flush_ms >= self.flush_interval_ms
        full = any(lane.buffered_rows >= self.flush_rows for lane in self.lanes.values())
        if due or full:
            await self._flush(now_ms)

    async def _flush(self, now_ms: int, *, closing: bool = False) -> None:
        self._last_flush_ms = now_ms
        # Rejects first: a lane plans (and later commits) past their messages only after.
        if self.quarantine.pending and not await self._send_rejects():
            return
        planned = False
        for tp, lane in list(self.lanes.items()):
            position = None
            if lane.replaying:
                with contextlib.suppress(Exception):
                    position = await self._consumer.position(tp)
            items = lane.plan_items(
                flush_rows=self.flush_rows, now_ms=now_ms, position=position, closing=closing
            )
            planned = planned or bool(items)
            self.stats.replayed_items += sum(1 for item in items if not item.recorded)
            self._note_upstream_replays(tp, lane)
            if tp in self._paused_full and lane.buffered_rows <= self.flush_rows:
                self._paused_full.discard(tp)
                if not self._paused_outage:
                    self._consumer.resume(tp)
        committed = await self._commit()
        if planned and committed:
            await self._insert_pending()

    def _note_upstream_replays(self, tp: Any, lane: Lane) -> None:
        """Log rows a flush dropped as upstream replays, and marks left out of commits."""
        dropped = lane.dropped_rows
        if dropped:
            lane.dropped_rows = 0
            self.stats.upstream_replayed_rows += dropped
            log.warning(
                "sink_upstream_replay_dropped",
                topic=tp.topic,
                partition=tp.partition,
                rows=dropped,
                weight=lane.dropped_weight,
            )
            lane.dropped_weight = 0
        if lane.marks_cut:
            lane.marks_cut = False
            log.warning(
                "sink_marks_cut",
                topic=tp.topic,
                partition=tp.partition,
                input_partitions=sum(len(found) for found in lane.marks.values()),
                max_chars=MAX_MARKS_CHARS,
            )

    async def _commit(self) -> bool:
        """Commit every lane with news; on failure reload those lanes from Kafka."""
        offsets = {}
        for tp, lane in self.lanes.items():
            value = lane.commit_value()
            if lane.commit_due and value is not None:
                offsets[tp] = value
        if not offsets:
            return True
        from aiokafka.errors import KafkaError

        try:
            await self._consumer.commit(offsets)
        except (KafkaError, AssertionError) as exc:
            self.stats.commit_failures += 1
            log.warning("sink_commit_failed", error=str(exc)[:300], partitions=len(offsets))
            for tp in offsets:
                self.lanes.pop(tp, None)
            self._events.append(("reload", [tp for tp in offsets if self._assigned(tp)]))
            return False
        self.stats.commits += 1
        for tp in offsets:
            self.lanes[tp].commit_due = False
        return True

    def _assigned(self, tp: Any) -> bool:
        return tp in self._consumer.assignment()

    async def _insert_pending(self) -> bool:
        """Insert queued items in lane order; False (and back off, pause) on failure."""
        from aiokafka.errors import KafkaError

        for tp, lane in list(self.lanes.items()):
            while lane.pending and self.lanes.get(tp) is lane:
                item = lane.pending[0]
                try:
                    await self.writer.insert(item, lane.topic, lane.partition)
                except (ClickHouseError, KafkaError) as exc:
                    self._failed(exc)
                    return False
                lane.confirm()
        self._recovered()
        return True

    def _recovered(self) -> None:
        """ClickHouse took what was due: resume fetching, reset the backoff."""
        if self._paused_outage:
            self._paused_outage = False
            resumable = [tp for tp in self._consumer.assignment() if tp not in self._paused_full]
            self._consumer.resume(*resumable)
            log.info("sink_clickhouse_back", retry_after_s=self.writer.backoff_s)
        self.writer.recovered()

    def _failed(self, exc: Exception) -> None:
        """An insert failed: the writer backs off, fetching pauses until it recovers."""
        self.writer.failed(exc)
        if not self._paused_outage:
            self._paused_outage = True
            self._consumer.pause(*self._consumer.assignment())

    def _log_progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress_s >= PROGRESS_LOG_INTERVAL_S:
            self._last_progress_s = now
            self.stats.quarantined_rows = self.quarantine.rows
            log.info("sink_progress", lanes=len(self.lanes), **self.stats.as_dict())
