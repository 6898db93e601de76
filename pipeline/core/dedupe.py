"""Bounded memory of recent event ids per tenant, so a redelivered attempt is counted once."""

from __future__ import annotations

from array import array

DEDUPE_HORIZON_MS = 3_600_000
"""How long a worker remembers an event id by default (an hour)."""
DEDUPE_CAPACITY = 1_000_000
"""How many event ids a worker remembers at most by default."""

_START_SLOTS = 16_384
"""The slots a generation starts with at most (128 kB); it doubles while more than half
are used."""
_KEY_MASK = (1 << 62) - 1
"""Keys are 62 bits: compiled code holds such an int unboxed (mypyc's short ints)."""


def id_key(tenant: str, event_id: str) -> int:
    """The 62-bit key a (tenant, event id) is remembered by: the process's keyed string
    hash (SipHash, a secret per process unless ``PYTHONHASHSEED`` is set), never 0."""
    key = hash((tenant, event_id)) & _KEY_MASK
    return key if key else 1


class IdTable:
    """A set of nonzero 62-bit keys, open addressing in one ``array`` (8 bytes a slot, at
    most half of them used), so an id costs 16-32 bytes instead of a string and a set slot
    (about 100)."""

    __slots__ = ("keys", "mask", "size")

    def __init__(self, most: int = 1 << 30) -> None:
        """A table for at most ``most`` keys (it starts smaller and grows to them)."""
        slots = 16
        while slots < 2 * most and slots < _START_SLOTS:
            slots *= 2
        self.keys = array("q", bytes(8 * slots))
        self.mask = slots - 1
        self.size = 0

    def clear(self) -> None:
        """Hold no key, keeping the slots (a generation reused grows no more)."""
        self.keys = array("q", bytes(8 * (self.mask + 1)))
        self.size = 0

    def slot(self, key: int) -> int:
        """-1 if ``key`` is held, else the empty slot it would take."""
        keys, mask = self.keys, self.mask
        i = key & mask
        while True:
            held: int = keys[i]
            if held == key:
                return -1
            if held == 0:
                return i
            i = (i + 1) & mask

    def put(self, key: int, slot: int) -> None:
        """Hold ``key`` (not held) in ``slot``, the empty one ``slot(key)`` just gave."""
        if 2 * (self.size + 1) > self.mask + 1:
            self._grow()
            slot = self.slot(key)
        self.keys[slot] = key
        self.size += 1

    def _grow(self) -> None:
        old = self.keys
        slots = 2 * (self.mask + 1)
        self.keys, self.mask = array("q", bytes(8 * slots)), slots - 1
        for key in old:
            if key != 0:
                self.keys[self.slot(key)] = key


class Deduper:
    """Event ids seen recently, per tenant, in two generations of key tables.

    Ids are scoped by tenant: ``event_id`` is unique per producer, and one tenant's ids
    must never hide another tenant's attempts (a tenant that reuses or guesses ids would
    otherwise make a victim tenant's attempts "duplicates", uncounted). An id is held as
    the 62-bit keyed hash of (tenant, event id) (``id_key``): two ids share a key with a
    chance of one in 2^62 per id held, and the key is secret to the process, so nobody can
    choose ids that collide (this memory is per process and never restored).

    New ids go to the current generation. When it is ``horizon_ms`` old (by the
    watermark) or holds half the capacity, it becomes the previous generation and the
    one before is dropped whole. So an id is remembered for at least ``horizon_ms``
    (unless ``capacity / 2`` newer ids arrive first) and at most about twice that, at
    most ``capacity`` ids are held, and every call is a probe or two of a table: no
    per-id timestamps, strings or tuples kept, no sweeps.
    """

    __slots__ = (
        "_current",
        "_half",
        "_previous",
        "_rotate_at_ms",
        "capacity",
        "duplicates",
        "horizon_ms",
    )

    def __init__(self, horizon_ms: int, capacity: int) -> None:
        self.horizon_ms = horizon_ms
        self.capacity = capacity
        self._half = max(1, capacity // 2)
        self._current = IdTable(self._half)
        self._previous = IdTable(self._half)
        self._rotate_at_ms = -1  # the first id starts a generation
        self.duplicates = 0

    def __len__(self) -> int:
        return self._current.size + self._previous.size

    def seen(self, event_id: str, now_ms: int, tenant: str = "") -> bool:
        """True if ``event_id`` is remembered for ``tenant``; otherwise remember it."""
        key = id_key(tenant, event_id)
        current = self._current
        slot = current.slot(key)
        if slot < 0 or self._previous.slot(key) < 0:
            self.duplicates += 1
            return True
        if now_ms >= self._rotate_at_ms or current.size >= self._half:
            # The generation dropped is reused, cleared: its slots have grown already.
            dropped, self._previous = self._previous, current
            dropped.clear()
            current = self._current = dropped
            self._rotate_at_ms = now_ms + self.horizon_ms
            slot = current.slot(key)
        current.put(key, slot)
        return False
