"""A bounded table of per-key entries with O(1) amortised expiry and eviction.

Entries are kept in an ordered dict in the order they were last touched. Each entry
carries ``keep_until_ms``; ``expire(now_ms)`` pops from the oldest end while the oldest
entry is past it, so expiry never scans. An entry whose deadline is earlier than an
older-touched neighbour's waits until it reaches the front (or the cap removes it):
memory stays bounded by the cap either way.

When an insert would exceed ``cap``, the least recently touched entry is evicted and
``evictions`` counts it; callers export that as a metric, because a cap that bites
means someone is sending more distinct identifiers than the table was sized for. A
table whose entries stand for published decisions keeps ``evicted`` (a list): every key
the cap removed, by ``create`` or by a restore's ``put``, is appended there until the
owner drains it and lifts those decisions (expiry is not recorded: a decision expires
with its entry).

A table given ``pinned`` (entry, the newest time the table was told) never evicts an entry
the predicate pins while it can pick another: the cap looks at up to ``PIN_TRIES`` of the
oldest entries, moving each pinned one to the newest end, and evicts the first unpinned
one; when all of them are pinned it evicts the last one looked at (recorded in ``evicted`` like any
other, so its owner tombstones the decision). The work per insert stays O(1) and memory
stays bounded by the cap.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from pipeline.core.keys import Key

PIN_TRIES = 8
"""Oldest entries the cap looks at for one it may evict (``pinned``)."""


class Expiring(Protocol):
    keep_until_ms: int


E = TypeVar("E", bound=Expiring)


class BoundedTable(Generic[E]):
    """Key -> entry, at most ``cap`` entries, oldest-touched evicted first."""

    __slots__ = (
        "_entries",
        "cap",
        "evicted",
        "evictions",
        "expired",
        "mapping",
        "now_ms",
        "on_drop",
        "pinned",
    )

    def __init__(
        self,
        cap: int,
        on_drop: Callable[[Key, E], None] | None = None,
        record_evicted: bool = False,
        pinned: Callable[[E, int], bool] | None = None,
    ) -> None:
        self._entries: OrderedDict[Key, E] = OrderedDict()
        # The same dict, public for hot paths that read entries and move them to the
        # newest end themselves (a method call costs more than the lookup). Everything
        # that inserts or removes goes through the table's methods.
        self.mapping = self._entries
        self.cap = cap
        self.evictions = 0
        self.expired = 0
        self.on_drop = on_drop
        self.evicted: list[Key] | None = [] if record_evicted else None
        self.pinned = pinned
        # The newest time the table was told (``expire``, ``touch``, or its owner
        # directly): what ``pinned`` compares with.
        self.now_ms = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def get(self, key: Key) -> E | None:
        return self._entries.get(key)

    def touch(self, key: Key, factory: Callable[[], E], now_ms: int = -1) -> E:
        """The entry for ``key``, moved to the newest end; created if missing or if its
        ``keep_until_ms`` is at or before ``now_ms`` (past its time, it is semantically
        gone even if ``expire`` has not reached it yet behind a longer-lived neighbour)."""
        if now_ms > self.now_ms:
            self.now_ms = now_ms
        entry = self._entries.get(key)
        if entry is None:
            return self.create(key, factory)
        if entry.keep_until_ms <= now_ms:
            return self.create(key, factory, replace=True)
        self._entries.move_to_end(key)
        return entry

    def create(self, key: Key, factory: Callable[[], E], replace: bool = False) -> E:
        """A new entry for ``key`` at the newest end, for a caller that already looked
        it up: absent (the cap applies) or, with ``replace``, present but past its time."""
        entries = self._entries
        if replace:
            del entries[key]
            self.expired += 1
        elif len(entries) >= self.cap:
            self._evict()
        entry = factory()
        entries[key] = entry
        return entry

    def put(self, key: Key, entry: E) -> None:
        """Insert a restored entry at the newest end (cap applies)."""
        if key not in self._entries and len(self._entries) >= self.cap:
            self._evict()
        self._entries[key] = entry
        self._entries.move_to_end(key)

    def _evict(self) -> None:
        """Remove the least recently touched entry to make room (the cap), passing over
        up to ``PIN_TRIES`` pinned ones (moved to the newest end)."""
        entries = self._entries
        pinned = self.pinned
        old_key, old = entries.popitem(last=False)
        if pinned is not None:
            for _ in range(PIN_TRIES - 1):
                if not pinned(old, self.now_ms):
                    break
                entries[old_key] = old  # kept: to the newest end
                old_key, old = entries.popitem(last=False)
            # Past the tries every entry looked at holds a decision: this one goes (its
            # owner tombstones the decision through ``evicted``).
        self.evictions += 1
        if self.evicted is not None:
            self.evicted.append(old_key)
        if self.on_drop is not None:
            self.on_drop(old_key, old)

    def sort_by_deadline(self) -> None:
        """Order entries by ``keep_until_ms`` (stable), so ``expire`` pops every dead entry
        from the front. Used once after a restore, whose load order is the changelog's."""
        ordered = sorted(self._entries.items(), key=_deadline)
        self._entries.clear()  # in place: ``mapping`` is the same object
        self._entries.update(ordered)

    def pop(self, key: Key) -> E | None:
        return self._entries.pop(key, None)

    def expire(self, now_ms: int) -> list[Key]:
        """Drop entries from the oldest end while they are past ``keep_until_ms``."""
        entries = self._entries
        if now_ms > self.now_ms:
            self.now_ms = now_ms
        dropped: list[Key] = []
        while entries:
            key = next(iter(entries))
            entry = entries[key]
            if entry.keep_until_ms > now_ms:
                break
            del entries[key]
            self.expired += 1
            dropped.append(key)
            if self.on_drop is not None:
                self.on_drop(key, entry)
        return dropped

    def items(self) -> Iterator[tuple[Key, E]]:
        return iter(list(self._entries.items()))


def _deadline(item: tuple[Key, Expiring]) -> int:
    return item[1].keep_until_ms
