"""The four tables the sink writes: their columns, where each row's day is, and the
settings of every insert. The one place a row's layout is defined.

A ``decisions`` row is a ``DecisionValue`` in its field order with ``tombstone`` before
``operator`` and the Kafka coordinates after (``decision_row``); ``DECISIONS_COLUMNS`` is
derived from the same fields, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pipeline.contracts.codec import DecisionValue
from pipeline.contracts.models import AUDIT_COLUMNS
from pipeline.sinks.partitions import MAX_DAYS_PER_INSERT, PARTITION_COLUMN
from pipeline.sinks.quarantine import DEAD_LETTERS_COLUMNS

LaneKind = Literal["audit", "decisions", "alerts", "dead_letters"]

UINT16_MAX: Final = 65_535

KAFKA_COLUMNS: Final = ("kafka_topic", "kafka_partition", "kafka_offset")
ATTEMPTS_COLUMNS: Final = ("ts", *AUDIT_COLUMNS[1:])
# DecisionValue's fields as the table names them (times without the _ms suffix).
_DECISION_FIELDS: Final = tuple(
    name.removesuffix("_ms") if name.endswith("_at_ms") else name for name in DecisionValue._fields
)
_MANUAL: Final = (
    3  # the last three fields, operator, reason and challenge, follow the tombstone flag
)
DECISIONS_COLUMNS: Final = (
    *_DECISION_FIELDS[:-_MANUAL],
    "tombstone",
    *_DECISION_FIELDS[-_MANUAL:],
    *KAFKA_COLUMNS,
)
ALERTS_COLUMNS: Final = (
    "alert_id",
    "type",
    "tenant",
    "source",
    "account_digest",
    "count",
    "distinct_accounts",
    "window_start",
    "window_end",
    "policy_version",
    *KAFKA_COLUMNS,
)

TABLES: Final[Mapping[LaneKind, tuple[str, tuple[str, ...]]]] = {
    "audit": ("attempts", ATTEMPTS_COLUMNS),
    "decisions": ("decisions", DECISIONS_COLUMNS),
    "alerts": ("alerts", ALERTS_COLUMNS),
    "dead_letters": ("dead_letters", DEAD_LETTERS_COLUMNS),
}
# Where each table's partition time is in its rows.
DAY_INDEX: Final[Mapping[str, int]] = {
    table: columns.index(PARTITION_COLUMN[table]) for table, columns in TABLES.values()
}

# Settings of every sink insert. The views' targets (AggregatingMergeTree) get one
# block per insert that the view's GROUP BY already made unique per key, so merging it
# again on insert (``optimize_on_insert``, on by default) finds nothing to fold, yet it
# rebuilds every aggregate state (a ``uniq`` set per account and minute): 2-4 us of the
# 20-25 us of engine and client CPU per ``attempts`` row in ``bench.bench_sink``. Readers
# GROUP BY the key anyway; background merges fold the parts as before.
# The partition limit is set to the cut of pipeline.sinks.partitions, so the two agree
# whatever the server's profile says.
INSERT_SETTINGS: Final[Mapping[str, Any]] = {
    "optimize_on_insert": 0,
    "max_partitions_per_insert_block": MAX_DAYS_PER_INSERT,
}


def decision_row(
    value: DecisionValue, *, tombstone: bool, topic: str, partition: int, offset: int
) -> list[Any]:
    """A ``decisions`` row: ``value``'s fields in ``DECISIONS_COLUMNS`` order."""
    return [*value[:-_MANUAL], tombstone, *value[-_MANUAL:], topic, partition, offset]
