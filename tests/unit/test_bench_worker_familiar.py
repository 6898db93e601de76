"""bench.worker_familiar: the tables' cap bites, and an evicted pair's exempt is lifted."""

from __future__ import annotations

from bench.worker_familiar import bench_worker_familiar


def test_under_the_cap_every_success_keeps_its_three_entries() -> None:
    """50 untrusted successes: a pair and a client, two exempts each; the source known
    (the source stage's entry), never published (issue 44 item 7)."""
    result = bench_worker_familiar(50, entry_cap=1000, repeat=1)
    assert result["entries_by_table"] == {
        "account.familiar": 100,
        "source.sources": 50,
        "source.familiar": 50,
    }
    assert (result["entries_evicted"], result["exempts_per_success"]) == (0, 2.0)
    assert result["exempts_indexed"] == 100


def test_past_the_cap_the_tables_evict_and_the_indexes_do_not() -> None:
    """A cap of 40: each table holds 40 (80 evicted), and each evicted familiar entry's
    exempt is lifted with a tombstone (60, the account stage's: a known place has none),
    so the index holds the 40 the account stage's table keeps."""
    result = bench_worker_familiar(50, entry_cap=40, repeat=1)
    assert result["entries_by_table"] == {
        "account.familiar": 40,
        "source.sources": 40,
        "source.familiar": 40,
    }
    assert (result["entries_held"], result["entries_evicted"]) == (120, 80)
    assert (result["exempts_indexed"], result["exempts_lifted"]) == (40, 60)
