"""The sink's ClickHouse side: one lazily opened handle, inserts in day parts with the
refused parts quarantined, and the capped exponential backoff after a failure.

The writer never touches Kafka: the sink's loop (``pipeline.sinks.loop``) pauses fetching
when ``failed`` is called and resumes it after ``recovered``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Final

from pipeline.logs import get_logger
from pipeline.sinks.clickhouse import (
    BatchRefused,
    ClickHouse,
    ClickHouseError,
    ClickHouseUnavailable,
)
from pipeline.sinks.lanes import WorkItem
from pipeline.sinks.partitions import split_by_day
from pipeline.sinks.quarantine import Quarantine, Quarantined
from pipeline.sinks.stats import SinkStats, monotonic_ms
from pipeline.sinks.tables import DAY_INDEX

log = get_logger("sink")

BACKOFF_START_S: Final = 0.2
BACKOFF_CAP_S: Final = 30.0

AfterInsert = Callable[[int, str], None]
"""Called with (successful inserts so far, the insert's token) after each insert."""


class TableWriter:
    """Inserts planned items into their tables; counts into the sink's ``stats``."""

    def __init__(
        self,
        open_ch: Callable[[], ClickHouse],
        *,
        insert_settings: Mapping[str, Any],
        quarantine: Quarantine,
        stats: SinkStats,
        after_insert: AfterInsert | None = None,
    ) -> None:
        self._open_ch = open_ch
        self._ch: ClickHouse | None = None
        self.insert_settings = insert_settings
        self.quarantine = quarantine
        self.stats = stats
        self._after_insert = after_insert
        self.backoff_s = BACKOFF_START_S
        self.retry_at_ms = 0
        """Monotonic ms before which nothing is retried after a failure."""

    async def handle(self) -> ClickHouse:
        """The ClickHouse handle, opened on first use (and again after a hard failure)."""
        if self._ch is None:
            self._ch = await asyncio.to_thread(self._open_ch)
        return self._ch

    async def insert(self, item: WorkItem, topic: str, partition: int) -> None:
        """Insert an item in parts of at most MAX_DAYS_PER_INSERT days; quarantine the
        parts ClickHouse refuses for good. ``topic``/``partition``: the item's lane."""
        if not item.rows:
            return
        for token, rows in split_by_day(item.rows, item.token, DAY_INDEX[item.table]):
            ch = await self.handle()
            try:
                await asyncio.to_thread(
                    ch.insert,
                    item.table,
                    item.columns,
                    rows,
                    dedup_token=token,
                    settings=self.insert_settings,
                )
            except BatchRefused as exc:
                refused = Quarantined(
                    reason=exc.reason,
                    detail=str(exc),
                    table=item.table,
                    columns=item.columns,
                    rows=rows,
                    topic=topic,
                    partition=partition,
                    offset=item.first,
                    token=token,
                )
                await self.quarantine.put(refused, ch)
                continue
            self.stats.inserts += 1
            self.stats.rows_written += len(rows)
            if self._after_insert is not None:
                self._after_insert(self.stats.inserts, token)

    def failed(self, exc: Exception) -> None:
        """An insert (or quarantine) failed: log it, drop a handle that failed for good,
        and wait the backoff before the next try (doubling, up to BACKOFF_CAP_S)."""
        self.stats.insert_failures += 1
        transient = not isinstance(exc, ClickHouseError) or isinstance(exc, ClickHouseUnavailable)
        (log.warning if transient else log.error)(
            "sink_insert_failed",
            error=str(exc)[:500],
            transient=transient,
            retry_in_s=round(self.backoff_s, 3),
        )
        if not transient and self._ch is not None:
            ch, self._ch = self._ch, None  # a fresh handle next time (e.g. after migrate)
            with contextlib.suppress(Exception):
                ch.close()
        self.retry_at_ms = monotonic_ms() + int(self.backoff_s * 1000)
        self.backoff_s = min(BACKOFF_CAP_S, self.backoff_s * 2)

    def recovered(self) -> None:
        """ClickHouse took what was due: the backoff starts over."""
        self.backoff_s = BACKOFF_START_S

    async def close(self) -> None:
        if self._ch is not None:
            ch, self._ch = self._ch, None
            with contextlib.suppress(Exception):
                await asyncio.to_thread(ch.close)
