"""bench.edge_familiar: the edge holds every familiar exempt it applies, and reports its cost."""

from __future__ import annotations

from bench.edge_familiar import bench_familiar


def test_every_applied_exempt_is_held_and_costed() -> None:
    """300 exempts (180 pairs, 120 clients) are all held; the per-record figures are set."""
    result = bench_familiar(300)
    assert (result["familiar_records"], result["familiar_held"]) == (300, 300)
    assert result["familiar_heap_bytes_per_record"] > 0
    assert result["familiar_apply_us_per_record"] > 0
