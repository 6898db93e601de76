"""Process-wide tuning of the long-running services (the worker), applied once at start."""

from __future__ import annotations

import gc

# (young, middle, old): CPython's defaults are (700, 10, 10).
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> tuple[int, int, int]:
    """Fewer passes of the cycle collector over large, long-lived state.

    A worker holds hundreds of thousands of table entries that reference counting frees;
    with CPython's default thresholds the cycle collector walks them again and again (a
    quarter of the compiled core's time in ``bench.bench_core``, mostly full passes). A
    young collection every 50,000 net allocations, with older generations 20x and 100x
    rarer, still finds the rare reference cycle (exception tracebacks, futures) within
    seconds. Returns the thresholds that were in force before.
    """
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    return (before[0], before[1], before[2])
