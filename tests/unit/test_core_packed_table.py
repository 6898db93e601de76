"""PackedTable: packed keys and familiar records give back exactly what was stored, and
the table keeps BoundedTable's bounds, order, evictions and expiry (differential)."""

from __future__ import annotations

import random
import tracemalloc

from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.keys import Key
from pipeline.core.lockout import FOREVER_MS, StreakState
from pipeline.core.state import pack_streak, packed_keep_until, unpack_streak
from pipeline.core.table import BoundedTable, PackedTable, pack_key, unpack_key

ID = "84c34b8dc8fe5afcf6cba5696ebd84c1"
ACCOUNT = "ff3f48b51b1fe43d48c3458f2cc3168d"
T0 = 1_790_000_000_000
DAY = 86_400_000


def _packed(cap: int, record_evicted: bool = True) -> PackedTable[StreakState]:
    return PackedTable(
        cap,
        StreakState.load,
        pack_streak,
        unpack_streak,
        packed_keep_until,
        record_evicted=record_evicted,
    )


def _familiar(now: int, seq: int, decision_id: str = ID) -> StreakState:
    """An entry as ``Shard._exempt`` leaves it."""
    entry = StreakState()
    entry.blocked_until_ms = entry.keep_until_ms = now + 30 * DAY
    entry.notice_until_ms = now + DAY
    entry.rule = "familiar"
    entry.decision_id = decision_id
    entry.seq = seq
    return entry


def test_a_familiar_pair_key_packs_into_40_bytes_and_back() -> None:
    """The scope in a byte, the tenant as text, the account digest as 16 bytes, the
    address as text, None as its tag: 40 bytes, unpacked to the equal tuple."""
    key: Key = ("familiar", "default", ACCOUNT, "10.0.0.1", None)
    packed = pack_key(key)
    assert len(packed) == 40
    assert packed[:1] == b"\x03" and packed[-1:] == b"\x00"
    assert unpack_key(packed) == key


@given(
    st.tuples(
        st.sampled_from(["familiar", "passed", "source", "", "fam"]),
        st.text(max_size=12),
        st.none() | st.text(max_size=40) | st.sampled_from([ACCOUNT, ACCOUNT.upper(), ID]),
        st.none() | st.text(max_size=40),
        st.none() | st.text(max_size=40) | st.sampled_from([ID, ID[:31]]),
    )
)
def test_any_key_packs_back_to_itself_and_only_equal_keys_pack_alike(key: Key) -> None:
    """Any five parts (text, digests, upper-case hex, empty, None) round-trip, and a key
    differing in one part packs differently."""
    assert unpack_key(pack_key(key)) == key
    other: Key = (key[0], key[1], key[2], key[3], "x" if key[4] is None else None)
    assert pack_key(other) != pack_key(key)


def test_a_familiar_record_packs_into_41_bytes_and_back() -> None:
    """An exempt's record (keep = blocked): 25 bytes and the id's 16; 49 when keep
    differs (a new password's entry); both give back the record field for field."""
    entry = _familiar(T0, 7)
    record = entry.dump()
    packed = pack_streak(record)
    assert packed is not None and len(packed) == 41
    assert unpack_streak(packed) == record
    assert packed_keep_until(packed) == T0 + 30 * DAY
    reset = StreakState()
    reset.blocked_until_ms, reset.keep_until_ms, reset.seq = T0 + DAY, T0 + 30 * DAY, -1
    packed = pack_streak(reset.dump())
    assert packed is not None and len(packed) == 25 + 8
    assert unpack_streak(packed) == [0, T0 + DAY, "", "", 0, T0 + 30 * DAY, -1, 0, 0, 0, 0, 0]
    assert packed_keep_until(packed) == T0 + 30 * DAY


def test_records_a_familiar_table_never_writes_are_not_packed() -> None:
    """A count, a hold, another rule, an id not 32 lowercase hex digits, an int past 64
    bits, a bool or a short record: None (the table keeps the object)."""
    base = _familiar(T0, 1).dump()
    changes: list[tuple[int, object]] = [
        (0, 1),
        (8, FOREVER_MS),
        (3, "lockout"),
        (2, ID.upper()),
        (2, ID[:30]),
        (1, 1 << 63),
        (6, True),
    ]
    for at, value in changes:
        record = list(base)
        record[at] = value
        assert pack_streak(record) is None, (at, value)
    assert pack_streak(base[:8]) is None


def test_a_changelog_record_of_either_age_restores_the_same_bytes() -> None:
    """An 8-field record (before bounded holds) and a 12-field one load, pack and dump
    back exactly what StreakState gives: the changelog is the same before and after."""
    old = [0, T0 + 30 * DAY, ID, "familiar", T0 + DAY, T0 + 30 * DAY, 42, 0]
    new = StreakState.load(old).dump()
    table = _packed(10)
    key: Key = ("familiar", "t", ACCOUNT, "10.0.0.1", None)
    table.put(key, StreakState.load(old))
    restored = table.get(key)
    assert restored is not None and restored.dump() == new
    assert new == [0, T0 + 30 * DAY, ID, "familiar", T0 + DAY, T0 + 30 * DAY, 42, 0, 0, 0, 0, 0]


