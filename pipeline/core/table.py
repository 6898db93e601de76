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
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, Generic, Protocol, TypeVar

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
        _make_room(self, self._entries, key, replace)
        entry = factory()
        self._entries[key] = entry
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
        if now_ms > self.now_ms:
            self.now_ms = now_ms
        gone = _pop_expired(self._entries, _keep_until, now_ms)
        self.expired += len(gone)
        if self.on_drop is not None:
            for key, entry in gone:
                self.on_drop(key, entry)
        return [key for key, _ in gone]

    def items(self) -> Iterator[tuple[Key, E]]:
        return iter(list(self._entries.items()))


class _Capped(Protocol):
    cap: int
    expired: int

    def _evict(self) -> None: ...


def _make_room(
    table: _Capped, entries: MutableMapping[Any, Any], key: object, replace: bool
) -> None:
    """Before a new entry: drop ``key``'s own, past its time (``replace``), else evict
    the oldest-touched one when the table is at its cap."""
    if replace:
        del entries[key]
        table.expired += 1
    elif len(entries) >= table.cap:
        table._evict()


K = TypeVar("K")
V = TypeVar("V")


def _pop_expired(
    entries: OrderedDict[K, V], deadline: Callable[[V], int], now_ms: int
) -> list[tuple[K, V]]:
    """Pop entries from the oldest end while their deadline is at or before ``now_ms``."""
    gone: list[tuple[K, V]] = []
    while entries:
        key = next(iter(entries))
        value = entries[key]
        if deadline(value) > now_ms:
            break
        del entries[key]
        gone.append((key, value))
    return gone


def _keep_until(entry: Expiring) -> int:
    return entry.keep_until_ms


def _deadline(item: tuple[Key, Expiring]) -> int:
    return item[1].keep_until_ms


# -- packed tables (issue 45 item 2) ---------------------------------------------------------

_HEX = frozenset("0123456789abcdef")
_NONE, _DIGEST, _TEXT = 0, 1, 2
_SCOPES = ("familiar", "passed")
"""Scopes a packed key names in one byte (3 + index); any other is kept as text."""


def pack_key(key: Key) -> bytes:
    """A decision key as one bytes object: per part a tag and its bytes (None: the tag
    alone; 32 lowercase hex digits, an account or client digest: their 16 bytes; other
    text: its length in two bytes and UTF-8), the scope in one byte when it is a familiar
    table's. Two keys pack alike exactly when they are equal."""
    scope, tenant, account, source, device = key
    out = bytearray()
    if scope in _SCOPES:
        out.append(3 + _SCOPES.index(scope))
    else:
        _pack_part(out, scope)
    for part in (tenant, account, source, device):
        _pack_part(out, part)
    return bytes(out)


def _pack_part(out: bytearray, part: str | None) -> None:
    if part is None:
        out.append(_NONE)
    elif len(part) == 32 and _HEX.issuperset(part):
        out.append(_DIGEST)
        out += bytes.fromhex(part)
    else:
        data = part.encode()
        out.append(_TEXT)
        out += len(data).to_bytes(2, "little")
        out += data


def unpack_key(packed: bytes) -> Key:
    """The key ``pack_key`` packed."""
    parts: list[str | None] = []
    at = 0
    if packed[0] >= 3:
        parts.append(_SCOPES[packed[0] - 3])
        at = 1
    while at < len(packed):
        tag = packed[at]
        if tag == _NONE:
            parts.append(None)
            at += 1
        elif tag == _DIGEST:
            parts.append(packed[at + 1 : at + 17].hex())
            at += 17
        else:
            size = int.from_bytes(packed[at + 1 : at + 3], "little")
            parts.append(packed[at + 3 : at + 3 + size].decode())
            at += 3 + size
    scope, tenant, account, source, device = parts
    return (scope or "", tenant or "", account, source, device)


class Dumped(Protocol):
    keep_until_ms: int

    def dump(self) -> list[object]: ...


D = TypeVar("D", bound=Dumped)


