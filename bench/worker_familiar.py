"""The worker's memory for familiar pairs (issue 24): bytes per pair and the table's cap.

A success from an untrusted client makes the account familiar at its place
(``familiar|t|a|s|-``) and with its client (``familiar|t|a|-|d``) in the account shard,
and the place known (``familiar|t|-|s|-``) in the source shard: three table entries, each
also a changelog record; the first two are published exempts (a known place is the
source stage's own since issue 44 item 7). This feeds ``users`` such successes (one
per user, each its own account, place and cookie, a second apart) to the core's
``Engine``, the code the worker's stages run, and reports the Python heap the tables hold
per user (tracemalloc, after a collection: all the engine holds, its decision index of
active exempts included, and what clearing every table frees), the CPU per
success, the exempts published per success, and, under the default ``entry_cap``, how
many entries were evicted (the least recently renewed first) and how many exempts were
lifted with them (a tombstone each, ``exempts_lifted``), so the decision index holds no more
than the tables (``exempts_indexed``).

The traced run builds its successes a chunk at a time, so the strings the tables keep (the
account, address and cookie digests a worker decodes from each event) are counted with
them (before 2026-12-07 the bench held every success in a list and left them out).
``--by-line N`` adds the N allocation sites (file:line, tracemalloc) holding the most.

Run as ``python -m bench.worker_familiar [--users N] [--entry-cap C] [--by-line N]``; the
last line printed is JSON.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from bench.bench_edge import TENANT, Workload
from pipeline.core.attempt import Attempt
from pipeline.core.engine import Engine
from pipeline.core.policy import policy_from_mapping
from pipeline.runtime import tune_gc
from pipeline.settings import Settings
from pipeline.wiring import build_normaliser

T0_MS = 1_790_000_000_000
CHUNK = 10_000


def successes(users: int, first: int = 0) -> list[Attempt]:
    """One untrusted-client success per user (users ``first`` to ``first + users - 1``),
    a second apart, with real digests."""
    norm = build_normaliser(Settings())
    out = []
    for i in range(first, first + users):
        account, address, _ = Workload.user(i)
        out.append(
            Attempt(
                event_id=f"familiar-{i:08x}",
                occurred_ms=T0_MS + i * 1000,
                tenant=TENANT,
                account=norm.account_digest(TENANT, account),
                source=address,
                device=norm.digester.device(TENANT, f"cookie-{i}"),
                session=None,
                trusted=False,
                flow="login",
                success=True,
                failure_reason=None,
            )
        )
    return out


def feed(engine: Engine, chunks: Iterable[list[Attempt]]) -> tuple[int, int]:
    """Feed in chunks as a stage would, clearing the outbox; the exempts published and
    the tombstones (an evicted pair's exempt lifted)."""
    out, exempts, lifted = engine.out, 0, 0
    for chunk in chunks:
        engine.step_batch(chunk)
        exempts += len(out.exempts)
        lifted += sum(1 for _, decision in out.decisions if decision is None)
        out.clear()
    return exempts, lifted


def chunked(attempts: list[Attempt]) -> Iterator[list[Attempt]]:
    """``attempts`` in chunks of ``CHUNK``."""
    for start in range(0, len(attempts), CHUNK):
        yield attempts[start : start + CHUNK]


def generated(users: int) -> Iterator[list[Attempt]]:
    """The same successes built a chunk at a time (the engine alone keeps their strings)."""
    for start in range(0, users, CHUNK):
        yield successes(min(CHUNK, users - start), start)


def named_tables(engine: Engine) -> list[tuple[str, Any]]:
    """Every table of both stages as (``stage.table``, table), counters included."""
    out: list[tuple[str, Any]] = []
    for stage, shard in (("account", engine.accounts), ("source", engine.sources)):
        for rules in shard.tenants.values():
            named: dict[str, Any] = {**rules.counters, "sources": rules.sources}
            named |= {"pairs": rules.pairs, "streaks": rules.streaks, "familiar": rules.familiar}
            out += [(f"{stage}.{name}", table) for name, table in named.items()]
    return out


def entries_by_table(engine: Engine) -> dict[str, int]:
    """Entries per (stage, table), the empty ones left out."""
    out: dict[str, int] = {}
    for name, table in named_tables(engine):
        if len(table):
            out[name] = out.get(name, 0) + len(table)
    return out


def top_lines(before: tracemalloc.Snapshot, users: int, lines: int) -> list[dict[str, Any]]:
    """The ``lines`` allocation sites whose held bytes grew most since ``before``, per
    user: ``site`` (file:line, the path from the package on), bytes and blocks."""
    stats = tracemalloc.take_snapshot().compare_to(before, "lineno")[:lines]
    out = []
    for stat in stats:
        frame = stat.traceback[0]
        site = frame.filename.rsplit("/main/", 1)[-1].rsplit("site-packages/", 1)[-1]
        out.append(
            {
                "site": f"{site}:{frame.lineno}",
                "bytes_per_user": round(stat.size_diff / users, 1),
                "blocks_per_user": round(stat.count_diff / users, 2),
            }
        )
    return out


def bench_worker_familiar(
    users: int, entry_cap: int, repeat: int = 3, by_line: int = 0
) -> dict[str, Any]:
    """The timed runs first (no tracing; the worker's collector thresholds, the best of
    ``repeat`` fresh engines by CPU time), then a traced run on a fresh engine fed
    successes built a chunk at a time (``by_line``: that many top allocation sites)."""
    policy = policy_from_mapping(
        {
            "policy_version": "familiar-1",
            "defaults": {"entry_cap": entry_cap, "familiar": {"entry_cap": entry_cap}},
        }
    )
    attempts = successes(users)
    defaults = tune_gc()
    cpu_s = float("inf")
    for _ in range(repeat):
        gc.collect()
        engine = Engine(policy)
        start = time.process_time()
        exempts, lifted = feed(engine, chunked(attempts))
        cpu_s = min(cpu_s, time.process_time() - start)
    gc.set_threshold(*defaults)
    # the engine's two shards share one index (the worker's stages keep one each)
    indexes = {id(shard.index): shard.index for shard in (engine.accounts, engine.sources)}
    indexed = sum(len(index) for index in indexes.values())
    held = sum(len(t) for _, t in named_tables(engine))
    by_table = entries_by_table(engine)
    evicted = sum(t.evictions for _, t in named_tables(engine))
    del engine, attempts
    gc.collect()
    tracemalloc.start()
    empty = tracemalloc.get_traced_memory()[0]
    before = tracemalloc.take_snapshot() if by_line else None
    engine = Engine(policy)
    feed(engine, generated(users))
    shards = (engine.accounts, engine.sources)
    for shard in shards:
        shard.take_dirty()
    gc.collect()
    engine_bytes = tracemalloc.get_traced_memory()[0] - empty
    # a compiled familiar store (when the index keeps exempts there) is not traced
    store_bytes = sum(
        store.approx_bytes()
        for store in {id(s.index): getattr(s.index, "_familiar", None) for s in shards}.values()
        if store is not None
    )
    lines = top_lines(before, users, by_line) if before is not None else []
    before = None
    for _, table in named_tables(engine):
        table._entries.clear()
    gc.collect()
    table_bytes = engine_bytes - (tracemalloc.get_traced_memory()[0] - empty)
    tracemalloc.stop()
    return {
        "users": users,
        "entry_cap": entry_cap,
        "entries_held": held,
        "entries_evicted": evicted,
        "entries_by_table": by_table,
        # active decisions (the exempts) in the decision index: an evicted pair's exempt
        # is lifted with it, so at most what the familiar tables hold
        "exempts_indexed": indexed,
        "exempts_per_success": round(exempts / users, 2),
        "exempts_lifted": lifted,
        "engine_heap_bytes_per_user": round(engine_bytes / users),
        "store_bytes_per_user": round(store_bytes / users),
        "bytes_per_user": round((engine_bytes + store_bytes) / users),
        "table_heap_bytes_per_user": round(table_bytes / users),
        "table_heap_bytes_per_entry": round(table_bytes / held) if held else None,
        "cpu_us_per_success": round(cpu_s / users * 1e6, 1),
        "heap_by_line": lines,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=100_000, help="successes, one per user")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs; the best counts")
    parser.add_argument(
        "--entry-cap",
        type=int,
        default=None,
        help="entry_cap and familiar.entry_cap (default: 4 x users, at least 1,000,000: never bites)",
    )
    parser.add_argument("--by-line", type=int, default=0, help="top allocation sites to list")
    args = parser.parse_args(argv)
    cap = args.entry_cap if args.entry_cap is not None else max(1_000_000, 4 * args.users)
    result = bench_worker_familiar(args.users, cap, args.repeat, args.by_line)
    print(orjson.dumps(result).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
