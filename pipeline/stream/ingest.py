"""Ingest: raw input records in, normalised rows (by account partition) and dead letters out.

Pure apart from ``now_ms``, which the shell passes in (the wall clock decides only the
future-skew check). Every record ends in exactly one of the two outputs, so
``rows + dead letters == records`` for every batch: nothing is dropped silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from pipeline.contracts.codec import DecodeError, decode_attempt
from pipeline.contracts.models import datetime_to_ms
from pipeline.core.attempt import Normaliser
from pipeline.core.errors import InvalidAttempt
from pipeline.stream.partitioning import account_partition


@dataclass(frozen=True, slots=True)
class Record:
    """One consumed message, as the broker delivered it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that will go to the dead-letter topic, bytes untouched, with why."""

    record: Record
    reason: str
    detail: str
    stage: str = "ingest"

    def headers(self) -> list[tuple[str, bytes]]:
        return [
            ("error", self.reason.encode()),
            ("error_detail", self.detail[:1000].encode("utf-8", "replace")),
            ("stage", self.stage.encode()),
            ("source_topic", self.record.topic.encode()),
            ("source_partition", str(self.record.partition).encode()),
            ("source_offset", str(self.record.offset).encode()),
        ]


@dataclass
class IngestResult:
    rows: dict[int, list[list[object]]] = field(default_factory=dict)
    dead: list[DeadLetter] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    valid: int = 0


@dataclass(frozen=True, slots=True)
class Ingest:
    """Frozen config of the ingest step (see the module docstring).

    A row is ``[input_partition, input_offset, service, plain_account or None,
    *Attempt.to_row()]``; the plain account travels only when the operator enabled
    storing it in ClickHouse.
    """

    normaliser: Normaliser
    partitions: int
    max_event_bytes: int = 16384
    max_future_skew_ms: int = 300_000
    keep_plain_account: bool = False

    def process(self, records: Iterable[Record], now_ms: int) -> IngestResult:
        result = IngestResult()
        rows = result.rows
        limit_ms = now_ms + self.max_future_skew_ms
        for record in records:
            try:
                event = decode_attempt(record.value, max_bytes=self.max_event_bytes)
                if datetime_to_ms(event.occurred_at) > limit_ms:
                    raise DecodeError("future_timestamp", "occurred_at is beyond the allowed skew")
                attempt = self.normaliser.normalise(event)
            except (DecodeError, InvalidAttempt) as exc:
                result.dead.append(DeadLetter(record, exc.reason, exc.detail))
                result.reasons[exc.reason] += 1
                continue
            plain = event.account if self.keep_plain_account else None
            row = [record.partition, record.offset, event.service, plain, *attempt.to_row()]
            rows.setdefault(account_partition(attempt.account, self.partitions), []).append(row)
            result.valid += 1
        return result
