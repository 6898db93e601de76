"""``authpipe simulate``: produce a scenario to the input topic (or a file), truth beside it.

Pacing: event ``i`` at simulated offset ``o_i = occurred_ms - start_ms`` is produced at
wall time ``t0 + o_i / speedup``; ``speedup = 0`` produces as fast as the broker takes
it. The events (and so the truth) depend only on scenario, rate, duration, seed and
start, never on the speedup. The Kafka record timestamp is the event's ``occurred_at``,
so the topic's time index is event time (``backtest --from-ts`` relies on it).

The default start puts the run's events in the past or present, never in the future:
``now - duration * (1 - 1/speedup)`` (``now - duration`` when unpaced), so the last
event is produced about when it happened. Starts that would put events beyond the
worker's future-skew limit (5 min) when produced are refused, and so are starts older
than the input topic's retention (7 days), which the broker would delete at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import orjson

from pipeline.clock import wall_ms
from pipeline.contracts.models import format_utc_ms, ms_to_datetime
from pipeline.logs import get_logger
from pipeline.settings import Settings
from pipeline.sim.scenarios import ScenarioError, SimConfig, SimEvent, check_config, generate
from pipeline.topics import Topics

log = get_logger("simulate")

DAY_MS = 86_400_000
RETENTION_MARGIN_MS = 6 * DAY_MS
FUTURE_SKEW_MS = 240_000  # under the worker's 5-minute limit, with room for clock drift
SEND_WINDOW = 5_000  # un-acknowledged sends in flight at most


@dataclass(frozen=True, slots=True)
class SimulateOptions:
    """A simulate run: what to generate and where it goes."""

    config: SimConfig
    speedup: float
    truth_path: Path
    out_path: Path | None = None  # set for --dry-run


@dataclass
class Summary:
    """What a run produced: counts per (scenario, role), wall time, rate achieved."""

    events: int = 0
    by_scenario: Counter[tuple[str, str]] = field(default_factory=Counter)
    wall_s: float = 0.0
    first_ms: int | None = None
    last_ms: int | None = None

    def add(self, event: SimEvent) -> None:
        self.events += 1
        self.by_scenario[(event.label.scenario, event.label.role)] += 1
        if self.first_ms is None:
            self.first_ms = event.occurred_ms
        self.last_ms = event.occurred_ms

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else 0.0

    def render(self) -> str:
        lines = [f"{'scenario':<34}{'role':<10}{'events':>9}"]
        for (scenario, role), count in sorted(self.by_scenario.items()):
            lines.append(f"{scenario:<34}{role:<10}{count:>9}")
        lines.append(f"{'total':<44}{self.events:>9}")
        if self.first_ms is not None and self.last_ms is not None:
            lines.append(
                f"event time {format_utc_ms(ms_to_datetime(self.first_ms))} .. "
                f"{format_utc_ms(ms_to_datetime(self.last_ms))}"
            )
        lines.append(f"produced in {self.wall_s:.1f} s ({self.events_per_s:,.0f} events/s)")
        return "\n".join(lines)


def default_start_ms(now_ms: int, duration_ms: int, speedup: float) -> int:
    """A start that keeps every event at or before the moment it is produced."""
    lag = 1.0 if speedup <= 0 else max(0.0, 1.0 - 1.0 / speedup)
    start = now_ms - int(duration_ms * lag)
    return start - start % 1000


def check_start(config: SimConfig, speedup: float, now_ms: int) -> None:
    """Refuse starts the worker would dead-letter (future) or the broker would delete (old)."""
    first_ms = config.start_ms - config.history_ms
    span_ms = config.end_ms - first_ms
    produce_s = 0.0 if speedup <= 0 else span_ms / speedup / 1000
    latest_allowed = now_ms + int(produce_s * 1000) + FUTURE_SKEW_MS
    if first_ms > now_ms + FUTURE_SKEW_MS or config.end_ms > latest_allowed:
        raise ScenarioError(
            "the run's events would be in the future when produced (the worker dead-letters "
            "events more than 5 minutes ahead); use an earlier --start, a lower --speedup, "
            "or omit --start"
        )
    if first_ms < now_ms - RETENTION_MARGIN_MS:
        raise ScenarioError(
            "--start is more than 6 days ago: record timestamps are event times and the input "
            "topic keeps 7 days, so the broker would delete the run; use --dry-run for old dates"
        )


def _write_line(handle: IO[bytes], row: object) -> None:
    handle.write(orjson.dumps(row))
    handle.write(b"\n")


def _tee_truth(
    events: Iterable[SimEvent], truth: IO[bytes], summary: Summary
) -> Iterator[SimEvent]:
    for event in events:
        _write_line(truth, event.truth_row())
        summary.add(event)
        yield event


def _with_progress(events: Iterable[SimEvent], config: SimConfig) -> Iterator[SimEvent]:
    """Pass the events through, reporting how much of the simulated span is produced."""
    from pipeline.progress import Progress

    progress = Progress("simulate")
    count = 0
    for event in events:
        count += 1
        if count % 500 == 0:
            fraction = (event.occurred_ms - config.start_ms) / max(config.duration_ms, 1)
            progress.update(fraction, f"of simulated time, {count:,} events")
        yield event
    progress.done(f"{count:,} events")


def dry_run(options: SimulateOptions) -> Summary:
    """Write the events (one wire JSON object per line) and the truth to files."""
    assert options.out_path is not None
    summary = Summary()
    started = time.perf_counter()
    options.out_path.parent.mkdir(parents=True, exist_ok=True)
    options.truth_path.parent.mkdir(parents=True, exist_ok=True)
    with options.out_path.open("wb") as out, options.truth_path.open("wb") as truth:
        events = _tee_truth(generate(options.config), truth, summary)
        for event in _with_progress(events, options.config):
            _write_line(out, event.wire)
    summary.wall_s = time.perf_counter() - started
    return summary


async def produce(options: SimulateOptions, settings: Settings) -> Summary:
    """Create the topics if needed, then produce the run, paced by ``speedup``."""
    from aiokafka import AIOKafkaProducer

    from pipeline.kafka_admin import ensure_topics, wait_for_broker
    from pipeline.kafka_client import producer_kwargs, security_kwargs

    kafka = settings.kafka
    security = security_kwargs(kafka)
    await wait_for_broker(kafka.bootstrap_servers, 30.0, security=security)
    specs = Topics.from_settings(kafka).specs(kafka.partitions)
    await ensure_topics(
        kafka.bootstrap_servers,
        specs,
        replication_factor=kafka.replication_factor,
        security=security,
    )
    producer = AIOKafkaProducer(
        **producer_kwargs(kafka),
        linger_ms=20,
        max_batch_size=512 * 1024,
        max_request_size=4 * 1024 * 1024,
    )
    summary = Summary()
    options.truth_path.parent.mkdir(parents=True, exist_ok=True)
    await producer.start()
    try:
        with options.truth_path.open("wb") as truth:
            started = time.perf_counter()
            events = _with_progress(
                _tee_truth(generate(options.config), truth, summary), options.config
            )
            await _send_paced(producer, kafka.input_topic, events, options, started)
            await producer.flush()
            summary.wall_s = time.perf_counter() - started
    finally:
        await producer.stop()
    return summary


async def _send_paced(
    producer: object,
    topic: str,
    events: Iterable[SimEvent],
    options: SimulateOptions,
    started: float,
) -> None:
    from aiokafka import AIOKafkaProducer

    assert isinstance(producer, AIOKafkaProducer)
    start_ms, speedup = options.config.start_ms, options.speedup
    in_flight: list[asyncio.Future[object]] = []
    for event in events:
        if speedup > 0:
            due_s = (event.occurred_ms - start_ms) / 1000 / speedup
            ahead_s = due_s - (time.perf_counter() - started)
            if ahead_s > 0.005:
                await asyncio.sleep(ahead_s)
        in_flight.append(
            await producer.send(
                topic,
                value=orjson.dumps(event.wire),
                key=event.wire["account"].encode(),
                timestamp_ms=event.occurred_ms,
            )
        )
        if len(in_flight) >= SEND_WINDOW:
            await asyncio.gather(*in_flight)
            in_flight.clear()
    await asyncio.gather(*in_flight)


def run_simulate(options: SimulateOptions, settings: Settings) -> Summary:
    """The CLI entry: dry run to files, or produce to Kafka; logs and returns the summary."""
    config = options.config
    check_config(config)
    log.info(
        "simulate_started",
        scenarios=",".join(config.scenarios),
        rate_per_s=config.rate_per_s,
        duration_ms=config.duration_ms,
        seed=config.seed,
        start=format_utc_ms(ms_to_datetime(config.start_ms)),
        speedup=options.speedup,
        dry_run=options.out_path is not None,
    )
    if options.out_path is not None:
        summary = dry_run(options)
    else:
        check_start(config, options.speedup, wall_ms())
        summary = asyncio.run(produce(options, settings))
    log.info(
        "simulate_finished",
        events=summary.events,
        wall_s=round(summary.wall_s, 2),
        events_per_s=round(summary.events_per_s),
        truth=str(options.truth_path),
    )
    return summary


def run_simulate_command(
    settings: Settings,
    *,
    scenarios: tuple[str, ...],
    rate_per_s: float,
    duration_s: float,
    seed: int,
    speedup: float,
    start_ms: int | None,
    truth: Path | None,
    out: Path | None,
    history_s: float = 0.0,
) -> int:
    """``authpipe simulate``: resolve defaults, run, print the summary."""
    duration_ms = round(duration_s * 1000)
    if truth is None:
        truth = (
            out.with_suffix(".truth.jsonl") if out else settings.state_dir / "sim" / "truth.jsonl"
        )
    if out is not None and truth.resolve() == out.resolve():
        raise ScenarioError(f"--truth and --out are both {out}; give them different paths")
    history_ms = round(history_s * 1000)
    if start_ms is None:
        start_ms = default_start_ms(wall_ms(), duration_ms + history_ms, speedup) + history_ms
    config = SimConfig(scenarios, rate_per_s, duration_ms, seed, start_ms, history_ms)
    summary = run_simulate(SimulateOptions(config, speedup, truth, out), settings)
    print(summary.render())
    where = (
        f"events: {out}"
        if out
        else f"topic: {settings.kafka.input_topic} at {settings.kafka.bootstrap_servers}"
    )
    print(f"{where}\ntruth: {truth}")
    return 0