class PackedTable(Generic[D]):
    """``BoundedTable``'s bounds and order (``cap``, least recently touched evicted first,
    ``evicted``, expiry from the oldest end) over packed entries: each key is kept as
    ``pack_key`` bytes and each entry as ``pack(entry.dump())`` bytes (``load`` turns the
    record back into an entry), so an entry costs two bytes objects and its slot, not a
    tuple, its strings, a record and its fields. An entry ``pack`` cannot keep exactly
    (None) is kept as the object.

    Entries are values, not objects the table shares: ``get`` and ``find`` return a copy,
    and a caller that changes one stores it back with ``save`` (``create`` returns the
    new entry, kept as an object until saved). ``keep_until`` reads a packed entry's
    ``keep_until_ms`` (expiry and ``sort_by_deadline``)."""

    __slots__ = (
        "_entries",
        "_last",
        "cap",
        "evicted",
        "evictions",
        "expired",
        "keep_until",
        "load",
        "now_ms",
        "on_drop",
        "pack",
        "unpack",
    )

    def __init__(
        self,
        cap: int,
        load: Callable[[list[object]], D],
        pack: Callable[[list[object]], bytes | None],
        unpack: Callable[[bytes], list[object]],
        keep_until: Callable[[bytes], int],
        on_drop: Callable[[Key, D], None] | None = None,
        record_evicted: bool = False,
    ) -> None:
        self._entries: OrderedDict[bytes, bytes | D] = OrderedDict()
        # The last key packed and its bytes: a caller finds, creates and saves one key
        # in turn with the same tuple, which is packed once.
        self._last: tuple[Key | None, bytes] = (None, b"")
        self.cap = cap
        self.load = load
        self.pack = pack
        self.unpack = unpack
        self.keep_until = keep_until
        self.on_drop = on_drop
        self.evictions = 0
        self.expired = 0
        self.evicted: list[Key] | None = [] if record_evicted else None
        self.now_ms = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Key) -> bool:
        return self._key(key) in self._entries

    def _key(self, key: Key) -> bytes:
        """``pack_key(key)``, once for a tuple used again at once."""
        last, packed = self._last
        if last is not key:
            packed = pack_key(key)
            self._last = (key, packed)
        return packed

    def _value(self, stored: bytes | D) -> D:
        if isinstance(stored, bytes):
            return self.load(self.unpack(stored))
        return stored

    def _deadline(self, stored: bytes | D) -> int:
        if isinstance(stored, bytes):
            return self.keep_until(stored)
        return stored.keep_until_ms

    def get(self, key: Key) -> D | None:
        """A copy of ``key``'s entry, or None."""
        stored = self._entries.get(self._key(key))
        return None if stored is None else self._value(stored)

    def find(self, key: Key) -> D | None:
        """A copy of ``key``'s entry, moved to the newest end (touched), or None."""
        packed = self._key(key)
        stored = self._entries.get(packed)
        if stored is None:
            return None
        self._entries.move_to_end(packed)
        return self._value(stored)

    def create(self, key: Key, factory: Callable[[], D], replace: bool = False) -> D:
        """A new entry for ``key`` at the newest end (as ``BoundedTable.create``)."""
        packed = self._key(key)
        _make_room(self, self._entries, packed, replace)
        entry = factory()
        self._entries[packed] = entry
        return entry

    def save(self, key: Key, entry: D) -> None:
        """Store ``entry`` (changed) for ``key``, packed, where the key stands in the
        order; a key not held is put at the newest end (the cap applies)."""
        packed = self._key(key)
        value = self.pack(entry.dump())
        if packed in self._entries:
            self._entries[packed] = entry if value is None else value
        else:
            self.put(key, entry)

    def put(self, key: Key, entry: D) -> None:
        """Insert a restored entry at the newest end (cap applies)."""
        packed = self._key(key)
        entries = self._entries
        if packed not in entries and len(entries) >= self.cap:
            self._evict()
        value = self.pack(entry.dump())
        entries[packed] = entry if value is None else value
        entries.move_to_end(packed)

    def _evict(self) -> None:
        """Remove the least recently touched entry to make room (the cap)."""
        packed, stored = self._entries.popitem(last=False)
        self.evictions += 1
        key = unpack_key(packed)
        if self.evicted is not None:
            self.evicted.append(key)
        if self.on_drop is not None:
            self.on_drop(key, self._value(stored))

    def pop(self, key: Key) -> D | None:
        stored = self._entries.pop(self._key(key), None)
        return None if stored is None else self._value(stored)

    def expire(self, now_ms: int) -> list[Key]:
        """Drop entries from the oldest end while they are past ``keep_until_ms``."""
        if now_ms > self.now_ms:
            self.now_ms = now_ms
        gone = _pop_expired(self._entries, self._deadline, now_ms)
        self.expired += len(gone)
        keys = [unpack_key(packed) for packed, _ in gone]
        if self.on_drop is not None:
            for key, (_, stored) in zip(keys, gone, strict=True):
                self.on_drop(key, self._value(stored))
        return keys

    def sort_by_deadline(self) -> None:
        """Order entries by ``keep_until_ms`` (stable), as ``BoundedTable``'s."""
        ordered = sorted(self._entries.items(), key=lambda item: self._deadline(item[1]))
        self._entries.clear()
        self._entries.update(ordered)

    def items(self) -> Iterator[tuple[Key, D]]:
        """Copies of every entry, oldest touched first."""
        return iter([(unpack_key(k), self._value(v)) for k, v in self._entries.items()])
