"""Prometheus metrics of a worker, on its own registry (served at /metrics)."""

from __future__ import annotations

import gc
import time
from collections import Counter as TallyCounter
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from pipeline.logs import get_logger

if TYPE_CHECKING:
    from pipeline.stream.envelopes import StageOutput
    from pipeline.stream.rollup_stage import RollupStage
    from pipeline.stream.stages import AccountStage, SourceStage


class WorkerMetrics:
    """Counters and gauges; rates (events/s, decisions/s) are Prometheus ``rate()``s."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events_total = Counter(
            "authpipe_events_total", "valid input events ingested", registry=r
        )
        self.dead_letters_total = Counter(
            "authpipe_dead_letters_total", "input events dead-lettered", ["reason"], registry=r
        )
        self.stage_rows_total = Counter(
            "authpipe_stage_rows_total", "rows processed by a stage", ["stage"], registry=r
        )
        self.stage_replayed_rows_total = Counter(
            "authpipe_stage_replayed_rows_total", "replayed rows skipped", ["stage"], registry=r
        )
        self.stage_seconds_total = Counter(
            "authpipe_stage_seconds_total", "time spent in a stage", ["stage"], registry=r
        )
        self.decisions_total = Counter(
            "authpipe_decisions_total", "decisions emitted", ["kind"], registry=r
        )
        self.alerts_total = Counter("authpipe_alerts_total", "alerts emitted", registry=r)
        self.forwarded_total = Counter(
            "authpipe_forwarded_total", "failures forwarded to the source stage", registry=r
        )
        self.changelog_records_total = Counter(
            "authpipe_changelog_records_total",
            "changelog records a stage wrote (tombstones included)",
            ["stage"],
            registry=r,
        )
        self.changelog_tombstones_total = Counter(
            "authpipe_changelog_tombstones_total",
            "changelog tombstones a stage wrote",
            ["stage"],
            registry=r,
        )
        self.changelog_held_total = Counter(
            "authpipe_changelog_held_records_total",
            "tombstones of held-row records an older worker wrote (held rows are re-read from input now)",
            ["stage"],
            registry=r,
        )
        self.changelog_bytes_total = Counter(
            "authpipe_changelog_bytes_total",
            "changelog key and value bytes a stage wrote",
            ["stage"],
            registry=r,
        )
        self.table_entries = Gauge(
            "authpipe_table_entries", "entries held by a stage's tables", ["stage"], registry=r
        )
        self.table_evictions = Gauge(
            "authpipe_table_evictions", "entries evicted by the cap", ["stage"], registry=r
        )
        self.active_decisions = Gauge(
            "authpipe_active_decisions", "unexpired decisions held", ["stage"], registry=r
        )
        self.familiar_quota_reached = Gauge(
            "authpipe_familiar_quota_reached",
            "successes whose new place or client the account's daily quota left unpublished"
            " (familiar.new_per_day), since this worker took its partitions",
            registry=r,
        )
        self.ingest_lag = Gauge(
            "authpipe_ingest_lag_messages", "input messages not yet read", ["partition"], registry=r
        )
        self.ingest_held_seconds_total = Counter(
            "authpipe_ingest_held_seconds_total",
            "seconds ingest waited for the account stage before reading (backpressure)",
            registry=r,
        )
        self.ingest_slow_arrivals_total = Counter(
            "authpipe_ingest_slow_arrivals_total",
            "events handed to ingest more than worker.input_live_slack_ms after they occurred"
            " (each turns the live marks off for worker.input_idle_ms: the next rows wait for"
            " the idle rule)",
            registry=r,
        )
        self.held_rows_deleted_total = Counter(
            "authpipe_stage_held_rows_deleted_total",
            "restores whose oldest held row's input message was past the topic's retention",
            ["topic"],
            registry=r,
        )
        self.seek_backs_total = Counter(
            "authpipe_stream_seek_backs_total",
            "partitions sought back to the envelope their stage expects (faust dropped it)",
            ["topic"],
            registry=r,
        )
        self.replayed_envelopes_total = Counter(
            "authpipe_stream_replayed_envelopes_total",
            "envelopes skipped because their stage had already applied them",
            ["topic"],
            registry=r,
        )
        self.held_rows = Gauge(
            "authpipe_reorder_held_rows",
            "rows held until every upstream partition marks a later event time",
            ["stage"],
            registry=r,
        )
        self.reorder_late = Gauge(
            "authpipe_reorder_late_rows",
            "rows that arrived below their stage's released watermark (applied out of order)",
            ["stage"],
            registry=r,
        )
        self.reorder_forced = Gauge(
            "authpipe_reorder_forced_rows",
            "rows released before the watermark because the reorder buffer reached its cap",
            ["stage"],
            registry=r,
        )
        self.stage_behind = Gauge(
            "authpipe_stage_behind_messages",
            "messages of a stage's input past the one it applied last (what it still has to "
            "apply, holes faust's commits skipped included); 0 when caught up",
            ["stage"],
            registry=r,
        )
        self.ready = Gauge("authpipe_ready", "1 when recovered and consuming", registry=r)
        self.gc_collections_total = Counter(
            "authpipe_gc_collections_total",
            "passes of the cycle collector, by the oldest generation collected",
            ["generation"],
            registry=r,
        )
        self.gc_seconds_total = Counter(
            "authpipe_gc_seconds_total",
            "CPU seconds in the cycle collector, by the oldest generation collected",
            ["generation"],
            registry=r,
        )
        self.gc_collected_total = Counter(
            "authpipe_gc_collected_objects_total",
            "unreachable objects (reference cycles) the cycle collector freed, by generation",
            ["generation"],
            registry=r,
        )
        self._gc_started = 0.0

    def watch_gc(self) -> None:
        """Time every pass of the cycle collector (``gc.callbacks``; the worker calls this
        once at start, so a flat rate can be told from a collector walking large state).
        The time is the collecting thread's CPU time: a pass holds the GIL throughout, and
        on a busy machine the wall clock would count the time the process was not running."""
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.thread_time()
            return
        generation = str(info["generation"])
        self.gc_collections_total.labels(generation=generation).inc()
        self.gc_collected_total.labels(generation=generation).inc(info["collected"])
        self.gc_seconds_total.labels(generation=generation).inc(
            time.thread_time() - self._gc_started
        )

    def ingested(self, valid: int, reasons: TallyCounter[str]) -> None:
        self.events_total.inc(valid)
        for reason, count in reasons.items():
            self.dead_letters_total.labels(reason=reason).inc(count)

    def stage(self, name: str, rows: int, result: StageOutput, seconds: float) -> None:
        self.stage_rows_total.labels(stage=name).inc(rows)
        self.stage_replayed_rows_total.labels(stage=name).inc(result.skipped)
        self.stage_seconds_total.labels(stage=name).inc(seconds)

    def emitted(self, result: StageOutput, stage: str) -> None:
        for _, value in result.decisions:
            self.decisions_total.labels(kind="decision" if value else "tombstone").inc()
        self.alerts_total.inc(len(result.alerts))
        self.forwarded_total.inc(sum(len(rows) for rows in result.forwards.values()))
        if result.changelog:
            tombstones = sum(1 for _, value in result.changelog if value is None)
            size = sum(len(key) + len(value or b"") for key, value in result.changelog)
            self.changelog_records_total.labels(stage=stage).inc(len(result.changelog))
            self.changelog_tombstones_total.labels(stage=stage).inc(tombstones)
            self.changelog_bytes_total.labels(stage=stage).inc(size)
            self.changelog_held_total.labels(stage=stage).inc(result.held_records)

    def observe_state(
        self, accounts: AccountStage, sources: SourceStage, rollup: RollupStage, ready: bool
    ) -> None:
        """Set the gauges from what the worker's stages hold now (handed in by the worker)."""
        for name, stage in (("account", accounts), ("source", sources)):
            shards = list(stage.shards.values())
            self.table_entries.labels(stage=name).set(sum(s.entries() for s in shards))
            self.table_evictions.labels(stage=name).set(sum(s.evictions() for s in shards))
            self.active_decisions.labels(stage=name).set(sum(len(s.index) for s in shards))
        self.familiar_quota_reached.set(
            sum(s.metrics.familiar_quota_reached for s in accounts.shards.values())
        )
        for name, sequencers in (
            ("account", accounts.sequencers),
            ("source", sources.sequencers),
            ("rollup", rollup.sequencers),
        ):
            held = list(sequencers.values())
            self.held_rows.labels(stage=name).set(sum(len(q) for q in held))
            self.reorder_late.labels(stage=name).set(sum(q.late for q in held))
            self.reorder_forced.labels(stage=name).set(sum(q.forced for q in held))
        self.ready.set(1 if ready else 0)

    def lag(self, partition: int, messages: int) -> None:
        self.ingest_lag.labels(partition=str(partition)).set(max(0, messages))

    def render(self) -> tuple[bytes, str]:
        # aiohttp takes the charset separately; the exposition format is ASCII anyway.
        return generate_latest(self.registry), CONTENT_TYPE_LATEST.split(";")[0] + "; version=0.0.4"


_log = get_logger("worker")


def log_late(stage: str, message: Any, result: StageOutput) -> None:
    """Rows applied out of event-time order are counted (``authpipe_reorder_late_rows``)
    and logged, one line per message, with the first such row."""
    if result.first_late is None:
        return
    upstream, position, time_ms, released_ms = result.first_late
    _log.warning(
        "stream_rows_late",
        stage=stage,
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        rows=result.late,
        upstream=upstream,
        position=position,
        time_ms=time_ms,
        released_ms=released_ms,
    )
