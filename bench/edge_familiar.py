"""The edge's memory for familiar exempts (issue 24's warm start): bytes per record.

A success publishes ``familiar|t|a|s|-`` (and ``familiar|t|a|-|d`` for an untrusted client)
for 30 days, so an edge holds one record per (account, place) and (account, client) of the
last 30 days: a warm start's backfill (docs/operations.md) fills it at once. This applies
``count`` exempts, one per user, 60 % pair and 40 % client, as they arrive on the decisions
topic (``DecisionView.apply`` of the encoded record), and reports the Python heap they hold
(tracemalloc, after a collection) and the process's resident growth, per record, and the
cost of applying one.

Run as ``python -m bench.edge_familiar [--count N]`` (or the ``familiar`` part of
``bench.bench_edge``); the last line printed is JSON.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from typing import Any

import orjson

from bench.bench_edge import TENANT, Workload, decision_message
from bench.procfs import status_kb
from pipeline.clock import wall_ms
from pipeline.core.keys import Key
from pipeline.core.policy_rules import DAY_MS
from pipeline.edge.feed import settle_heap
from pipeline.edge.view import DecisionView
from pipeline.settings import Settings
from pipeline.wiring import build_normaliser

PAIR_SHARE_INVERSE = 5
"""Of every five users, three records are pairs and two are clients."""


def _rss_kb() -> int:
    return status_kb("self", ("VmRSS",)).get("VmRSS", 0)


def messages(count: int, now_ms: int) -> list[tuple[bytes, bytes]]:
    norm = build_normaliser(Settings())
    out = []
    for i in range(count):
        account, address, _ = Workload.user(i)
        digest = norm.account_digest(TENANT, account)
        if i % PAIR_SHARE_INVERSE < 3:
            key: Key = ("familiar", TENANT, digest, address, None)
        else:
            key = ("familiar", TENANT, digest, None, norm.digester.device(TENANT, f"cookie-{i}"))
        # Issued over the last 30 days, as a backfill's successes are.
        issued_ms = now_ms - (i % 30) * DAY_MS
        out.append(decision_message(key, issued_ms + 30 * DAY_MS, issued_ms, i, "exempt"))
    return out


def bench_familiar(count: int) -> dict[str, Any]:
    """Two views over the same records: the first timed and its resident growth taken
    without tracing (tracemalloc slows allocation and holds its own traces), the second
    traced for the heap it holds."""
    batch = messages(count, wall_ms())
    norm = build_normaliser(Settings())
    gc.collect()
    rss_before = _rss_kb()
    timed = DecisionView(norm)
    start = time.perf_counter()
    for key, value in batch:
        timed.apply(key, value)
    apply_s = time.perf_counter() - start
    settle_heap()
    gc.collect()
    rss_growth_kb = _rss_kb() - rss_before
    held = len(timed)
    del timed
    gc.collect()
    tracemalloc.start()
    traced = DecisionView(norm)
    for key, value in batch:
        traced.apply(key, value)
    settle_heap()
    gc.collect()
    heap_bytes, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "familiar_records": count,
        "familiar_held": held,
        "familiar_heap_bytes_per_record": round(heap_bytes / count),
        "familiar_rss_bytes_per_record": round(rss_growth_kb * 1024 / count),
        "familiar_apply_us_per_record": round(apply_s / count * 1e6, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=200_000, help="exempts to apply")
    args = parser.parse_args(argv)
    print(orjson.dumps(bench_familiar(args.count)).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
