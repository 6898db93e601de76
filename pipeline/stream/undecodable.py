"""A record batch the input consumer cannot decode becomes a dead letter, never a crash.

aiokafka raises from ``getmany`` when a batch it fetched cannot be decoded (a compression
codec whose library is missing, an unknown codec, a CRC mismatch), and it raises again on
every retry: the batch stays in the topic, so a worker that let the error through would
crash-loop for the topic's whole retention. The error says neither which partition nor
which offsets, and it drops the records the same call had already drained (their
positions already moved on).

``salvage`` reads all of that back from the exception's traceback, which runs through
aiokafka's fetcher: the batch being unpacked (partition, first offset, next offset,
codec), the records of that partition decoded before it, and the records of other
partitions drained earlier in the same call. The ingest loop keeps the records, seeks
past the batch and dead-letters its offset range with reason ``undecodable_batch``, or
``oversize`` for a batch ``pipeline.stream.inflation`` refused to inflate (a decompression
bomb).
aiokafka is pinned below 0.15; ``tests/integration/test_compression.py`` runs this path
against the real broker, so a change of the fetcher's internals fails a test, not a worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiokafka.consumer.fetcher import Fetcher, FetchResult, PartitionRecords
from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from aiokafka.structs import TopicPartition

from pipeline.stream import inflation
from pipeline.stream.ingest import DeadLetter, Record

REASON = "undecodable_batch"
# What aiokafka raises for a batch it fetched but cannot decode.
DECODE_ERRORS = (UnsupportedCodecError, CorruptRecordException)
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

_UNPACK = PartitionRecords._unpack_records.__code__
_GETALL = FetchResult.getall.__code__
_FETCHED = Fetcher.fetched_records.__code__


@dataclass
class Salvage:
    """What a failed ``getmany`` leaves: the undecodable batch and the records it drained."""

    tp: TopicPartition
    first_offset: int
    next_offset: int
    codec: str
    records: dict[TopicPartition, list[Any]] = field(default_factory=dict)

    def dead_letter(self, error: BaseException) -> DeadLetter:
        """The batch's dead letter: an empty value (the bytes stay in the topic until retention);
        headers name the partition, the offset range and the codec."""
        message = str(error)
        if type(error).__name__ not in message:
            message = f"{type(error).__name__}: {message}"
        detail = (
            f"offsets {self.first_offset}..{self.next_offset - 1} (codec {self.codec}): {message}"
        )
        record = Record(self.tp.topic, self.tp.partition, self.first_offset, None, b"")
        reason = inflation.REASON if isinstance(error, inflation.OversizeBatch) else REASON
        return DeadLetter(record, reason, detail, last_offset=self.next_offset - 1)


def _frames(tb: TracebackType | None) -> list[Any]:
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def salvage(error: BaseException) -> Salvage | None:
    """The undecodable batch and the drained records, or None if ``error`` was not raised
    while aiokafka unpacked a fetched batch."""
    found: Salvage | None = None
    drained: dict[TopicPartition, list[Any]] = {}
    decoded: list[Any] = []
    for frame in _frames(error.__traceback__):
        code, local = frame.f_code, frame.f_locals
        if code is _FETCHED:
            drained = {tp: list(records) for tp, records in (local.get("drained") or {}).items()}
        elif code is _GETALL:
            decoded = list(local.get("ret_list") or [])
        elif code is _UNPACK and "next_batch" in local:
            batch = local["next_batch"]
            codec = CODECS.get(int(getattr(batch, "compression_type", -1)), "unknown")
            found = Salvage(local["tp"], int(batch.base_offset), int(batch.next_offset), codec)
    if found is None:
        return None
    if decoded:
        drained.setdefault(found.tp, []).extend(decoded)
    found.records = drained
    return found
