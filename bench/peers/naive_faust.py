"""The naive peer: the same counting as per-event faust windowed tables.

Run as ``python -m bench.peers.naive_faust BOOTSTRAP TOPIC EVENTS STATE_DIR TIMEOUT_S [STALL_S]``.
One agent iterates the input topic event by event; each event increments two tumbling
15-minute windowed tables (per (account, source) and per account), relative to the
message timestamp (= ``occurred_at``): every increment is one changelog message, as faust
does it. Logging is quieted exactly as in the worker (no spinner, root at WARNING), so
the comparison is of the design, not of log records.

Configured as a competent faust user would for a table-heavy agent (``SETTINGS`` and
``PRODUCER_BUFFER_MAX_MESSAGES``; why each, in bench/README.md, "How each peer is
configured"); ``BENCH_NAIVE_FAUST_SETTINGS`` (JSON) overrides them for A/B runs.

The run is to completion: TOPIC holds exactly EVENTS events; the clock runs from the
first event the agent takes to the EVENTS-th counted in both tables. ``events_seen``
(events the agent took) and ``events_counted`` (events whose two increments were made)
are both reported. TIMEOUT_S only bounds a broken run (then ``complete`` is false).

Two guards keep a faust failure from hanging the benchmark: the tables' changelog topics
are created (and their leaders awaited) before faust starts, because faust caches a
brand-new topic with no leader yet as unknown for minutes; and a watchdog thread ends the
run if faust delivers no first event within STALL_S seconds (faust-streaming 0.15 can drop
every message fetched before its recovery completes: see bench/README.md), or stops
delivering for STALL_S.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import faust
import orjson

from pipeline.kafka_admin import TopicSpec, ensure_topics

WINDOW = timedelta(minutes=15)
PARTITIONS = 8
TABLES = ("pairs", "accounts")
CHANGELOG_CONFIG = {"cleanup.policy": "compact"}
# faust's defaults are a stream buffer of 4,096 events, a producer buffer of 100 messages
# (a class attribute, no setting), linger 0 and 16 kB batches: see bench/README.md.
SETTINGS: dict[str, Any] = {
    "stream_buffer_maxsize": 16_384,
    "producer_linger": 0.005,
    "producer_max_batch_size": 1 << 20,
    "broker_commit_every": 10_000,
    "broker_commit_interval": 2.8,
    "producer_threaded": True,
}
PRODUCER_BUFFER_MAX_MESSAGES = 10_000


def settings() -> tuple[dict[str, Any], int]:
    """SETTINGS and the producer buffer size, with BENCH_NAIVE_FAUST_SETTINGS applied."""
    overrides = orjson.loads(os.environ.get("BENCH_NAIVE_FAUST_SETTINGS", "{}"))
    buffer_max = int(overrides.pop("producer_buffer_max_messages", PRODUCER_BUFFER_MAX_MESSAGES))
    return {**SETTINGS, **overrides}, buffer_max


class Progress:
    def __init__(self, events: int, timeout_s: float, config: dict[str, Any]) -> None:
        self.events = events
        self.timeout_s = timeout_s
        self.config = config
        self.seen = 0
        self.count = 0
        self.first_s = self.cpu_first_s = 0.0
        self.last_s = 0.0
        self.lock = threading.Lock()

    def saw(self) -> None:
        if not self.seen:
            self.first_s, self.cpu_first_s = time.perf_counter(), time.process_time()
        self.seen += 1

    def counted(self) -> None:
        self.count += 1
        self.last_s = time.perf_counter()
        if self.count >= self.events:
            self.finish(complete=True)

    def watch(self, stall_s: float) -> None:
        """Watchdog thread: end the run if faust delivers nothing for ``stall_s``."""
        started_s = time.perf_counter()
        while True:
            time.sleep(0.5)
            now_s = time.perf_counter()
            if not self.seen and now_s - started_s >= stall_s:
                self.fail(f"faust delivered no event within {stall_s:.0f} s of start")
            if self.seen and (
                now_s - self.last_s >= stall_s or now_s - started_s >= self.timeout_s
            ):
                self.finish(complete=False)

    def fail(self, message: str) -> None:
        with self.lock:
            sys.stdout.write(
                "\n" + orjson.dumps({"peer": "naive_faust", "error": message}).decode() + "\n"
            )
            sys.stdout.flush()
            os._exit(3)

    def finish(self, complete: bool) -> None:
        self.lock.acquire()
        seconds = max(self.last_s - self.first_s, 1e-9)
        cpu_s = time.process_time() - self.cpu_first_s
        result: dict[str, Any] = {
            "peer": "naive_faust",
            "complete": complete,
            "events": self.count,
            "events_seen": self.seen,
            "events_counted": self.count,
            "seconds": round(seconds, 3),
            "events_per_s": round(self.count / seconds),
            "cpu_s": round(cpu_s, 2),
            "events_per_cpu_s": round(self.count / max(cpu_s, 1e-9)),
            "settings": self.config,
        }
        sys.stdout.write("\n" + orjson.dumps(result).decode() + "\n")
        sys.stdout.flush()
        os._exit(0)


def build_app(bootstrap: str, topic_name: str, state_dir: str, progress: Progress) -> faust.App:
    config = dict(progress.config)
    buffer_max = config.pop("producer_buffer_max_messages")
    app = faust.App(
        f"naive-faust-{uuid.uuid4().hex[:8]}",
        broker=f"kafka://{bootstrap}",
        store="memory://",
        topic_partitions=PARTITIONS,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        datadir=state_dir,
        loghandlers=[],
        table_standby_replicas=0,
        **config,
    )
    topic = app.topic(topic_name, key_serializer="raw", value_serializer="raw")
    table: dict[str, Any] = {"default": int, "partitions": PARTITIONS}
    pairs = (
        app.Table(TABLES[0], **table)
        .tumbling(WINDOW, expires=timedelta(hours=1))
        .relative_to_stream()
    )
    accounts = (
        app.Table(TABLES[1], **table)
        .tumbling(WINDOW, expires=timedelta(hours=1))
        .relative_to_stream()
    )

    @app.agent(topic)
    async def count(stream: Any) -> None:
        # faust has no setting for it: raising the class attribute is the known remedy for
        # "producer buffer full" with table-heavy agents (faust-streaming issue #173)
        app.producer.buffer.max_messages = buffer_max
        async for value in stream:
            progress.saw()
            event = orjson.loads(value)
            pairs[f"{event['account']}|{event['peer_ip']}"] += 1
            accounts[event["account"]] += 1
            progress.counted()

    @app.task
    async def quiet() -> None:
        root = logging.getLogger()
        root.setLevel(logging.WARNING)
        for handler in list(root.handlers):
            if type(handler).__name__ == "SpinnerHandler":
                root.removeHandler(handler)

    return app


def main(argv: list[str] | None = None) -> int:
    args = argv or sys.argv[1:]
    bootstrap, topic, events, state_dir, timeout_s = args[:5]
    stall_s = float(args[5]) if len(args) > 5 else 60.0
    config, buffer_max = settings()
    progress = Progress(
        int(events), float(timeout_s), {**config, "producer_buffer_max_messages": buffer_max}
    )
    app = build_app(bootstrap, topic, state_dir, progress)
    specs = [
        TopicSpec(f"{app.conf.id}-{name}-changelog", PARTITIONS, CHANGELOG_CONFIG)
        for name in TABLES
    ]
    asyncio.run(ensure_topics(bootstrap, specs))
    threading.Thread(target=progress.watch, args=(stall_s,), daemon=True).start()
    worker = faust.Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