def test_get_returns_a_copy_and_save_stores_it_in_place() -> None:
    """A change to a copy is not kept until saved; save keeps the key's place in order."""
    table = _packed(10)
    a: Key = ("familiar", "t", "a", "s1", None)
    b: Key = ("familiar", "t", "b", "s1", None)
    table.save(a, _familiar(T0, 1))
    table.save(b, _familiar(T0, 2))
    copy = table.get(a)
    assert copy is not None
    copy.seq = 9
    assert table.get(a).seq == 1  # type: ignore[union-attr]
    table.save(a, copy)
    assert [(k, e.seq) for k, e in table.items()] == [(a, 9), (b, 2)]
    assert table.find(a) is not None
    assert [k for k, _ in table.items()] == [b, a]


def _apply(
    table: BoundedTable[StreakState] | PackedTable[StreakState], op: tuple[str, Key, int, int]
) -> object:
    """One operation as the shard does it on either table; what it returns, as records."""
    kind, key, now, seq = op
    if kind == "touch":
        if isinstance(table, BoundedTable):
            entry = table.mapping.get(key)
            if entry is not None:
                table.mapping.move_to_end(key)
        else:
            entry = table.find(key)
        if entry is None:
            entry = table.create(key, StreakState)
        entry.blocked_until_ms = entry.keep_until_ms = now + 5000
        entry.notice_until_ms = now + 1000
        entry.rule = "familiar"
        entry.decision_id = f"{seq:032x}"
        entry.seq = max(entry.seq, seq)
        if isinstance(table, PackedTable):
            table.save(key, entry)
        return entry.dump()
    if kind == "put":
        table.put(key, _familiar(now, seq))
        return None
    if kind == "pop":
        popped = table.pop(key)
        return None if popped is None else popped.dump()
    if kind == "expire":
        return table.expire(now)
    if kind == "sort":
        table.sort_by_deadline()
        return None
    entry = table.get(key)
    return None if entry is None else entry.dump()


def test_the_packed_table_keeps_the_bounded_tables_order_bounds_and_expiry() -> None:
    """3,000 random touches, restores, pops, reads, expiries and sorts on 40 keys, cap
    16: both tables answer alike, hold the same records in the same order and evict,
    record and expire the same keys."""
    rng = random.Random(45)
    dropped: tuple[list[Key], list[Key]] = ([], [])
    plain: BoundedTable[StreakState] = BoundedTable(
        16, lambda k, _e: dropped[0].append(k), record_evicted=True
    )
    packed = _packed(16)
    packed.on_drop = lambda k, _e: dropped[1].append(k)
    keys: list[Key] = [
        ("familiar", "t", f"{i:032x}", None if i % 2 else f"10.0.0.{i}", f"d{i}" if i % 2 else None)
        for i in range(40)
    ]
    now = T0
    kinds = ["touch"] * 6 + ["put", "pop", "get", "expire", "sort"]
    for seq in range(3000):
        now += rng.randrange(0, 400)
        op = (rng.choice(kinds), rng.choice(keys), now, seq)
        assert _apply(plain, op) == _apply(packed, op), (seq, op)
        assert len(plain) == len(packed)
    assert [(k, e.dump()) for k, e in plain.items()] == [(k, e.dump()) for k, e in packed.items()]
    assert (plain.evictions, plain.expired) == (packed.evictions, packed.expired)
    assert plain.evictions > 100 and plain.expired > 100
    assert dropped[0] == dropped[1]
    assert plain.evicted == packed.evicted


def _held(table: BoundedTable[StreakState] | PackedTable[StreakState], n: int) -> float:
    """Heap bytes per entry after saving ``n`` exempts' entries with fresh key strings."""
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        key: Key = ("familiar", "t", f"{i:032x}", f"10.0.{i >> 8}.{i & 255}", None)
        entry = _familiar(T0 + i * 1000, 1_000_000 + i, f"{i + 1:032x}")
        if isinstance(table, PackedTable):
            table.save(key, entry)
        else:
            table.put(key, entry)
    size = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    return size / n


def test_a_packed_familiar_entry_holds_under_240_bytes() -> None:
    """20,000 exempts' entries (a pair key, an exempt record, the strings): under 240
    bytes each with the table's slot (218 measured), the tuple-keyed StreakState's over
    twice that (608 interpreted, 512 with the compiled core)."""
    packed, plain = _held(_packed(1_000_000), 20_000), _held(BoundedTable(1_000_000), 20_000)
    assert packed < 240, packed
    assert plain > 2 * packed, plain
