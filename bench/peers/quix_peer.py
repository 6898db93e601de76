"""The peer users would pick instead: the same windowed counts with Quix Streams.

Run by ``bench.peers.quix`` with the interpreter of its own virtualenv (Quix Streams pins
pydantic below the version authpipe needs, so the two cannot share one environment):
``quix-venv/bin/python bench/peers/quix_peer.py BOOTSTRAP TOPIC EVENTS STATE_DIR BUDGET_S``.

Per-account 15-minute tumbling counts on the input (keyed by account), and per-(account,
source) 15-minute tumbling counts after ``group_by`` (Quix's repartition, as its docs
prescribe for a new key), with RocksDB state and changelog topics, windows on the
message timestamp (= ``occurred_at``). The rate is counted from the first event to the
EVENTS-th event reaching the (account, source) window, or to the last one within
BUDGET_S seconds of the first. Imports only the standard library,
orjson and quixstreams. The last line printed is JSON.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

import orjson
from quixstreams import Application

WINDOW = timedelta(minutes=15)


class Progress:
    def __init__(self, events: int, budget_s: float, app: Application) -> None:
        self.events = events
        self.budget_s = budget_s
        self.app = app
        self.seen = 0
        self.counted = 0
        self.first_s = self.cpu_first_s = 0.0
        self.result: dict[str, Any] = {}

    def saw(self, value: Any) -> None:
        if not self.seen:
            self.first_s, self.cpu_first_s = time.perf_counter(), time.process_time()
        self.seen += 1

    def counted_pair(self, value: Any) -> None:
        self.counted += 1
        if self.result:
            return
        if self.counted >= self.events or time.perf_counter() - self.first_s >= self.budget_s:
            seconds = time.perf_counter() - self.first_s
            cpu_s = time.process_time() - self.cpu_first_s
            self.result = {
                "peer": "quix", "events": self.counted, "seconds": round(seconds, 3),
                "events_per_s": round(self.counted / seconds), "cpu_s": round(cpu_s, 2),
                "events_per_cpu_s": round(self.counted / max(cpu_s, 1e-9)),
            }  # fmt: skip
            self.app.stop()


def main(argv: list[str] | None = None) -> int:
    import quixstreams

    bootstrap, topic_name, events, state_dir, budget_s = (argv or sys.argv[1:])[:5]
    app = Application(
        broker_address=bootstrap, consumer_group=f"quix-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest", state_dir=state_dir, loglevel="WARNING",
        commit_interval=1.0, auto_create_topics=True, use_changelog_topics=True,
    )  # fmt: skip
    progress = Progress(int(events), float(budget_s), app)
    topic = app.topic(topic_name, value_deserializer="json", key_deserializer="bytes")
    sdf = app.dataframe(topic)
    sdf = sdf.update(progress.saw)
    sdf.tumbling_window(WINDOW).count().final()  # branch: per account (the message key)
    pairs = sdf.group_by(lambda v: f"{v['account']}|{v['peer_ip']}", name="account-source")
    pairs = pairs.tumbling_window(WINDOW).count().current()
    pairs.update(progress.counted_pair)
    logging.getLogger("quixstreams").setLevel(logging.WARNING)
    app.run()
    result = progress.result or {"peer": "quix", "error": "stopped early", "events": progress.counted}
    result["version"] = quixstreams.__version__
    sys.stdout.write("\n" + orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
