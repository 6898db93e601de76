"""The peer users would pick instead: the same windowed counts with Quix Streams.

Run by ``bench.peers.quix`` with the interpreter of its own virtualenv (Quix Streams pins
pydantic below the version authpipe needs, so the two cannot share one environment):
``quix-venv/bin/python bench/peers/quix_peer.py BOOTSTRAP TOPIC EVENTS STATE_DIR TIMEOUT_S``.

Per-account 15-minute tumbling counts on the input (keyed by account), and per-(account,
source) 15-minute tumbling counts after ``group_by`` (Quix's repartition, as its docs
prescribe for a new key), with RocksDB state and changelog topics, windows on the
message timestamp (= ``occurred_at``). Quix's own defaults otherwise (``commit_interval``
5 s, at-least-once): see bench/README.md, "How each peer is configured".

The run is to completion: TOPIC holds exactly EVENTS events, and the clock runs from the
first input event the dataframe sees until the EVENTS-th event is counted in the
(account, source) window, the far end of the topology (so the repartition topic is
drained, not cut off while the backlogged input starves it). ``events_seen`` (input
events through the first step) and ``events_counted`` (events through the last window)
are both reported; they are equal when the run is complete. TIMEOUT_S only bounds a
broken run (then ``complete`` is false). Imports only the standard library, orjson and
quixstreams. The last line printed is JSON.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import orjson
from quixstreams import Application

WINDOW = timedelta(minutes=15)


class Progress:
    def __init__(self, events: int, timeout_s: float) -> None:
        self.events = events
        self.timeout_s = timeout_s
        self.app: Application | None = None
        self.seen = 0
        self.counted = 0
        self.first_s = self.cpu_first_s = 0.0
        self.last_s = self.cpu_last_s = 0.0
        self.result: dict[str, Any] = {}

    def saw(self, value: Any) -> None:
        if not self.seen:
            self.first_s, self.cpu_first_s = time.perf_counter(), time.process_time()
        self.seen += 1

    def counted_pair(self, value: Any) -> None:
        self.counted += 1
        self.last_s, self.cpu_last_s = time.perf_counter(), time.process_time()
        if self.counted >= self.events:
            self.finish(complete=True)

    def finish(self, complete: bool) -> None:
        if self.result:
            return
        seconds = max(self.last_s - self.first_s, 1e-9)
        cpu_s = self.cpu_last_s - self.cpu_first_s
        self.result = {
            "peer": "quix",
            "complete": complete,
            "events": self.counted,
            "events_seen": self.seen,
            "events_counted": self.counted,
            "seconds": round(seconds, 3),
            "events_per_s": round(self.counted / seconds),
            "cpu_s": round(cpu_s, 2),
            "events_per_cpu_s": round(self.counted / max(cpu_s, 1e-9)),
        }
        if self.app is not None:
            self.app.stop()

    def watch(self) -> None:
        """Watchdog thread: a run that has not completed in ``timeout_s`` is stopped."""
        started_s = time.perf_counter()
        while not self.result:
            time.sleep(0.5)
            if time.perf_counter() - started_s >= self.timeout_s:
                self.finish(complete=False)


def main(argv: list[str] | None = None) -> int:
    import quixstreams

    bootstrap, topic_name, events, state_dir, timeout_s = (argv or sys.argv[1:])[:5]
    progress = Progress(int(events), float(timeout_s))
    # Quix's defaults (commit_interval=5.0, commit_every=0, at-least-once), a fresh group
    app = Application(
        broker_address=bootstrap,
        consumer_group=f"quix-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        state_dir=state_dir,
        loglevel="WARNING",
        auto_create_topics=True,
        use_changelog_topics=True,
    )
    progress.app = app
    topic = app.topic(topic_name, value_deserializer="json", key_deserializer="bytes")
    sdf = app.dataframe(topic)
    sdf = sdf.update(progress.saw)
    sdf.tumbling_window(WINDOW).count().final()  # branch: per account (the message key)
    pairs = sdf.group_by(lambda v: f"{v['account']}|{v['peer_ip']}", name="account-source")
    pairs = pairs.tumbling_window(WINDOW).count().current()
    pairs.update(progress.counted_pair)
    logging.getLogger("quixstreams").setLevel(logging.WARNING)
    threading.Thread(target=progress.watch, daemon=True).start()
    app.run()
    result = progress.result or {
        "peer": "quix",
        "error": "stopped early",
        "events_seen": progress.seen,
        "events_counted": progress.counted,
    }
    result["version"] = quixstreams.__version__
    sys.stdout.write("\n" + orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
