"""The dedupe memory (``pipeline.core.dedupe``): the same answers as sets of the ids themselves."""

from __future__ import annotations

import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.dedupe import Deduper, IdTable, id_key


class _Reference:
    """The rule as sets of (tenant, event id): two generations, rotated by age or size."""

    def __init__(self, horizon_ms: int, capacity: int) -> None:
        self.current: set[tuple[str, str]] = set()
        self.previous: set[tuple[str, str]] = set()
        self.horizon_ms, self.half = horizon_ms, max(1, capacity // 2)
        self.rotate_at_ms = -1

    def seen(self, event_id: str, now_ms: int, tenant: str) -> bool:
        item = (tenant, event_id)
        if item in self.current or item in self.previous:
            return True
        if now_ms >= self.rotate_at_ms or len(self.current) >= self.half:
            self.previous, self.current = self.current, set()
            self.rotate_at_ms = now_ms + self.horizon_ms
        self.current.add(item)
        return False


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["", "acme", "globex"]),
            st.text(min_size=1, max_size=6),
            st.integers(min_value=0, max_value=50),
        ),
        max_size=400,
    ),
    st.integers(min_value=1, max_value=200),
    st.integers(min_value=1, max_value=60),
)
def test_the_key_tables_answer_as_sets_of_the_ids_would(
    steps: list[tuple[str, str, int]], horizon_ms: int, capacity: int
) -> None:
    """Any ids, tenants, times and bounds: every answer, the duplicates and the count held
    equal those of plain sets of (tenant, id) under the same rotation rule."""
    dedupe, reference = Deduper(horizon_ms, capacity), _Reference(horizon_ms, capacity)
    now_ms, expected_duplicates = 0, 0
    for tenant, event_id, step_ms in steps:
        now_ms += step_ms
        answer = reference.seen(event_id, now_ms, tenant)
        expected_duplicates += answer
        assert dedupe.seen(event_id, now_ms, tenant) is answer
    assert dedupe.duplicates == expected_duplicates
    assert len(dedupe) == len(reference.current) + len(reference.previous)


def test_a_table_grows_past_its_first_slots_and_keeps_every_key() -> None:
    """100,000 keys (the first table has 1,024 slots): all found, none added missing, at
    most half the slots used."""
    table = IdTable()
    keys = [id_key("t", f"ev-{i}") for i in range(100_000)]
    for key in keys:
        table.put(key, table.slot(key))
    assert all(table.slot(key) < 0 for key in keys)
    assert sum(table.slot(id_key("t", f"other-{i}")) < 0 for i in range(100_000)) == 0
    assert (table.size, len(table.keys)) == (100_000, 262_144)


def test_a_million_ids_take_under_32_bytes_each() -> None:
    """The default capacity's worth of ids (two generations of 500,000) in at most 32 MB:
    the string-and-set form took about 100 MB (bench/README.md, B3)."""
    dedupe = Deduper(horizon_ms=10**12, capacity=1_000_000)
    for i in range(1_000_000):
        dedupe.seen(f"{i:016x}", i)
    held = sys.getsizeof(dedupe._current.keys) + sys.getsizeof(dedupe._previous.keys)
    assert len(dedupe) == 1_000_000
    assert held <= 32 * 1_000_000
