"""The sink's counters and its clock for flush timing."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class SinkStats:
    """Counters logged as ``sink.progress`` and at shutdown."""

    messages: int = 0
    rows_in: int = 0
    rows_written: int = 0
    inserts: int = 0
    insert_failures: int = 0
    commits: int = 0
    commit_failures: int = 0
    bad_messages: int = 0
    bad_rows: int = 0
    replayed_items: int = 0
    upstream_replayed_rows: int = 0
    quarantined_rows: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def monotonic_ms() -> int:
    """The sink's clock for flush timing (never for event time)."""
    return time.monotonic_ns() // 1_000_000
