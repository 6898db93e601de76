"""The sliding window: the ring against brute-force references, its two guarantees, and
the overshoot bound (no burst gets more than threshold - 1 failures through)."""

from __future__ import annotations

import bisect

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.decision_keys import keys_for
from pipeline.core.engine import Engine
from pipeline.core.window import Ring, WindowSpec
from tests.unit.test_core_support import MIN, att

windows = st.integers(1000, 3_600_000)
subs = st.integers(1, 60)


def _in_interval(times: list[int], lo_exclusive: int, hi_inclusive: int) -> int:
    return bisect.bisect_right(times, hi_inclusive) - bisect.bisect_right(times, lo_exclusive)


@given(
    window=windows,
    k=subs,
    gaps=st.lists(st.integers(0, 400_000), min_size=1, max_size=80),
)
def test_ring_never_undercounts_and_overcount_is_bounded(
    window: int, k: int, gaps: list[int]
) -> None:
    """In time order: every event younger than window_ms is counted; none aged span_ms."""
    spec = WindowSpec(window, k)
    ring = Ring(spec.ring_size)
    times: list[int] = []
    t = 10**12
    for gap in gaps:
        t += gap
        times.append(t)
        assert ring.add(spec.bucket(t))
        count = ring.total
        assert count >= _in_interval(times, t - window, t)  # no undercount
        assert count <= _in_interval(times, t - spec.span_ms, t)  # nothing aged >= span_ms
        # Exact: the ring holds the events of buckets [b - n, b].
        start = (spec.bucket(t) - (spec.ring_size - 1)) * spec.sub_ms
        assert count == _in_interval(times, start - 1, t)


@given(window=windows, k=subs)
def test_span_is_window_plus_one_sub_bucket_when_k_divides(window: int, k: int) -> None:
    """span_ms == window_ms + sub_ms when k divides the window, else < window + 2 sub_ms."""
    spec = WindowSpec(window, k)
    if window % k == 0:
        assert spec.span_ms == window + spec.sub_ms
    else:
        assert window + spec.sub_ms <= spec.span_ms < window + 2 * spec.sub_ms
    assert (spec.ring_size - 1) * spec.sub_ms >= window


def test_default_geometry() -> None:
    """15 min in 15 sub-buckets: 1-minute buckets, a ring of 16, span 16 minutes."""
    spec = WindowSpec(15 * MIN, 15)
    assert (spec.sub_ms, spec.ring_size, spec.span_ms) == (MIN, 16, 16 * MIN)


@given(
    window=st.integers(1000, 100_000),
    k=st.integers(1, 20),
    times=st.lists(st.integers(0, 1_000_000), min_size=1, max_size=60),
)
def test_ring_matches_reference_in_any_arrival_order(window: int, k: int, times: list[int]) -> None:
    """In any order, the count equals the accepted events of the ring's buckets exactly."""
    spec = WindowSpec(window, k)
    ring = Ring(spec.ring_size)
    accepted: list[int] = []
    head = -1
    for t in times:
        b = spec.bucket(t)
        expected_ok = b > head - spec.ring_size
        assert ring.add(b) is expected_ok
        if expected_ok:
            accepted.append(b)
        head = max(head, b)
        assert ring.total == sum(1 for x in accepted if x > head - spec.ring_size)


def test_ring_remove_and_clear() -> None:
    """remove never goes below zero and ignores buckets out of the ring; clear empties."""
    ring = Ring(4)
    ring.add(10, 3)
    ring.remove(10, 5)
    assert ring.total == 0
    ring.add(10)
    ring.remove(2)  # out of the ring: nothing happens
    assert ring.total == 1
    ring.clear()
    assert (ring.total, ring.head) == (0, 10)


def test_ring_dump_and_load_round_trip() -> None:
    """dump/load keep head, buckets and total (compact or expanded)."""
    ring = Ring(5)
    ring.add(7)
    ring.add(7)
    assert ring.slots is None  # one bucket: no list yet
    assert Ring.load(ring.dump()).dump() == ring.dump() == [7, 0, 0, 2, 0, 0]
    for b in (8, 8, 11):
        ring.add(b)
    copy = Ring.load(ring.dump())
    assert (copy.head, copy.dump(), copy.total) == (11, ring.dump(), 5)


