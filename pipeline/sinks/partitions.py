"""Cut one planned insert into parts that each touch at most ``MAX_DAYS_PER_INSERT`` days.

ClickHouse refuses an INSERT whose block spans more partitions than the query setting
``max_partitions_per_insert_block`` (code 252, "Too many partitions for single INSERT
block"), and the views fed by ``attempts`` inherit its rows' days. The sink's tables are
partitioned by the day (``attempts``, ``dead_letters`` and the minute views) or the month
(``decisions``, ``alerts``) of one epoch-millisecond column, so parts of at most
``MAX_DAYS_PER_INSERT`` distinct days stay within the limit for every table; the sink
passes the same number as the setting (``INSERT_SETTINGS``), so the cut and the limit
agree whatever the server's profile says.

Invariants (pure; no I/O, no clock):

* every row is in exactly one part, rows keep their order inside a part;
* the cut depends on the rows only (distinct days sorted, then groups of consecutive
  days), so a replayed batch is cut the same way and each part keeps its dedup token;
* a batch within the limit is one part under the batch's own token (what older sinks
  inserted under); part ``k`` of ``n > 1`` is ``<token>#<k>/<n>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

DAY_MS: Final = 86_400_000
MAX_DAYS_PER_INSERT: Final = 100  # ClickHouse's default max_partitions_per_insert_block

# The epoch-millisecond column each sink table is partitioned by (schemas/clickhouse).
PARTITION_COLUMN: Final[Mapping[str, str]] = {
    "attempts": "ts",
    "decisions": "issued_at",
    "alerts": "window_start",
    "dead_letters": "ts",
}


def split_by_day(
    rows: list[list[Any]], token: str, index: int, max_days: int = MAX_DAYS_PER_INSERT
) -> list[tuple[str, list[list[Any]]]]:
    """``(token, rows)`` parts of one insert, each within ``max_days`` distinct days of
    the epoch-millisecond value at ``index`` of every row."""
    if len(rows) < 2:
        return [(token, rows)]
    days = {row[index] // DAY_MS for row in rows}
    if len(days) <= max_days:
        return [(token, rows)]
    ordered = sorted(days)
    group = {day: position // max_days for position, day in enumerate(ordered)}
    count = (len(ordered) + max_days - 1) // max_days
    parts: list[list[list[Any]]] = [[] for _ in range(count)]
    for row in rows:
        parts[group[row[index] // DAY_MS]].append(row)
    return [(f"{token}#{k}/{count}", part) for k, part in enumerate(parts, start=1)]
