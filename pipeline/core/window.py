"""Sliding-window counting with a ring of sub-buckets.

A window of ``window_ms`` is split into ``n`` sub-buckets of ``sub_ms = window_ms // n``.
A ring keeps ``n + 1`` buckets: the current (partial) one and the ``n`` before it. The
count at time ``t`` is the sum of those buckets, so it covers the interval
``[floor(t / sub_ms) * sub_ms - n * sub_ms, t]``, whose length is between ``window_ms``
and ``window_ms + sub_ms``.

Guarantees (pinned by hypothesis tests):

* no undercount: every event in ``(t - window_ms, t]`` is counted, so a key can never
  get more than ``threshold - 1`` events accepted in any interval of ``window_ms``;
  the worst-case overshoot over the threshold is zero (a fixed window allows
  ``2 * threshold - 2`` in a burst straddling its boundary);
* bounded overcount: no event older than ``window_ms + sub_ms`` is counted, so an
  honest user's old failure is remembered at most one sub-bucket (1/n) longer.

Memory is ``n + 1`` integers per key; every operation is O(1) amortised (advancing the
ring clears each bucket at most once per pass).
"""

from __future__ import annotations


class Ring:
    """The buckets of one key. ``head`` is the absolute index of the newest bucket."""

    __slots__ = ("head", "slots", "total")

    def __init__(self, size: int) -> None:
        self.head = -1
        self.total = 0
        self.slots = [0] * size

    def advance(self, bucket: int) -> None:
        """Move the newest bucket forward to ``bucket``, clearing the buckets that fall out."""
        head = self.head
        if bucket <= head:
            return
        size = len(self.slots)
        if bucket - head >= size:
            for i in range(size):
                self.slots[i] = 0
            self.total = 0
        else:
            slots = self.slots
            for i in range(head + 1, bucket + 1):
                idx = i % size
                self.total -= slots[idx]
                slots[idx] = 0
        self.head = bucket

    def add(self, bucket: int, n: int = 1) -> bool:
        """Count ``n`` at ``bucket``; False (nothing counted) if the bucket left the ring."""
        if bucket > self.head:
            self.advance(bucket)
        elif bucket <= self.head - len(self.slots):
            return False
        self.slots[bucket % len(self.slots)] += n
        self.total += n
        return True

    def remove(self, bucket: int, n: int = 1) -> None:
        """Uncount ``n`` at ``bucket`` if it is still in the ring (never below zero)."""
        if self.head - len(self.slots) < bucket <= self.head:
            idx = bucket % len(self.slots)
            taken = min(n, self.slots[idx])
            self.slots[idx] -= taken
            self.total -= taken

    def count_at(self, bucket: int) -> int:
        """The window's count as seen from ``bucket`` (advancing if it is newer)."""
        if bucket > self.head:
            self.advance(bucket)
        return self.total

    def clear(self) -> None:
        for i in range(len(self.slots)):
            self.slots[i] = 0
        self.total = 0

    def dump(self) -> list[int]:
        return [self.head, *self.slots]

    @classmethod
    def load(cls, data: list[int]) -> Ring:
        ring = cls(len(data) - 1)
        ring.head = data[0]
        ring.slots = list(data[1:])
        ring.total = sum(ring.slots)
        return ring


class WindowSpec:
    """Frozen geometry of one rule's sliding window."""

    __slots__ = ("ring_size", "span_ms", "sub_ms", "window_ms")

    def __init__(self, window_ms: int, sub_buckets: int) -> None:
        self.window_ms = window_ms
        self.sub_ms = max(1, window_ms // sub_buckets)
        # n full buckets must cover the window even when window_ms % n != 0.
        n = -(-window_ms // self.sub_ms)
        self.ring_size = n + 1
        self.span_ms = n * self.sub_ms + self.sub_ms

    def bucket(self, t_ms: int) -> int:
        return t_ms // self.sub_ms
