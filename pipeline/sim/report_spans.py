"""The report's time axes (``authpipe report``): standard buckets for a span, the counts
per whole bucket a traffic chart draws (``series``), and the busy runs a chart of the whole
span squeezes, each of which gets a chart on its own time axis (``busy_spans``). Pure: no
I/O, no clock."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from pipeline.sim.truth import ATTACKER, UNKNOWN, TruthEvent

BUCKETS_MS = (1_000, 5_000, 10_000, 30_000, 60_000, 300_000, 900_000, 3_600_000, 86_400_000)
MAX_BUCKETS = 240
ZOOM_SHARE = 0.5
"""A busy run spanning less than this share of the whole gets a chart of its own."""
QUIET_BUCKETS = 4
"""Busy buckets fewer than this many quiet ones apart belong to one run."""
MAX_ZOOMS = 3


def bucket_ms(span_ms: int) -> int:
    """The smallest standard bucket giving at most ``MAX_BUCKETS`` buckets."""
    for size in BUCKETS_MS:
        if span_ms / size <= MAX_BUCKETS:
            return size
    return BUCKETS_MS[-1]


def _bucket_label(size_ms: int) -> str:
    if size_ms < 60_000:
        return f"{size_ms // 1000} s"
    if size_ms < 3_600_000:
        return f"{size_ms // 60_000} min"
    return f"{size_ms // 3_600_000} h"


def series(events: Sequence[TruthEvent], refused: Sequence[bool] | None) -> dict[str, Any]:
    """Counts per whole bucket (aligned to multiples of the bucket size). A first or last
    bucket the run covers only in part would draw a cliff (a 30 s bucket holding 4 s of
    traffic), so it is left out of the line and reported in ``trimmed``, unless nothing
    would be left."""
    first, last = events[0].occurred_ms, events[-1].occurred_ms
    size = bucket_ms(last - first + 1)
    start = first - first % size
    n = (last - start) // size + 1
    attempts, failures, attacker, refusals = [0] * n, [0] * n, [0] * n, [0] * n
    labelled = False
    for i, e in enumerate(events):
        b = (e.occurred_ms - start) // size
        attempts[b] += 1
        if not e.attempt.success:
            failures[b] += 1
        if e.role == ATTACKER:
            attacker[b] += 1
        labelled = labelled or e.role != UNKNOWN
        if refused is not None and refused[i]:
            refusals[b] += 1
    # A bucket is partial when the run starts after its start or ends before its end (the
    # run's end is the last event; a gap of under a bucket before it is not told apart).
    lo = 1 if first > start and n > 2 else 0
    hi = n - 1 if last + 1 < start + n * size and n - lo > 2 else n
    trimmed = sum(attempts[:lo]) + sum(attempts[hi:])
    return {
        "start_ms": start + lo * size,
        "bucket_ms": size,
        "bucket_label": _bucket_label(size),
        "attempts": attempts[lo:hi],
        "failures": failures[lo:hi],
        "attacker": attacker[lo:hi] if labelled else None,
        "refused": refusals[lo:hi] if refused is not None else None,
        "trimmed": {"first": bool(lo), "last": hi < n, "events": trimmed},
    }


def busy_spans(times: Sequence[int]) -> list[tuple[int, int]]:
    """The runs of ``times`` (sorted epoch ms) that a chart of the whole span squeezes: busier
    than the mean and under ``ZOOM_SHARE`` of the span (a mixed hour after a patient
    attacker's day), as [start, end) ms in time order. A run is found in the whole span's
    buckets (those above the mean rate; fewer than ``QUIET_BUCKETS`` quiet ones apart
    join); its edges are found again in its own buckets (those above a quarter of its rate,
    searched one whole-span bucket either side)."""
    if len(times) < 2:
        return []
    first, last = times[0], times[-1]
    span = last - first + 1
    size = bucket_ms(span)
    out: list[tuple[int, int]] = []
    for lo, hi in _busy(times, first, last + 1, size, len(times) * size / span, QUIET_BUCKETS):
        if hi - lo > span * ZOOM_SHARE:
            continue
        fine = bucket_ms(hi - lo)
        count = bisect_left(times, hi) - bisect_left(times, lo)
        least = max(2.0, count * fine / (hi - lo) / 4)
        edges = _busy(times, max(first, lo - size), min(last + 1, hi + size), fine, least, None)
        out.append((edges[0][0], edges[-1][1]))
    return out[:MAX_ZOOMS]


def _busy(
    times: Sequence[int], lo: int, hi: int, size: int, least: float, quiet: int | None
) -> list[tuple[int, int]]:
    """[start, end) of the runs of buckets (multiples of ``size``) in [lo, hi) holding at
    least ``least`` of ``times``; runs fewer than ``quiet`` buckets apart join (``None``:
    all join)."""
    start = lo - lo % size
    counts = [0] * ((hi - 1 - start) // size + 1)
    for t in times[bisect_left(times, lo) : bisect_left(times, hi)]:
        counts[(t - start) // size] += 1
    runs: list[list[int]] = []
    for b, n in enumerate(counts):
        if n < least:
            continue
        if runs and (quiet is None or b - runs[-1][1] < quiet):
            runs[-1][1] = b + 1
        else:
            runs.append([b, b + 1])
    return [(start + a * size, start + b * size) for a, b in runs]
