"""Bounded tables and dedupe: the entry cap, expiry without scans, bounded memory."""

from __future__ import annotations

import tracemalloc

from pipeline.core.account import AccountShard
from pipeline.core.dedupe import Deduper
from pipeline.core.engine import Engine
from pipeline.core.keys import Key
from pipeline.core.outbox import Outbox
from pipeline.core.state import PairState
from pipeline.core.table import BoundedTable
from tests.unit.test_core_support import MIN, att, policy


def _key(i: int) -> Key:
    return ("pair", "t", f"{i:032x}", "s", None)


def _entry(keep: int) -> PairState:
    e = PairState()
    e.keep_until_ms = keep
    return e


def test_cap_evicts_the_oldest_touched_and_counts() -> None:
    """Past the cap the least recently touched entry goes, and evictions counts it."""
    dropped: list[Key] = []
    table: BoundedTable[PairState] = BoundedTable(3, lambda k, _e: dropped.append(k))
    for i in range(3):
        table.touch(_key(i), lambda: _entry(100))
    table.touch(_key(0), lambda: _entry(100))  # 0 is now the newest
    table.touch(_key(3), lambda: _entry(100))
    assert [k for k, _ in table.items()] == [_key(2), _key(0), _key(3)]
    assert (table.evictions, dropped) == (1, [_key(1)])


def test_expire_pops_from_the_front_only() -> None:
    """expire stops at the first live entry: no scan past it."""
    table: BoundedTable[PairState] = BoundedTable(10)
    for i, keep in enumerate([5, 6, 50, 7]):
        table.touch(_key(i), lambda keep=keep: _entry(keep))  # type: ignore[misc]
    assert table.expire(10) == [_key(0), _key(1)]
    assert len(table) == 2 and table.expired == 2  # key 3 waits behind key 2
    assert table.expire(50) == [_key(2), _key(3)]


def test_touch_replaces_an_entry_past_its_time() -> None:
    """An entry past keep_until_ms is replaced on touch even before expire reaches it."""
    table: BoundedTable[PairState] = BoundedTable(10)
    old = table.touch(_key(0), lambda: _entry(5))
    assert table.touch(_key(0), lambda: _entry(0), now_ms=4) is old
    assert table.touch(_key(0), lambda: _entry(0), now_ms=5) is not old
    assert table.expired == 1


def _flood(shard: AccountShard, start: int, stop: int) -> None:
    out = Outbox()
    for i in range(start, stop):
        a = att(i, account=f"{i:032x}", source=f"10.{i % 200}.0.1")
        shard.step(a, a.occurred_ms, out)
        if i % 1000 == 0:  # the stream flushes changed entries every envelope
            shard.take_dirty()
            out.clear()


def test_flood_of_distinct_accounts_stays_bounded() -> None:
    """200,000 distinct accounts against a cap of 1,000: tables and memory stay bounded."""
    shard = AccountShard(policy(entry_cap=1000), dedupe_horizon_ms=60_000, dedupe_capacity=5000)
    _flood(shard, 0, 200_000)
    tables = shard.tenants["default"]
    assert len(tables.counters["account"]) == 1000
    assert len(tables.counters["account_source"]) == 1000
    assert tables.counters["account"].evictions == 199_000
    assert len(tables.streaks) == 1000  # the consecutive lock's records: no decay, capped
    assert (shard.evictions(), shard.entries()) == (3 * 199_000, 3000)
    assert len(shard.dedupe or ()) <= 5000
    tracemalloc.start()
    try:
        _flood(shard, 200_000, 210_000)
        shard.take_dirty()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # What the last 10,000 accounts left behind is what the bounds allow: 3,000 entries
    # and 5,000 remembered event ids (about 2 MB), not 10,000 accounts (over 5 MB).
    assert held < 3_000_000


def test_engine_flood_memory_bounded_across_both_stages() -> None:
    """A spray flood through the engine is capped in every table of both stages."""
    engine = Engine(policy(entry_cap=500))
    engine.step_batch(att(i, account=f"{i:032x}", source=f"10.0.{i % 50}.1") for i in range(20_000))
    for shard in (engine.accounts, engine.sources):
        for tables in shard.tenants.values():
            assert all(len(t) <= 500 for t in tables.tables())
    assert engine.sources.tenants["default"].pairs.evictions == 20_000 - 500


def test_entries_expire_after_their_window() -> None:
    """With no new events a key's window entries are gone once the watermark passes
    keep_until; the consecutive lock's record stays (no decay: only the cap evicts it)."""
    engine = Engine(policy(streak_memory_ms=0, lifetime={"memory_ms": 1000}))
    engine.step_batch([att(0, account="b" * 32)])
    assert engine.accounts.entries() == 3
    engine.advance(engine.accounts.watermark_ms + 17 * MIN)
    assert engine.accounts.entries() == 1
    assert len(engine.accounts.tenants["default"].streaks) == 1
    assert engine.accounts.tenants["default"].counters["account"].expired == 1


def test_dedupe_remembers_for_the_horizon() -> None:
    """An id is a duplicate for at least horizon_ms, and forgotten after two horizons."""
    d = Deduper(horizon_ms=1000, capacity=1000)
    assert d.seen("a", 0) is False
    assert d.seen("a", 999) is True
    assert d.seen("b", 1000) is False  # a new generation starts; "a" is in the previous one
    assert d.seen("a", 1999) is True
    assert d.seen("c", 2000) is False  # a's generation is dropped whole
    assert d.seen("a", 2001) is False
    assert d.duplicates == 2


def test_dedupe_capacity_bounds_the_ids_held() -> None:
    """At most capacity ids are held, whatever the flood; the newest half survives."""
    d = Deduper(horizon_ms=10**9, capacity=100)
    for i in range(10_000):
        d.seen(f"id-{i}", i)
        assert len(d) <= 100
    assert all(d.seen(f"id-{i}", 10_000) for i in range(9_950, 10_000))
