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

Tenant topics (``ingest.tenant_topics``, {topic: tenant}): ingest reads each beside the
input topic, so a deployment can confine a login service to its tenants with topic ACLs
(it may write only its tenants' topics). An event on a bound topic must name that topic's
tenant, and a bound tenant's events are taken only from its own topics; anything else is
dead-lettered ``tenant_not_allowed`` (before the tenant cap: it takes no slot). Every input
partition has a slot, the input partition number rows, marks and the stages' replay skip
use: the input topic's partitions are their own numbers, a tenant topic's are offset by a
stable base from its name (``input_slot_base``), so adding or removing a tenant topic
renumbers no other.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from pipeline.contracts.codec import DecodeError, decode_attempt
from pipeline.core.attempt import Normaliser
from pipeline.core.errors import InvalidAttempt
from pipeline.core.policy import Policy
from pipeline.errors import ConfigError
from pipeline.settings import DECODERS, Settings
from pipeline.stream.partitioning import account_partition
from pipeline.wiring import build_normaliser

RECORD_OVERHEAD_BYTES = 4096
"""Allowed beside an event's value in one record (its key, headers and framing) before the
record is ``oversize``."""
OVERSIZE = "oversize"
TENANT_NOT_ALLOWED = "tenant_not_allowed"
SLOT_STRIDE = 1024
"""Input slots per topic: more than any topic's partitions (kafka.partitions <= 1024)."""
SLOT_BASES = 1023


def input_slot_base(topic: str) -> int:
    """The first input slot of tenant topic ``topic``: a multiple of SLOT_STRIDE from 1024
    up, stable for the name (CRC-32), so it never depends on which other topics exist."""
    return (1 + zlib.crc32(topic.encode()) % SLOT_BASES) * SLOT_STRIDE


def input_slots(input_topic: str, tenant_topics: Iterable[str]) -> dict[str, int]:
    """Each input topic's first slot (the input topic's is 0); ConfigError if two tenant
    topics share one, or a tenant topic is the input topic."""
    bases = {input_topic: 0}
    taken = {0: input_topic}
    for topic in sorted(tenant_topics):
        if topic == input_topic:
            raise ConfigError(
                f"ingest.tenant_topics binds {topic}, which is kafka.input_topic; bind a "
                "topic of its own to the tenant (the input topic takes any other tenant)"
            )
        base = input_slot_base(topic)
        if base in taken:
            raise ConfigError(
                f"tenant topics {taken[base]} and {topic} share input slots; rename one of them"
            )
        bases[topic], taken[base] = base, topic
    return bases


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
    decoder: str = "msgspec"
    """``ingest.decoder``: ``msgspec`` (the fast path, then the model) or ``pydantic``."""
    max_future_skew_ms: int = 300_000
    max_past_skew_ms: int = 604_800_000
    keep_plain_account: bool = False
    tenants: frozenset[str] = frozenset()
    max_tenants: int = 1000
    input_topic: str = "auth.login-attempts"
    tenant_topics: Mapping[str, str] = field(default_factory=dict)
    admitted: set[str] = field(default_factory=set, init=False, repr=False, compare=False)
    slot_bases: dict[str, int] = field(init=False, repr=False, compare=False)
    bound_tenants: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise ConfigError(
                f"ingest.decoder is {self.decoder!r}; use one of {', '.join(DECODERS)}"
            )
        object.__setattr__(self, "slot_bases", input_slots(self.input_topic, self.tenant_topics))
        object.__setattr__(self, "bound_tenants", frozenset(self.tenant_topics.values()))

    @property
    def input_topics(self) -> list[str]:
        """Every topic ingest reads: the input topic, then the tenant topics."""
        return [self.input_topic, *sorted(self.tenant_topics)]

    def slot(self, topic: str, partition: int) -> int:
        """The input slot of ``partition`` of ``topic`` (module docstring)."""
        return self.slot_bases.get(topic, 0) + partition

    def input_count(
        self, partitions_for_topic: Callable[[str], Collection[int] | None], default: int
    ) -> int:
        """Input partitions over every input topic (``default`` each while its metadata is
        unknown): the upstreams the account stage waits for marks from."""
        return sum(len(partitions_for_topic(topic) or ()) or default for topic in self.input_topics)

    def check_topic(self, topic: str, tenant: str) -> None:
        """Raise DecodeError ``tenant_not_allowed`` unless ``topic`` may carry ``tenant``."""
        bound = self.tenant_topics.get(topic)
        if bound is not None and tenant != bound:
            raise DecodeError(
                TENANT_NOT_ALLOWED,
                f"topic {topic} is bound to tenant {bound} (ingest.tenant_topics); this event "
                f"names tenant {tenant[:70]!r}",
            )
        if bound is None and tenant in self.bound_tenants:
            raise DecodeError(
                TENANT_NOT_ALLOWED,
                f"tenant {tenant} is bound to its own topics (ingest.tenant_topics); its "
                f"events on {topic} are refused",
            )

    @classmethod
    def from_settings(cls, settings: Settings, policy: Policy) -> Ingest:
        """The ingest step every worker (and the in-memory twin) runs for ``settings``."""
        return cls(
            normaliser=build_normaliser(settings, policy),
            partitions=settings.kafka.partitions,
            max_event_bytes=settings.ingest.max_event_bytes,
            decoder=settings.ingest.decoder,
            max_future_skew_ms=settings.ingest.max_future_skew_ms,
            max_past_skew_ms=settings.ingest.max_past_skew_ms,
            tenants=frozenset(settings.ingest.tenants),
            max_tenants=settings.ingest.max_tenants,
            input_topic=settings.kafka.input_topic,
            tenant_topics=dict(settings.ingest.tenant_topics),
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
        fast = self.decoder == "msgspec"
        normalise = self.normaliser.normalise
        admitted = self.admitted
        max_record = max_bytes + RECORD_OVERHEAD_BYTES
        bases = self.slot_bases
        confined = bool(self.tenant_topics)
        for record in records:
            size = len(record.value or b"") + len(record.key or b"")
            if size > max_record:
                result.dead.append(oversize(record, size, max_record))
                result.reasons[OVERSIZE] += 1
                continue
            try:
                event = decode_attempt(record.value, max_bytes=max_bytes, fast=fast)
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
                if confined:
                    self.check_topic(record.topic, event.tenant)
                # Admitted last: an event dead-lettered for any other reason takes no slot.
                if event.tenant not in admitted:
                    self.admit_tenant(event.tenant)
            except (DecodeError, InvalidAttempt) as exc:
                result.dead.append(DeadLetter(record, exc.reason, exc.detail))
                result.reasons[exc.reason] += 1
                continue
            plain = event.account if keep_plain else None
            slot = record.partition + bases.get(record.topic, 0) if confined else record.partition
            row: list[object] = [slot, record.offset, event.service, plain, *attempt]
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
