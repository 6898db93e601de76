"""Bounded memory of recent event ids, so a redelivered attempt is counted once."""

from __future__ import annotations


class Deduper:
    """Event ids seen recently, in two generations of plain sets.

    New ids go to the current generation. When it is ``horizon_ms`` old (by the
    watermark) or holds half the capacity, it becomes the previous generation and the
    one before is dropped whole. So an id is remembered for at least ``horizon_ms``
    (unless ``capacity / 2`` newer ids arrive first) and at most about twice that, at
    most ``capacity`` ids are held, and every call is a set lookup or two: no per-id
    timestamps, no ordered dict, no sweeps.
    """

    __slots__ = ("_current", "_half", "_previous", "_rotate_at_ms", "capacity", "duplicates", "horizon_ms")

    def __init__(self, horizon_ms: int, capacity: int) -> None:
        self._current: set[str] = set()
        self._previous: set[str] = set()
        self.horizon_ms = horizon_ms
        self.capacity = capacity
        self._half = max(1, capacity // 2)
        self._rotate_at_ms = -1  # the first id starts a generation
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)

    def seen(self, event_id: str, now_ms: int) -> bool:
        """True if ``event_id`` is remembered; otherwise remember it."""
        current = self._current
        if event_id in current or event_id in self._previous:
            self.duplicates += 1
            return True
        if now_ms >= self._rotate_at_ms or len(current) >= self._half:
            self._previous = current
            current = self._current = set()
            self._rotate_at_ms = now_ms + self.horizon_ms
        current.add(event_id)
        return False