class _ListRing:
    """The plain reference: every bucket in a list, always."""

    def __init__(self, size: int) -> None:
        self.size, self.head, self.slots = size, -1, [0] * size

    def advance(self, b: int) -> None:
        if b <= self.head:
            return
        for i in range(max(self.head + 1, b - self.size + 1), b + 1):
            self.slots[i % self.size] = 0
        self.head = b

    def add(self, b: int, n: int) -> bool:
        if b > self.head:
            self.advance(b)
        elif b <= self.head - self.size:
            return False
        self.slots[b % self.size] += n
        return True

    def remove(self, b: int, n: int) -> None:
        if self.head - self.size < b <= self.head:
            self.slots[b % self.size] -= min(n, self.slots[b % self.size])


@given(
    size=st.integers(1, 8),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "advance", "clear"]),
            st.integers(0, 40),
            st.integers(1, 3),
        ),
        max_size=60,
    ),
)
def test_compact_ring_matches_a_plain_list(size: int, ops: list[tuple[str, int, int]]) -> None:
    """The lazily expanded ring behaves exactly like a plain list of buckets."""
    ring, ref = Ring(size), _ListRing(size)
    for op, bucket, n in ops:
        if op == "add":
            assert ring.add(bucket, n) is ref.add(bucket, n)
        elif op == "remove":
            ring.remove(bucket, n)
            ref.remove(bucket, n)
        elif op == "advance":
            ring.advance(bucket)
            ref.advance(bucket)
        else:
            ring.clear()
            ref.slots = [0] * size
        assert ring.dump() == [ref.head, *ref.slots]
        assert ring.total == sum(ref.slots)
        assert Ring.load(ring.dump()).dump() == ring.dump()


@given(
    threshold=st.integers(1, 12),
    window=st.integers(1000, 200_000),
    k=st.integers(1, 30),
    gaps=st.lists(st.integers(0, 60_000), min_size=1, max_size=120),
)
def test_no_more_than_threshold_minus_one_before_a_trip(
    threshold: int, window: int, k: int, gaps: list[int]
) -> None:
    """Before the first trip, no window_ms interval holds threshold counted failures."""
    spec = WindowSpec(window, k)
    ring = Ring(spec.ring_size)
    times: list[int] = []
    t = 0
    for gap in gaps:
        t += gap
        ring.add(spec.bucket(t))
        if ring.total >= threshold:
            break  # this failure trips the rule
        times.append(t)
    for i, end in enumerate(times):
        assert _in_interval(times, end - window, end) <= threshold - 1, (i, times)


def test_burst_straddling_a_boundary_trips_at_the_threshold() -> None:
    """4 failures just before and 4 just after a minute boundary trip at the 5th."""
    engine = Engine()
    times = [14 * MIN + 59_000 + i for i in range(4)] + [15 * MIN + 1000 + i for i in range(4)]
    verdicts = engine.step_batch([att(t) for t in times])
    blocked = [i for i, v in enumerate(verdicts) if v is not None and not v.allowed]
    assert blocked == [5, 6, 7]  # the 5th failure tripped; the rest are refused


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.integers(0, 6 * MIN), min_size=1, max_size=150))
def test_engine_accepts_at_most_threshold_per_window(gaps: list[int]) -> None:
    """With refusals honoured, no 15-minute interval accepts more than 4 + 1 failures."""
    engine = Engine()
    accepted: list[int] = []
    t = 0
    for gap in gaps:
        t += gap
        probe = att(t)
        verdict = engine.accounts.index.check(keys_for(probe), probe.occurred_ms)
        failure = att(t, reason="bad_password" if verdict.allowed else "refused")
        engine.step(failure, failure.occurred_ms)
        if verdict.allowed:
            accepted.append(t)
    for end in accepted:
        assert _in_interval(accepted, end - 15 * MIN, end) <= 5
