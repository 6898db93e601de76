"""The sink's cut of an insert by day: within the partition limit, stable, lossless."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pipeline.sinks.partitions import DAY_MS, MAX_DAYS_PER_INSERT, split_by_day


def rows_on(days: list[int]) -> list[list[Any]]:
    return [[day * DAY_MS + 1000 * i, f"ev-{i}"] for i, day in enumerate(days)]


def test_a_batch_within_the_limit_is_one_part_under_its_own_token() -> None:
    """100 distinct days (the default limit): one part, the batch's token unchanged."""
    rows = rows_on(list(range(MAX_DAYS_PER_INSERT)))
    assert split_by_day(rows, "attempts:t:0:0-99", 0) == [("attempts:t:0:0-99", rows)]


def test_a_batch_over_the_limit_is_cut_into_parts_of_consecutive_days() -> None:
    """Days -1..4 with a limit of 2, rows out of order: parts {-1,0}, {1,2}, {3,4}, tokens k/n."""
    rows = rows_on([4, 0, 3, 1, 2, 0, -1])
    parts = split_by_day(rows, "tok", 0, max_days=2)
    assert [token for token, _ in parts] == ["tok#1/3", "tok#2/3", "tok#3/3"]
    assert [[row[1] for row in part] for _, part in parts] == [
        ["ev-1", "ev-5", "ev-6"],  # days -1 and 0 (before 1970 floors to day -1)
        ["ev-3", "ev-4"],
        ["ev-0", "ev-2"],
    ]


@given(st.lists(st.integers(-30, 400), max_size=300), st.integers(1, 120))
def test_every_row_lands_in_one_part_within_the_limit(days: list[int], limit: int) -> None:
    """Lossless, order kept per part, at most ``limit`` days per part, same cut twice."""
    rows = rows_on(days)
    parts = split_by_day(rows, "tok", 0, max_days=limit)
    assert sorted(row[1] for _, part in parts for row in part) == sorted(r[1] for r in rows)
    for _, part in parts:
        assert len({row[0] // DAY_MS for row in part}) <= limit
        assert part == sorted(part, key=rows.index)
    assert parts == split_by_day([list(row) for row in rows], "tok", 0, max_days=limit)
