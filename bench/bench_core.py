"""Benchmark of the policy core: ``Engine.step_batch`` on pre-decoded attempts.

Run as ``python -m bench.bench_core [--events N] [--seed S]``. The traffic is generated
deterministically from the seed and mixes, by share of events:

* ordinary users (80 %): own home source (some behind shared corporate NATs), a device
  cookie trusted for them most of the time, ~90 % success, login/token/uia/mfa flows;
* brute force (5 %): single sources hammering single accounts;
* distributed brute force (5 %): a botnet of addresses against a handful of accounts;
* password spray (5 %): a few sources trying one password on many accounts;
* credential stuffing (5 %): sources whose failures are mostly ``unknown_account``.

Every rule is evaluated (the source rule in ``enforce`` mode, an allowlist configured).
The timed run has no tracemalloc; a second run on a fresh engine with tracemalloc
measures the bytes held by the bounded tables per entry (what dropping every table
entry frees, divided by the number of entries). The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from typing import Any

import orjson

from pipeline.core.attempt import Attempt
from pipeline.core.engine import Engine
from pipeline.core.policy import Policy, policy_from_mapping
from pipeline.runtime import GC_THRESHOLDS, tune_gc

T0_MS = 1_790_000_000_000
EVENTS_PER_SECOND = 500  # event-time rate: 1M events span ~33 minutes (two windows)
CHUNK = 10_000
TENANTS = (("default", 0.7), ("acme", 0.2), ("globex", 0.1))


def bench_policy() -> Policy:
    """Defaults with every rule on, an allowlist, and a tenant with its own thresholds."""
    return policy_from_mapping(
        {
            "policy_version": "bench-1",
            "defaults": {
                "source": {"threshold": 200, "mode": "enforce"},
                "allowlist": ["192.0.2.0/24", "2001:db8:ffff::/48"],
            },
            "tenants": {"acme": {"account_source": {"threshold": 3}, "account": {"threshold": 30}}},
        }
    )


class _Traffic:
    """Deterministic pools of identities and the event generators that draw from them."""

    def __init__(self, rng: random.Random, users: int) -> None:
        self.rng = rng
        hexid = lambda: f"{rng.getrandbits(128):032x}"  # noqa: E731
        nats = [f"198.51.{i // 256}.{i % 256}" for i in range(50)]
        self.users: list[tuple[str, str, str, str, bool]] = []
        for i in range(users):
            tenant = _pick(rng, TENANTS)
            if rng.random() < 0.2:
                source = rng.choice(nats)
            elif rng.random() < 0.25:
                source = f"2001:db8:{rng.getrandbits(16):x}:{rng.getrandbits(16):x}::/64"
            else:
                source = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
            self.users.append((tenant, hexid(), source, hexid(), rng.random() < 0.7))
        self.victims = [hexid() for _ in range(20)]
        self.botnet = [f"203.0.{i // 250}.{i % 250}" for i in range(2000)]
        self.brute = [(f"100.64.{i}.1", hexid()) for i in range(10)]
        self.sprayers = [f"100.65.{i}.7" for i in range(10)]
        self.stuffers = [f"100.66.{i}.9" for i in range(20)]
        self.hexid = hexid

    def user(self, eid: str, t: int) -> Attempt:
        rng = self.rng
        tenant, account, source, device, trusted = rng.choice(self.users)
        r = rng.random()
        flow = "login" if r < 0.8 else "token" if r < 0.88 else "uia" if r < 0.95 else "mfa"
        success = rng.random() < 0.9
        session = device if flow == "uia" else None
        reason = None if success else ("bad_second_factor" if flow == "mfa" else "bad_password")
        return Attempt(
            eid, t, tenant, account, source, device, session, trusted, flow, success, reason
        )

    def brute_force(self, eid: str, t: int) -> Attempt:
        source, account = self.rng.choice(self.brute)
        return Attempt(
            eid, t, "default", account, source, None, None, False, "login", False, "bad_password"
        )

    def distributed(self, eid: str, t: int) -> Attempt:
        rng = self.rng
        return Attempt(
            eid,
            t,
            "default",
            rng.choice(self.victims),
            rng.choice(self.botnet),
            None,
            None,
            False,
            "login",
            False,
            "bad_password",
        )

    def spray(self, eid: str, t: int) -> Attempt:
        rng = self.rng
        return Attempt(
            eid,
            t,
            "default",
            self.hexid(),
            rng.choice(self.sprayers),
            None,
            None,
            False,
            "login",
            False,
            "bad_password",
        )

    def stuffing(self, eid: str, t: int) -> Attempt:
        rng = self.rng
        reason = "unknown_account" if rng.random() < 0.9 else "bad_password"
        return Attempt(
            eid,
            t,
            "acme",
            self.hexid(),
            rng.choice(self.stuffers),
            None,
            None,
            False,
            "login",
            False,
            reason,
        )


def _pick(rng: random.Random, weighted: tuple[tuple[str, float], ...]) -> str:
    r = rng.random()
    for value, weight in weighted:
        r -= weight
        if r < 0:
            return value
    return weighted[-1][0]


def generate(events: int, seed: int = 7, users: int = 50_000) -> list[Attempt]:
    """``events`` attempts in time order (same seed, same attempts)."""
    rng = random.Random(seed)
    traffic = _Traffic(rng, users)
    kinds = (
        (traffic.user, 0.80),
        (traffic.brute_force, 0.05),
        (traffic.distributed, 0.05),
        (traffic.spray, 0.05),
        (traffic.stuffing, 0.05),
    )
    mean_gap_ms = 1000 / EVENTS_PER_SECOND
    t = float(T0_MS)
    out: list[Attempt] = []
    for i in range(events):
        t += rng.expovariate(1 / mean_gap_ms)
        r = rng.random()
        make = kinds[-1][0]
        for candidate, share in kinds:
            r -= share
            if r < 0:
                make = candidate
                break
        out.append(make(f"{seed:x}-{i:010x}", int(t)))
    return out


def run(engine: Engine, attempts: list[Attempt]) -> None:
    """Feed the engine in chunks, clearing its outbox like a stream stage would."""
    out = engine.out
    for start in range(0, len(attempts), CHUNK):
        engine.step_batch(attempts[start : start + CHUNK])
        out.decisions.clear()
        out.alerts.clear()


def dict_counting(attempts: list[Attempt]) -> None:
    """The yardstick of issue 4: plain dict counting per (tenant, account, source)."""
    counts: dict[tuple[str, str, str], int] = {}
    for a in attempts:
        key = (a.tenant, a.account, a.source)
        counts[key] = counts.get(key, 0) + 1


def timed(events: int, seed: int, repeat: int) -> tuple[float, float, Engine]:
    """Best events/s of the engine and of dict counting over ``repeat`` runs (fresh
    engines). CPU time of this process, not wall time: a busy machine inflates wall time."""
    attempts = generate(events, seed)
    gc.collect()
    gc.freeze()  # the input list is the bench's, not the engine's: keep it out of GC passes
    best = baseline = 0.0
    engine = Engine(bench_policy())
    for _ in range(repeat):
        engine = Engine(bench_policy())
        start = time.process_time()
        run(engine, attempts)
        best = max(best, events / (time.process_time() - start))
        start = time.process_time()
        dict_counting(attempts)
        baseline = max(baseline, events / (time.process_time() - start))
    gc.unfreeze()
    return best, baseline, engine


def table_bytes(events: int, seed: int) -> tuple[int, int]:
    """(bytes held by the bounded tables, their entries), measured with tracemalloc."""
    tracemalloc.start()
    attempts = generate(events, seed)
    engine = Engine(bench_policy())
    run(engine, attempts)
    del attempts  # the keys' digests now live only in the tables
    shards: list[Any] = [engine.accounts, engine.sources]
    for shard in shards:
        shard.take_dirty()
    engine.out.clear()
    entries = sum(shard.entries() for shard in shards)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    for shard in shards:
        for tables in shard.tenants.values():
            for table in tables.tables():
                table._entries.clear()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return before - after, entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs; the best counts")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc run")
    args = parser.parse_args(argv)

    # First with CPython's default collector thresholds, then with the worker's (the
    # headline: it is how the core runs in `authpipe worker`, pipeline.runtime.tune_gc).
    default_gc_rate, _, _ = timed(args.events, args.seed, args.repeat)
    defaults = tune_gc()
    rate, baseline, engine = timed(args.events, args.seed, args.repeat)
    gc.set_threshold(*defaults)
    m = engine.accounts.metrics
    print(
        f"events/s: {rate:,.0f} ({args.events:,} events, best of {args.repeat}, CPU time, "
        f"the worker's GC thresholds {GC_THRESHOLDS}); {default_gc_rate:,.0f} with CPython's"
    )
    print(
        f"dict counting on this machine: {baseline:,.0f} events/s "
        f"({1e6 / baseline:.2f} us/event; the core takes {baseline / rate:.1f}x that)"
    )
    print(
        f"decisions: {m.decisions + engine.sources.metrics.decisions:,}, "
        f"alerts: {m.alerts + engine.sources.metrics.alerts:,}, "
        f"entries: {engine.accounts.entries() + engine.sources.entries():,}"
    )
    result: dict[str, Any] = {
        "bench": "core",
        "events": args.events,
        "events_per_s": round(rate),
        "us_per_event": round(1e6 / rate, 2),
        "dict_counting_events_per_s": round(baseline),
        "events_per_s_default_gc": round(default_gc_rate),
        "gc_thresholds": list(GC_THRESHOLDS),
    }
    if not args.no_memory:
        held, entries = table_bytes(args.events, args.seed)
        per_key = held / entries if entries else 0.0
        print(f"state: {held:,} bytes in {entries:,} entries = {per_key:,.0f} bytes per key")
        result.update(table_bytes=held, entries=entries, bytes_per_key=round(per_key))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
