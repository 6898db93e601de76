"""Bounded memory of recent event ids, so a redelivered attempt is counted once."""

from __future__ import annotations

from collections import OrderedDict


class Deduper:
    """Event ids seen within ``horizon_ms`` of the watermark, at most ``capacity`` of them.

    Ids are kept in arrival order; ``seen`` drops ids older than the horizon from the
    front (O(1) amortised, no scans) and the oldest id when the capacity is reached.
    """

    __slots__ = ("_ids", "_next_sweep_ms", "capacity", "duplicates", "horizon_ms")

    def __init__(self, horizon_ms: int, capacity: int) -> None:
        self._ids: OrderedDict[str, int] = OrderedDict()
        self.horizon_ms = horizon_ms
        self.capacity = capacity
        self.duplicates = 0
        self._next_sweep_ms = 0

    def __len__(self) -> int:
        return len(self._ids)

    def seen(self, event_id: str, now_ms: int) -> bool:
        """True if ``event_id`` was seen within the horizon; otherwise remember it."""
        ids = self._ids
        if event_id in ids:
            self.duplicates += 1
            return True
        if len(ids) >= self.capacity:
            ids.popitem(last=False)
        if now_ms >= self._next_sweep_ms:
            self._sweep(now_ms)
        ids[event_id] = now_ms
        return False

    def _sweep(self, now_ms: int) -> None:
        """Drop ids past the horizon; runs when the oldest id can have expired, not per call."""
        ids = self._ids
        cutoff = now_ms - self.horizon_ms
        while ids:
            oldest = next(iter(ids.values()))
            if oldest >= cutoff:
                self._next_sweep_ms = oldest + self.horizon_ms + 1
                return
            ids.popitem(last=False)
        self._next_sweep_ms = now_ms + self.horizon_ms
