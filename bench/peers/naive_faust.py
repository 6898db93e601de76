"""The naive peer: the same counting as per-event faust windowed tables.

Run as ``python -m bench.peers.naive_faust BOOTSTRAP TOPIC EVENTS STATE_DIR BUDGET_S``. One agent
iterates the input topic event by event; each event increments two tumbling 15-minute
windowed tables (per (account, source) and per account), relative to the message
timestamp (= ``occurred_at``): every increment is one changelog message, as faust does
it. Logging is quieted exactly as in the worker (no spinner, root at WARNING), so the
comparison is of the design, not of log records. The rate is counted from the first
event to the EVENTS-th, or to the last event within BUDGET_S seconds of the first (a
per-event design is slow: the budget bounds the run); then the process prints its JSON
line and exits at once.

Two guards keep a faust failure from hanging the benchmark: the tables' changelog topics
are created (and their leaders awaited) before faust starts, because faust caches a
brand-new topic with no leader yet as unknown for minutes; and a watchdog thread ends the
run if faust delivers no first event within STALL_S seconds (faust-streaming 0.15 can drop
every message fetched before its recovery completes: see bench/README.md), or stops
delivering before the budget is used (then the rate covers what was delivered).
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


class Progress:
    def __init__(self, events: int, budget_s: float) -> None:
        self.events = events
        self.budget_s = budget_s
        self.count = 0
        self.first_s = self.cpu_first_s = 0.0
        self.lock = threading.Lock()

    def tick(self) -> None:
        if not self.count:
            self.first_s, self.cpu_first_s = time.perf_counter(), time.process_time()
        self.count += 1
        if self.count >= self.events or time.perf_counter() - self.first_s >= self.budget_s:
            self.finish()

    def watch(self, stall_s: float) -> None:
        """Watchdog thread: end the run if faust delivers nothing for ``stall_s``."""
        started_s = time.perf_counter()
        while True:
            time.sleep(0.5)
            now_s = time.perf_counter()
            if not self.count and now_s - started_s >= stall_s:
                self.fail(f"faust delivered no event within {stall_s:.0f} s of start")
            if self.count and now_s - self.first_s >= self.budget_s + stall_s:
                self.finish()

    def fail(self, message: str) -> None:
        with self.lock:
            sys.stdout.write("\n" + orjson.dumps({"peer": "naive_faust", "error": message}).decode() + "\n")
            sys.stdout.flush()
            os._exit(3)

    def finish(self) -> None:
        self.lock.acquire()
        seconds = time.perf_counter() - self.first_s
        cpu_s = time.process_time() - self.cpu_first_s
        result: dict[str, Any] = {
            "peer": "naive_faust", "events": self.count, "seconds": round(seconds, 3),
            "events_per_s": round(self.count / seconds), "cpu_s": round(cpu_s, 2),
            "events_per_cpu_s": round(self.count / max(cpu_s, 1e-9)),
        }  # fmt: skip
        sys.stdout.write("\n" + orjson.dumps(result).decode() + "\n")
        sys.stdout.flush()
        os._exit(0)


def build_app(bootstrap: str, topic_name: str, state_dir: str, progress: Progress) -> faust.App:
    app = faust.App(
        f"naive-faust-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}", store="memory://",
        topic_partitions=PARTITIONS, consumer_auto_offset_reset="earliest", web_enabled=False,
        datadir=state_dir, loghandlers=[], table_standby_replicas=0,
    )  # fmt: skip
    topic = app.topic(topic_name, key_serializer="raw", value_serializer="raw")
    table: dict[str, Any] = {"default": int, "partitions": PARTITIONS}
    pairs = app.Table(TABLES[0], **table).tumbling(WINDOW, expires=timedelta(hours=1)).relative_to_stream()
    accounts = app.Table(TABLES[1], **table).tumbling(WINDOW, expires=timedelta(hours=1)).relative_to_stream()

    @app.agent(topic)
    async def count(stream: Any) -> None:
        async for value in stream:
            event = orjson.loads(value)
            pairs[f"{event['account']}|{event['peer_ip']}"] += 1
            accounts[event["account"]] += 1
            progress.tick()

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
    bootstrap, topic, events, state_dir, budget_s = args[:5]
    stall_s = float(args[5]) if len(args) > 5 else 60.0
    progress = Progress(int(events), float(budget_s))
    app = build_app(bootstrap, topic, state_dir, progress)
    specs = [TopicSpec(f"{app.conf.id}-{name}-changelog", PARTITIONS, CHANGELOG_CONFIG) for name in TABLES]
    asyncio.run(ensure_topics(bootstrap, specs))
    threading.Thread(target=progress.watch, args=(stall_s,), daemon=True).start()
    worker = faust.Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
