"""Quarantine: rows the sink cannot write go to the dead-letter topic, with the reason.

Two kinds of rows end here instead of stopping the sink or vanishing:

* a planned insert ClickHouse refuses for good (``BatchRefused``, e.g. code 252 "too many
  partitions for single INSERT block"): the whole insert, reason from the refusal;
* audit rows that no table column can hold (``past_timestamp`` for a time before 1970,
  ``invalid_row`` for wrong types or ranges), found when a message is decoded.

Each is written twice, before the lane commits past it:

* to the dead-letter topic (the bytes, kept 30 days), as messages of at most
  ``MAX_ROWS_PER_MESSAGE`` rows: the value is JSON ``{"v": 1, "table", "columns", "rows"}``
  (the rows as the sink would have inserted them, to inspect or re-insert), the key the
  insert's dedup token, the headers those of ingest's dead letters (``error`` = the
  reason, ``error_detail``, ``stage = sink``, ``source_topic``/``source_partition``/
  ``source_offset`` = the first offset of the range the rows came from) plus
  ``dedup_token``. Delivery is at least once: a crash before the commit sends them again.
* to ``dead_letters`` directly, one row per quarantined row, located by the row's own
  ``kafka_topic``/``kafka_partition``/``kafka_offset`` (for an audit row: the input event),
  under the dedup token ``dead_letters:<token>``: exactly once, so ``count()`` of
  ``attempts`` rows plus quarantined rows is exact. The sink's dead-letter lane skips the
  messages it quarantined itself (``stage = sink`` with a ``dedup_token`` header).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from pipeline.contracts.models import AUDIT_COLUMNS
from pipeline.logs import get_logger
from pipeline.sinks.clickhouse import ClickHouse

log = get_logger("sink.quarantine")

MAX_ROWS_PER_MESSAGE: Final = 500  # about 200 KB of JSON per message for attempts rows
STAGE: Final = "sink"
UINT16_MAX: Final = 65_535
DEAD_LETTERS_COLUMNS: Final = (
    "ts",
    "reason",
    "stage",
    "kafka_topic",
    "kafka_partition",
    "kafka_offset",
)

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class Quarantined:
    """Rows set aside: where they came from, why, and what they are."""

    reason: str
    detail: str
    table: str
    columns: tuple[str, ...]
    rows: Sequence[Any]
    topic: str
    partition: int
    offset: int
    token: str

    def dead_letter_rows(self, now_ms: int) -> list[list[Any]]:
        """``dead_letters`` rows (DEAD_LETTERS_COLUMNS order), one per quarantined row."""
        fallback = (self.topic, self.partition, self.offset)
        return [[now_ms, self.reason, STAGE, *_locate(row, fallback)] for row in self.rows]

    def messages(self, max_rows: int = MAX_ROWS_PER_MESSAGE) -> list[tuple[bytes, bytes, Headers]]:
        """``(key, value, headers)`` of the dead letters, in row order."""
        headers: Headers = [
            ("error", self.reason.encode()),
            ("error_detail", self.detail[:1000].encode("utf-8", "replace")),
            ("stage", STAGE.encode()),
            ("source_topic", self.topic.encode()),
            ("source_partition", str(self.partition).encode()),
            ("source_offset", str(self.offset).encode()),
            ("dedup_token", self.token.encode()),
        ]
        key = self.token.encode()
        out = []
        for start in range(0, max(1, len(self.rows)), max_rows):
            body = {
                "v": 1,
                "table": self.table,
                "columns": list(self.columns),
                "rows": list(self.rows[start : start + max_rows]),
            }
            out.append((key, orjson.dumps(body), headers))
        return out


def _locate(row: Any, fallback: tuple[str, int, int]) -> tuple[str, int, int]:
    """A row's own (kafka_topic, kafka_partition, kafka_offset), its last three values."""
    if type(row) is list and len(row) >= 3:
        topic, partition, offset = row[-3:]
        if (
            type(topic) is str
            and topic
            and type(partition) is int
            and 0 <= partition <= UINT16_MAX
            and type(offset) is int
            and offset >= 0
        ):
            return topic, partition, offset
    return fallback


class DeadLetterProducer:
    """Sends quarantined rows to the dead-letter topic; started lazily, on first use."""

    def __init__(self, client: Mapping[str, Any], topic: str) -> None:
        self.client = client  # bootstrap_servers and the TLS/SASL options (kafka_client)
        self.topic = topic
        self._producer: Any = None

    async def send(self, quarantined: Quarantined) -> None:
        """Send and wait for every message (raises aiokafka's KafkaError on failure)."""
        if self._producer is None:
            from aiokafka import AIOKafkaProducer

            producer = AIOKafkaProducer(
                **self.client,
                acks="all",
                enable_idempotence=True,
                max_request_size=4 * 1024 * 1024,
            )
            await producer.start()
            self._producer = producer
        for key, value, headers in quarantined.messages():
            await self._producer.send_and_wait(self.topic, value=value, key=key, headers=headers)
        log.error(
            "sink_quarantined",
            reason=quarantined.reason,
            table=quarantined.table,
            rows=len(quarantined.rows),
            topic=quarantined.topic,
            partition=quarantined.partition,
            offset=quarantined.offset,
            token=quarantined.token,
            detail=quarantined.detail[:300],
        )

    async def stop(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()


class Quarantine:
    """The sink's quarantine: rejects waiting to be set aside, and the two writes."""

    def __init__(
        self,
        client: Mapping[str, Any],
        topic: str,
        *,
        insert_settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.producer = DeadLetterProducer(client, topic)
        self.insert_settings = insert_settings
        self.pending: deque[Quarantined] = deque()
        self.rows = 0

    def queue_rejects(
        self, topic: str, partition: int, offset: int, rejects: Sequence[tuple[str, Any]]
    ) -> None:
        """Queue the rows of one message that no column can hold, one set per reason."""
        by_reason: dict[str, list[Any]] = {}
        for reason, row in rejects:
            by_reason.setdefault(reason, []).append(row)
        for reason, rows in sorted(by_reason.items()):
            rejected = Quarantined(
                reason=reason,
                detail=f"{len(rows)} audit rows no attempts column can hold",
                table="attempts",
                columns=AUDIT_COLUMNS,
                rows=rows,
                topic=topic,
                partition=partition,
                offset=offset,
                token=f"rejects:{topic}:{partition}:{offset}:{reason}",
            )
            self.pending.append(rejected)

    async def put(self, quarantined: Quarantined, ch: ClickHouse) -> None:
        """To the dead-letter topic (at least once), then ``dead_letters`` (exactly once)."""
        await self.producer.send(quarantined)
        rows = quarantined.dead_letter_rows(int(time.time() * 1000))
        await asyncio.to_thread(
            ch.insert,
            "dead_letters",
            DEAD_LETTERS_COLUMNS,
            rows,
            dedup_token=f"dead_letters:{quarantined.token}",
            settings=self.insert_settings,
        )
        self.rows += len(rows)

    async def put_pending(self, handle: Callable[[], Awaitable[ClickHouse]]) -> None:
        """Set aside every queued reject, oldest first; raises (and keeps it) on failure."""
        while self.pending:
            await self.put(self.pending[0], await handle())
            self.pending.popleft()

    async def stop(self) -> None:
        await self.producer.stop()
