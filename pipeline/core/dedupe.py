"""Bounded memory of recent event ids per tenant, so a redelivered attempt is counted once."""

from __future__ import annotations

DEDUPE_HORIZON_MS = 3_600_000
"""How long a worker remembers an event id by default (an hour)."""
DEDUPE_CAPACITY = 1_000_000
"""How many event ids a worker remembers at most by default."""


class Deduper:
    """Event ids seen recently, per tenant, in two generations of plain sets.

    Ids are scoped by tenant: ``event_id`` is unique per producer, and one tenant's ids
    must never hide another tenant's attempts (a tenant that reuses or guesses ids would
    otherwise make a victim tenant's attempts "duplicates", uncounted).

    New ids go to the current generation. When it is ``horizon_ms`` old (by the
    watermark) or holds half the capacity, it becomes the previous generation and the
    one before is dropped whole. So an id is remembered for at least ``horizon_ms``
    (unless ``capacity / 2`` newer ids arrive first) and at most about twice that, at
    most ``capacity`` ids are held, and every call is a dict and a set lookup or two: no
    per-id timestamps or tuples, no ordered dict, no sweeps.
    """

    __slots__ = (
        "_current",
        "_current_ids",
        "_half",
        "_previous",
        "_previous_ids",
        "_rotate_at_ms",
        "capacity",
        "duplicates",
        "horizon_ms",
    )

    def __init__(self, horizon_ms: int, capacity: int) -> None:
        self._current: dict[str, set[str]] = {}
        self._previous: dict[str, set[str]] = {}
        self._current_ids = 0
        self._previous_ids = 0
        self.horizon_ms = horizon_ms
        self.capacity = capacity
        self._half = max(1, capacity // 2)
        self._rotate_at_ms = -1  # the first id starts a generation
        self.duplicates = 0

    def __len__(self) -> int:
        return self._current_ids + self._previous_ids

    def seen(self, event_id: str, now_ms: int, tenant: str = "") -> bool:
        """True if ``event_id`` is remembered for ``tenant``; otherwise remember it."""
        ids = self._current.get(tenant)
        if ids is not None and event_id in ids:
            self.duplicates += 1
            return True
        old = self._previous.get(tenant)
        if old is not None and event_id in old:
            self.duplicates += 1
            return True
        if now_ms >= self._rotate_at_ms or self._current_ids >= self._half:
            self._previous = self._current
            self._previous_ids = self._current_ids
            self._current = {}
            self._current_ids = 0
            self._rotate_at_ms = now_ms + self.horizon_ms
            ids = None
        if ids is None:
            ids = self._current[tenant] = set()
        ids.add(event_id)
        self._current_ids += 1
        return False
