"""B8, "ten million" (issue 45), its first part: one edge's familiar records in memory.

A tenant of 10M accounts with three places or clients each in 30 days is 30M familiar
exempts, and every edge holds every one. This measures, each in a fresh process (so the
resident growth and the peak are its own):

* ``rust``: the compiled engine's ``authpipe_engine.FamiliarStore`` reserved for N records
  (an edge can reserve from the topic's end offsets), loaded with N synthetic records
  generated in bulk (random 16-byte digests, as BLAKE2b's are; issued over the last 30
  days) through ``put_many`` in packed chunks: resident bytes per record, load seconds,
  the peak, a full ``prune`` and a bounded ``prune_step``, and the latency of one lookup
  from Python, hits and misses, by digest (``contains_at``) and by key (``familiar_at``,
  the digest computed in the engine);
* ``rust_grown``: the same without the reservation (the table grows by half each time);
* ``python``: today's edge, ``DecisionView.apply`` of encoded exempts (decode and the
  core's ``DecisionIndex`` on its dict, ``AUTHPIPE_ENGINE=python``) for a smaller N,
  extrapolated to the Rust side's N, with the latency of ``DecisionIndex.unfamiliar`` for
  hits and misses, and the decode alone per record (what a cold load from the topic pays
  per record before the store);
* ``edge_with_store``: the same edge with its familiar exempts in the store
  (``AUTHPIPE_ENGINE=rust``): what the view costs per record once they leave the dict.

Run ``python -m bench.b8_familiar [--records 30000000] [--python-records 1000000]
[--out bench/results/<file>.json]``; the last line printed is the JSON result.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench.procfs import status_kb

RECORDS = 30_000_000
PYTHON_RECORDS = 1_000_000
CHUNK = 1_000_000
SAMPLES = 100_000
TENANT = "b8"
DAY_MS = 86_400_000
MONTH_MS = 30 * DAY_MS
NOW_MS = 1_796_601_600_000
"""2026-12-07T00:00Z: a fixed clock, so every run builds the same records."""
TARGETS = {"bytes_per_record": 64, "rss_mb_30m": 2048, "load_s_30m": 60}


def _mem_kb() -> dict[str, int]:
    return status_kb("self", ("VmRSS", "VmHWM"))


def _pcts(ns: list[int], overhead_ns: int) -> dict[str, float]:
    """p50, p99, p99.9 and max of one call, in microseconds, less the timer's own median."""
    ns = sorted(max(0, x - overhead_ns) for x in ns)

    def at(q: float) -> float:
        return round(ns[min(len(ns) - 1, int(q * len(ns)))] / 1000, 3)

    return {"p50_us": at(0.50), "p99_us": at(0.99), "p999_us": at(0.999), "max_us": at(1.0)}


