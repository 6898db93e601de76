"""Ingest: raw input records in, normalised rows (by account partition) and dead letters out.

Pure apart from ``now_ms``, which the shell passes in (the wall clock decides only the
future-skew check). Every record ends in exactly one of the two outputs, so
``rows + dead letters == records`` for every batch: nothing is dropped silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipeline.contracts.codec import DecodeError, decode_attempt
from pipeline.contracts.models import LoginAttempt, datetime_to_ms
from pipeline.core.attempt import Normaliser
from pipeline.core.errors import InvalidAttempt
from pipeline.stream.partitioning import account_partition

IDENTITY_CACHE_ENTRIES = 32_768  # per generation; two generations at most


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


# The fields of a normalised attempt that depend only on who and where, not on the event:
# (tenant, account digest, source, device digest, session digest, trusted), as they sit in
# ``Attempt.to_row()`` between ``occurred_ms`` and ``flow``.
Identity = tuple[Any, ...]
IDENTITY_SLICE = slice(2, 8)


def identity_key(event: LoginAttempt) -> tuple[Any, ...]:
    """Everything ``Normaliser.normalise`` reads to compute an ``Identity``."""
    return (
        event.tenant, event.account, event.peer_ip, event.forwarded_for, event.device_id,
        event.session_id, event.device_trusted,
    )  # fmt: skip


class IdentityCache:
    """Normalised identities of recent (tenant, account, address, device) combinations.

    Normalising costs keyed BLAKE2b digests, NFKC folding and an address parse; users and
    attackers repeat, so ingest remembers the result. Two generations bound the memory:
    when the young one is full it becomes the old one (hits there move back to young)."""

    def __init__(self, normaliser: Normaliser, entries: int = IDENTITY_CACHE_ENTRIES) -> None:
        self.normaliser = normaliser
        self.entries = entries
        self.young: dict[tuple[Any, ...], Identity] = {}
        self.old: dict[tuple[Any, ...], Identity] = {}

    def row(self, event: LoginAttempt, occurred_ms: int) -> list[Any]:
        """``Attempt.to_row()`` of the normalised event; raises InvalidAttempt."""
        key = identity_key(event)
        identity = self.young.get(key)
        if identity is None:
            identity = self.old.get(key)
            if identity is None:
                row = self.normaliser.normalise(event).to_row()
                self._remember(key, tuple(row[IDENTITY_SLICE]))
                return row
            self._remember(key, identity)
        return [
            event.event_id, occurred_ms, *identity, event.flow, event.outcome == "success",
            event.failure_reason,
        ]  # fmt: skip

    def _remember(self, key: tuple[Any, ...], identity: Identity) -> None:
        if len(self.young) >= self.entries:
            self.old = self.young
            self.young = {}
        self.young[key] = identity


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
    identities: IdentityCache = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "identities", IdentityCache(self.normaliser))

    def process(self, records: Iterable[RawRecord], now_ms: int) -> IngestResult:
        result = IngestResult()
        rows = result.rows
        limit_ms = now_ms + self.max_future_skew_ms
        partitions = self.partitions
        keep_plain = self.keep_plain_account
        max_bytes = self.max_event_bytes
        identity_row = self.identities.row
        for record in records:
            try:
                event = decode_attempt(record.value, max_bytes=max_bytes)
                occurred_ms = datetime_to_ms(event.occurred_at)
                if occurred_ms > limit_ms:
                    raise DecodeError("future_timestamp", "occurred_at is beyond the allowed skew")
                attempt_row = identity_row(event, occurred_ms)
            except (DecodeError, InvalidAttempt) as exc:
                result.dead.append(DeadLetter(record, exc.reason, exc.detail))
                result.reasons[exc.reason] += 1
                continue
            plain = event.account if keep_plain else None
            row = [record.partition, record.offset, event.service, plain, *attempt_row]
            target = account_partition(attempt_row[3], partitions)
            bucket = rows.get(target)
            if bucket is None:
                rows[target] = [row]
            else:
                bucket.append(row)
        result.valid = sum(len(bucket) for bucket in rows.values())
        return result
