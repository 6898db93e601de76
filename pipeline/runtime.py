"""Process-wide tuning of the long-running services (the worker), applied once at start:
the cycle collector's thresholds and glibc's allocator."""

from __future__ import annotations

import ctypes
import gc
import os
from collections.abc import Mapping

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


# glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
ARENA_MAX = 2
MMAP_THRESHOLD_BYTES = 128 * 1024


def tune_allocator(environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """Fewer malloc arenas and a fixed mmap threshold for the worker (glibc only).

    The worker's large buffers (fetched record batches, envelopes, audit batches, encoded
    outputs) come and go by the megabyte. With glibc's defaults the mmap threshold rises
    to the largest buffer freed so far (up to 32 MB), so after the first such free every
    large buffer is carved from the heap, and each thread that allocates gets an arena of
    its own (up to 8 per core): freed memory then sits in holes the heap cannot give back.
    ``mallopt`` here caps the arenas at ARENA_MAX and fixes the threshold at 128 kB, so a
    large buffer is mapped and unmapped whole. Called before faust starts its threads.
    A variable the user set (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``, which glibc
    read at start) wins. Returns what was set: empty where ``mallopt`` is not available.
    """
    env = os.environ if environ is None else environ
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return {}
    wanted = {
        "MALLOC_ARENA_MAX": (M_ARENA_MAX, ARENA_MAX),
        "MALLOC_MMAP_THRESHOLD_": (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
    }
    done: dict[str, int] = {}
    for name, (param, value) in wanted.items():
        if name not in env and mallopt(param, value) == 1:
            done[name] = value
    return done