def _timer_overhead_ns() -> int:
    clock = time.perf_counter_ns
    laps = []
    for _ in range(SAMPLES):
        t0 = clock()
        laps.append(clock() - t0)
    laps.sort()
    return laps[len(laps) // 2]


def _latency(call: Any, args: list[tuple[Any, ...]], overhead_ns: int) -> dict[str, float]:
    clock = time.perf_counter_ns
    laps = []
    for a in args:
        t0 = clock()
        call(*a)
        laps.append(clock() - t0)
    return _pcts(laps, overhead_ns)


def _sample_keys(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """(account digest, source) of ``count`` users: 32 hex characters and an IPv4 address."""
    return [
        (f"{rng.getrandbits(128):032x}", f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
        for i in range(count)
    ]


# -- the compiled store ------------------------------------------------------------------


def bench_rust(records: int, reserve: bool) -> dict[str, Any]:
    import authpipe_engine as engine
    import numpy as np

    dtype = np.dtype([("key", "V16"), ("expires", "<i8"), ("since", "<i8"), ("fp", "<u8")])
    assert dtype.itemsize == engine.RECORD_BYTES
    gen = np.random.default_rng(8)
    rng = random.Random(8)
    hits = _sample_keys(rng, min(SAMPLES, records))
    misses = _sample_keys(rng, SAMPLES)
    hit_digests = [engine.familiar_digest(TENANT, a, s, None) for a, s in hits]
    miss_digests = [os.urandom(16) for _ in range(SAMPLES)]
    overhead_ns = _timer_overhead_ns()
    gc.collect()
    before = _mem_kb()
    started = time.perf_counter()
    store = engine.FamiliarStore(records if reserve else 0)
    generate_s = load_s = 0.0
    for first in range(0, records, CHUNK):
        n = min(CHUNK, records - first)
        t0 = time.perf_counter()
        chunk = np.empty(n, dtype)
        chunk["key"] = np.frombuffer(gen.bytes(16 * n), dtype="V16")
        if first == 0:  # the sampled users' pairs, with the digests a check computes
            chunk["key"][: len(hit_digests)] = np.frombuffer(b"".join(hit_digests), dtype="V16")
        issued = NOW_MS - gen.integers(0, MONTH_MS, n)
        chunk["expires"] = issued + MONTH_MS
        chunk["since"] = issued
        chunk["fp"] = gen.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
        packed = chunk.tobytes()
        del chunk, issued
        t1 = time.perf_counter()
        store.put_many(packed)
        load_s += time.perf_counter() - t1
        generate_s += t1 - t0
        del packed
    total_s = time.perf_counter() - started
    gc.collect()
    after = _mem_kb()
    rss_bytes = (after["VmRSS"] - before["VmRSS"]) * 1024
    result: dict[str, Any] = {
        "records": len(store),
        "reserved": reserve,
        "slots": store.slot_count(),
        "store_bytes": store.approx_bytes(),
        "store_bytes_per_record": round(store.approx_bytes() / len(store), 1),
        "rss_growth_mb": round(rss_bytes / 2**20, 1),
        "rss_bytes_per_record": round(rss_bytes / len(store), 1),
        "peak_rss_mb": round(after["VmHWM"] / 1024, 1),
        "rss_before_mb": round(before["VmRSS"] / 1024, 1),
        "load_s": round(load_s, 2),
        "load_ns_per_record": round(load_s / records * 1e9, 1),
        "generate_s": round(generate_s, 2),
        "build_s": round(total_s, 2),
    }
    if not reserve:
        return result
    result["timer_overhead_ns"] = overhead_ns
    result["contains_at_hit"] = _latency(
        store.contains_at, [(d, NOW_MS) for d in hit_digests], overhead_ns
    )
    result["contains_at_miss"] = _latency(
        store.contains_at, [(d, NOW_MS) for d in miss_digests], overhead_ns
    )
    result["familiar_at_hit"] = _latency(
        store.familiar_at, [(TENANT, a, s, None, NOW_MS) for a, s in hits], overhead_ns
    )
    result["familiar_at_miss"] = _latency(
        store.familiar_at, [(TENANT, a, s, None, NOW_MS) for a, s in misses], overhead_ns
    )
    assert all(store.familiar_at(TENANT, a, s, None, NOW_MS) for a, s in hits[:1000])
    assert not any(store.familiar_at(TENANT, a, s, None, NOW_MS) for a, s in misses[:1000])
    t0 = time.perf_counter()
    step = store.prune_step(NOW_MS + DAY_MS, 65_536)
    result["prune_step_65536_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    t0 = time.perf_counter()
    pruned = store.prune(NOW_MS + DAY_MS)
    result["prune_full_s"] = round(time.perf_counter() - t0, 2)
    result["pruned_one_day"] = pruned + step
    return result


# -- today's Python index ----------------------------------------------------------------


def bench_python(records: int) -> dict[str, Any]:
    from bench.edge_familiar import messages
    from pipeline.core.keys import parse_key
    from pipeline.core.policy import Policy
    from pipeline.edge.decode import decode_decision, decode_key
    from pipeline.edge.feed import settle_heap
    from pipeline.edge.view import DecisionView
    from pipeline.settings import Settings
    from pipeline.wiring import build_normaliser

    t0 = time.perf_counter()
    batch = messages(records, NOW_MS)
    generate_s = time.perf_counter() - t0
    norm = build_normaliser(Settings())
    overhead_ns = _timer_overhead_ns()
    gc.collect()
    before = _mem_kb()
    # [verify] enforce (the default): unfamiliar looks the pair up, as the edge's check does.
    view = DecisionView(norm, now_ms=lambda: NOW_MS, policy=Policy())
    t0 = time.perf_counter()
    for key, value in batch:
        view.apply(key, value)
    load_s = time.perf_counter() - t0
    settle_heap()
    gc.collect()
    after = _mem_kb()
    rss_bytes = (after["VmRSS"] - before["VmRSS"]) * 1024
    keys = (parse_key(k.decode()) for k, _ in batch)
    pairs = [k for k in keys if k[3] is not None][:SAMPLES]  # (account, place) pairs
    rng = random.Random(8)
    index = view.index
    hits = [(k[1], k[2] or "", k[3] or "", None, NOW_MS) for k in pairs]
    misses = [(t, f"{rng.getrandbits(128):032x}", s, None, n) for t, _, s, _, n in hits]
    assert all(not index.unfamiliar(*h).step_up for h in hits[:1000])
    assert all(index.unfamiliar(*m).step_up for m in misses[:1000])
    sample = batch[:SAMPLES]
    t0 = time.perf_counter()
    for key, value in sample:
        _, wire = decode_key(key)
        # The value's source is the key's own, which the view never checks twice.
        decode_decision(wire, value, lambda source: True)
    decode_s = time.perf_counter() - t0
    n = len(view)
    per_record = rss_bytes / n
    return {
        "records": n,
        "rss_growth_mb": round(rss_bytes / 2**20, 1),
        "rss_bytes_per_record": round(per_record, 1),
        "peak_rss_mb": round(after["VmHWM"] / 1024, 1),
        "load_s": round(load_s, 2),
        "apply_us_per_record": round(load_s / records * 1e6, 2),
        "decode_us_per_record": round(decode_s / len(sample) * 1e6, 2),
        "generate_s": round(generate_s, 2),
        "timer_overhead_ns": overhead_ns,
        "unfamiliar_hit": _latency(index.unfamiliar, hits, overhead_ns),
        "unfamiliar_miss": _latency(index.unfamiliar, misses, overhead_ns),
    }


# -- the whole part ----------------------------------------------------------------------


def _child(variant: str, args: argparse.Namespace, engine: str = "auto") -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.b8_familiar", "--variant", variant]
    command += ["--records", str(args.records), "--python-records", str(args.python_records)]
    env = {**os.environ, "AUTHPIPE_ENGINE": engine}  # DecisionIndex's familiar storage
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
    result: dict[str, Any] = orjson.loads(lines[-1])
    return result


def bench_b8(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    started = datetime.now(UTC)
    rust = _child("rust", args)
    grown = _child("rust_grown", args)
    python = _child("python", args, engine="python")
    edge_with_store = _child("python", args, engine="rust")
    out: dict[str, Any] = {
        "part": "b8_familiar",
        "started_at": started.isoformat(timespec="seconds"),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "nproc": os.cpu_count(),
        "rust": rust,
        "rust_grown": grown,
        "python": python,
        "edge_with_store": edge_with_store,
        "targets": TARGETS,
    }
    if "error" not in rust and "error" not in python:
        scale = rust["records"]
        out["python_extrapolated"] = {
            "records": scale,
            "rss_gb": round(python["rss_bytes_per_record"] * scale / 2**30, 1),
            "apply_s": round(python["apply_us_per_record"] * scale / 1e6),
            "decode_only_s": round(python["decode_us_per_record"] * scale / 1e6),
        }
        out["ratio_bytes_per_record"] = round(
            python["rss_bytes_per_record"] / rust["rss_bytes_per_record"], 1
        )
        out["met"] = {
            "bytes_per_record": rust["rss_bytes_per_record"] <= TARGETS["bytes_per_record"],
            "rss_30m": rust["rss_growth_mb"] * RECORDS / scale <= TARGETS["rss_mb_30m"],
            "load_30m": rust["load_s"] * RECORDS / scale <= TARGETS["load_s_30m"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=RECORDS)
    parser.add_argument("--python-records", type=int, default=PYTHON_RECORDS)
    parser.add_argument("--variant", choices=("all", "rust", "rust_grown", "python"), default="all")
    parser.add_argument("--out", type=Path, help="also write the result (JSON) here")
    args = parser.parse_args(argv)
    if args.variant == "rust":
        result = bench_rust(args.records, reserve=True)
    elif args.variant == "rust_grown":
        result = bench_rust(args.records, reserve=False)
    elif args.variant == "python":
        result = bench_python(args.python_records)
    else:
        result = bench_b8(args)
    text = orjson.dumps(result, option=orjson.OPT_INDENT_2 if args.out else 0)
    if args.out:
        args.out.write_bytes(text + b"\n")
    print(orjson.dumps(result).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
