"""Ingest: raw input records in, normalised rows (by account partition) and dead letters out.

Pure apart from ``now_ms``, which the shell passes in (the wall clock decides only the
skew checks: ``future_timestamp`` beyond ``max_future_skew_ms`` ahead, ``past_timestamp``
beyond ``max_past_skew_ms`` behind or before 1970, which the tables cannot hold). Every record ends in exactly one of the two outputs, so
``rows + dead letters == records`` for every batch: nothing is dropped silently.

Besides the codec's reasons, ingest dead-letters ``unknown_tenant`` (``ingest.tenants``
is set and does not list the event's tenant) and ``tenant_cap`` (the worker already
tracks ``ingest.max_tenants`` tenants: every tenant costs counters and tables, so
a producer cannot grow a worker's memory by inventing tenants), and ``oversize``: a record
whose key and value together exceed ``max_event_bytes + RECORD_OVERHEAD_BYTES`` is not
copied to the dead-letter topic (its dead letter has no key and an empty value and names
the offset; the bytes stay in the input topic), so no producer can make the worker hold or
send more than that per record (compressed batches: ``pipeline.stream.inflation``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from pipeline.contracts.codec import DecodeError, decode_attempt
from pipeline.core.attempt import Normaliser
from pipeline.core.errors import InvalidAttempt
from pipeline.core.policy import Policy
from pipeline.settings import Settings
from pipeline.stream.partitioning import account_partition
from pipeline.wiring import build_normaliser

RECORD_OVERHEAD_BYTES = 4096
"""Allowed beside an event's value in one record (its key, headers and framing) before the
record is ``oversize``."""
OVERSIZE = "oversize"


class RawRecord(Protocol):
    """What ingest reads of a consumed message (aiokafka's ConsumerRecord has it all)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


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

    record: RawRecord
    reason: str
    detail: str
    stage: str = "ingest"
    last_offset: int | None = None  # a range of offsets (an undecodable batch) ends here

    @property
    def offsets(self) -> int:
        """Input offsets this dead letter stands for (more than one for a batch)."""
        return 1 if self.last_offset is None else self.last_offset - self.record.offset + 1

    def headers(self) -> list[tuple[str, bytes]]:
        headers = [
            ("error", self.reason.encode()),
            ("error_detail", self.detail[:1000].encode("utf-8", "replace")),
            ("stage", self.stage.encode()),
            ("source_topic", self.record.topic.encode()),
            ("source_partition", str(self.record.partition).encode()),
            ("source_offset", str(self.record.offset).encode()),
        ]
        if self.last_offset is not None:
            headers.append(("source_offset_last", str(self.last_offset).encode()))
        return headers


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
    max_past_skew_ms: int = 604_800_000
    keep_plain_account: bool = False
    tenants: frozenset[str] = frozenset()
    max_tenants: int = 1000
    admitted: set[str] = field(default_factory=set, init=False, repr=False, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings, policy: Policy) -> Ingest:
        """The ingest step every worker (and the in-memory twin) runs for ``settings``."""
        return cls(
            normaliser=build_normaliser(settings, policy),
            partitions=settings.kafka.partitions,
            max_event_bytes=settings.ingest.max_event_bytes,
            max_future_skew_ms=settings.ingest.max_future_skew_ms,
            max_past_skew_ms=settings.ingest.max_past_skew_ms,
            tenants=frozenset(settings.ingest.tenants),
            max_tenants=settings.ingest.max_tenants,
            keep_plain_account=settings.clickhouse.store_plain_account,
        )

    def admit_tenant(self, tenant: str) -> None:
        """Track ``tenant`` or raise DecodeError: not allow-listed, or over the cap."""
        if self.tenants and tenant not in self.tenants:
            raise DecodeError(
                "unknown_tenant", f"tenant {tenant!r} is not in ingest.tenants; add it there"
            )
        if len(self.admitted) >= self.max_tenants:
            raise DecodeError(
                "tenant_cap",
                f"this worker already tracks ingest.max_tenants={self.max_tenants} tenants; "
                f"tenant {tenant!r} is refused (raise the cap or list tenants in ingest.tenants)",
            )
        self.admitted.add(tenant)

    def process(self, records: Iterable[RawRecord], now_ms: int) -> IngestResult:
        result = IngestResult()
        rows = result.rows
        limit_ms = now_ms + self.max_future_skew_ms
        oldest_ms = max(0, now_ms - self.max_past_skew_ms)
        partitions = self.partitions
        keep_plain = self.keep_plain_account
        max_bytes = self.max_event_bytes
        normalise = self.normaliser.normalise
        admitted = self.admitted
        max_record = max_bytes + RECORD_OVERHEAD_BYTES
        for record in records:
            size = len(record.value or b"") + len(record.key or b"")
            if size > max_record:
                result.dead.append(oversize(record, size, max_record))
                result.reasons[OVERSIZE] += 1
                continue
            try:
                event = decode_attempt(record.value, max_bytes=max_bytes)
                attempt = normalise(event)
                if attempt.occurred_ms > limit_ms:
                    raise DecodeError("future_timestamp", "occurred_at is beyond the allowed skew")
                if attempt.occurred_ms < oldest_ms:
                    raise DecodeError(
                        "past_timestamp",
                        "occurred_at is before 1970"
                        if attempt.occurred_ms < 0
                        else "occurred_at is older than ingest.max_past_skew_ms",
                    )
                # Admitted last: an event dead-lettered for any other reason takes no slot.
                if event.tenant not in admitted:
                    self.admit_tenant(event.tenant)
            except (DecodeError, InvalidAttempt) as exc:
                result.dead.append(DeadLetter(record, exc.reason, exc.detail))
                result.reasons[exc.reason] += 1
                continue
            plain = event.account if keep_plain else None
            row: list[object] = [record.partition, record.offset, event.service, plain, *attempt]
            target = account_partition(attempt.account, partitions)
            bucket = rows.get(target)
            if bucket is None:
                rows[target] = [row]
            else:
                bucket.append(row)
        result.valid = sum(len(bucket) for bucket in rows.values())
        return result


def oversize(record: RawRecord, size: int, max_record: int) -> DeadLetter:
    """The dead letter of a record too large to copy: no key, an empty value, its offset."""
    detail = (
        f"key and value are {size} bytes, over the {max_record}-byte bound "
        "(ingest.max_event_bytes + 4096); the bytes stay in the input topic at this offset"
    )
    empty = Record(record.topic, record.partition, record.offset, None, b"")
    return DeadLetter(empty, OVERSIZE, detail)
