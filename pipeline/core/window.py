"""Sliding-window counting with a ring of sub-buckets.

A window of ``window_ms`` is split into sub-buckets of ``sub_ms = window_ms // k`` (``k``
the policy's ``sub_buckets``); ``n = ceil(window_ms / sub_ms)`` of them cover the window
(``n == k`` when ``k`` divides ``window_ms``, as for every default). A ring keeps ``n + 1``
buckets: the current (partial) one and the ``n`` before it. The count at time ``t`` is
the sum of those buckets, so it covers ``[(floor(t / sub_ms) - n) * sub_ms, t]``, an
interval between ``n * sub_ms >= window_ms`` and ``span_ms = (n + 1) * sub_ms`` long.

Guarantees (pinned by hypothesis tests against a brute-force reference):

* no undercount: for events arriving in time order, every event in
  ``(t - window_ms, t]`` is counted at ``t``. So when the ``threshold``-th event of any
  interval of ``window_ms`` arrives, all of them are counted and the rule trips: at most
  ``threshold - 1`` events of any such interval are ever accepted before a trip. The
  worst-case overshoot over the threshold is zero (a fixed window lets
  ``2 * threshold - 2`` through in a burst straddling its boundary);
* bounded overcount: no event aged ``span_ms`` or more is counted. ``span_ms`` is
  ``window_ms + sub_ms`` when ``k`` divides ``window_ms`` (an honest user's old failure
  is remembered at most one sub-bucket, 1/k of the window, longer), and below
  ``window_ms + 2 * sub_ms`` otherwise.

A late event (older than the ring's newest bucket) is counted in its own bucket while
that bucket is still in the ring, and dropped (``add`` returns False) once it left.

Memory is ``n + 1`` integers per key (none while all its counts are in one bucket);
every operation is O(1) amortised (advancing the ring clears each bucket at most once
per pass).
"""

from __future__ import annotations


class Ring:
    """The buckets of one key. ``head`` is the absolute index of the newest bucket.

    Most keys only ever see failures in one bucket (a sprayed account, a botnet address
    trying a password or two), so the bucket list is allocated lazily: while ``slots``
    is None every count is in bucket ``head``. The first count in another bucket still
    inside the ring expands it; a ring that empties drops its list again. That saves a
    list (about 200 bytes, and one object for the garbage collector) on most keys.
    """

    __slots__ = ("head", "size", "slots", "total")

    def __init__(self, size: int) -> None:
        self.head = -1
        self.total = 0
        self.size = size
        self.slots: list[int] | None = None

    def _expand(self) -> list[int]:
        slots = [0] * self.size
        if self.total:
            slots[self.head % self.size] = self.total
        self.slots = slots
        return slots

    def advance(self, bucket: int) -> None:
        """Move the newest bucket forward to ``bucket``, clearing the buckets that fall out."""
        head = self.head
        if bucket <= head:
            return
        if self.total:
            size = self.size
            if bucket - head >= size:
                self.total = 0
                self.slots = None
            else:
                slots = self.slots if self.slots is not None else self._expand()
                for i in range(head + 1, bucket + 1):
                    idx = i % size
                    self.total -= slots[idx]
                    slots[idx] = 0
        self.head = bucket

    def add(self, bucket: int, n: int = 1) -> bool:
        """Count ``n`` at ``bucket``; False (nothing counted) if the bucket left the ring."""
        head = self.head
        if bucket > head:
            if self.total:
                self.advance(bucket)
            else:
                self.head = bucket  # an empty ring has nothing to clear
        elif bucket <= head - self.size:
            return False
        slots = self.slots
        if slots is None:
            if bucket == self.head:
                self.total += n  # still one bucket: stay compact
                return True
            slots = self._expand()  # a late count in an older bucket
        slots[bucket % self.size] += n
        self.total += n
        return True

    def remove(self, bucket: int, n: int = 1) -> None:
        """Uncount ``n`` at ``bucket`` if it is still in the ring (never below zero)."""
        if self.head - self.size < bucket <= self.head:
            slots = self.slots
            if slots is None:
                taken = min(n, self.total) if bucket == self.head else 0
            else:
                idx = bucket % self.size
                taken = min(n, slots[idx])
                slots[idx] -= taken
            self.total -= taken

    def clear(self) -> None:
        self.total = 0
        self.slots = None

    def dump(self) -> list[int]:
        """``[head, *buckets]``: the full ring, whichever form it is kept in."""
        slots = self.slots if self.slots is not None else self._virtual()
        return [self.head, *slots]

    def _virtual(self) -> list[int]:
        slots = [0] * self.size
        if self.total:
            slots[self.head % self.size] = self.total
        return slots

    def _load(self, data: list[int]) -> None:
        self.head = data[0]
        self.size = len(data) - 1
        slots = list(data[1:])
        self.total = sum(slots)
        # Back to the compact form when every count is in the head bucket.
        compact = not self.total or slots[self.head % self.size] == self.total
        self.slots = None if compact else slots

    @classmethod
    def load(cls, data: list[int]) -> Ring:
        ring = cls(1)  # no cls.__new__: the module stays compilable with mypyc
        ring._load(data)
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
