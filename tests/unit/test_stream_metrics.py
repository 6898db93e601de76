"""The worker's changelog counters: what each stage writes, counted exactly per envelope."""

from __future__ import annotations

import gc

from pipeline.stream.envelopes import StageOutput
from pipeline.stream.metrics import WorkerMetrics


def test_changelog_records_tombstones_held_rows_and_bytes_are_counted_per_stage() -> None:
    """One envelope's changelog: 3 records, 1 tombstone, 2 held-row records, 11 bytes of key and value."""
    metrics = WorkerMetrics()
    registry = metrics.registry
    result = StageOutput(changelog=[(b"k1", b"vvv"), (b"k2", None), (b"k3", b"ww")], held_records=2)
    metrics.emitted(result, "source")
    metrics.emitted(StageOutput(), "account")

    def value(name: str, stage: str) -> float | None:
        return registry.get_sample_value(name, {"stage": stage})

    assert value("authpipe_changelog_records_total", "source") == 3.0
    assert value("authpipe_changelog_tombstones_total", "source") == 1.0
    assert value("authpipe_changelog_held_records_total", "source") == 2.0
    assert value("authpipe_changelog_bytes_total", "source") == 11.0
    assert value("authpipe_changelog_records_total", "account") is None


def test_each_pass_of_the_cycle_collector_is_counted_and_timed_by_its_generation() -> None:
    """With automatic collection off, two explicit passes of generation 2 and one of 0 count
    exactly 2 and 1, their time is counted under the same generations, and the second pass
    of generation 2 frees the one list that referred to itself."""
    metrics = WorkerMetrics()
    registry = metrics.registry
    was_enabled = gc.isenabled()
    gc.disable()
    gc.collect()  # what the test process left unreachable so far, before the watch
    metrics.watch_gc()
    try:
        gc.collect(2)
        gc.collect(0)
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        gc.collect(2)
    finally:
        gc.callbacks.remove(metrics._on_gc)
        if was_enabled:
            gc.enable()

    def value(name: str, generation: str) -> float | None:
        return registry.get_sample_value(name, {"generation": generation})

    assert value("authpipe_gc_collections_total", "2") == 2.0
    assert value("authpipe_gc_collections_total", "0") == 1.0
    assert value("authpipe_gc_collections_total", "1") is None
    assert value("authpipe_gc_collected_objects_total", "0") == 0.0
    assert value("authpipe_gc_collected_objects_total", "2") == 1.0
    assert (value("authpipe_gc_seconds_total", "2") or 0.0) > 0.0
    assert (value("authpipe_gc_seconds_total", "0") or 0.0) > 0.0
