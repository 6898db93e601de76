"""Decompression bombs (issue 26 item 4): inside a bounded task every codec refuses a batch
that inflates past ``max_batch_bytes`` or holds a record past the record bound, before it
is in memory; ordinary batches inflate exactly as aiokafka's own codecs do; outside a
bounded task aiokafka's codecs run unchanged; ingest does not copy an oversize record."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable

import pytest
from aiokafka import codec
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.stream import inflation
from pipeline.stream.ingest import Ingest, Record
from pipeline.stream.undecodable import Salvage
from pipeline.wiring import build_normaliser
from tests.unit.test_edge_support import SETTINGS
from tests.unit.test_stream_tenant_cap import NOW_MS, _record

MAX_BATCH = 1 << 20
MAX_EVENT = 16384
ENCODE: dict[str, Callable[[bytes], bytes]] = {
    "gzip": codec.gzip_encode,
    "snappy": codec.snappy_encode,
    "lz4": codec.lz4_encode,
    "zstd": codec.zstd_encode,
}
DECODE = {"gzip": inflation._gzip, "snappy": inflation._snappy, "lz4": inflation._lz4}
DECODE["zstd"] = inflation._zstd


def records(values: list[bytes]) -> bytes:
    """The records part of an uncompressed v2 batch holding ``values`` (what a codec inflates to)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30,
    )  # fmt: skip
    for i, value in enumerate(values):
        builder.append(i, timestamp=None, key=b"k", value=value, headers=[])
    return bytes(builder.build())[61:]  # the v2 batch header is 61 bytes


def bounded(fn: Callable[[], object]) -> object:
    """Run ``fn`` in a fresh context where ingest's bounds are set."""

    def run() -> object:
        inflation.bound_decompression(MAX_BATCH, MAX_EVENT)
        return fn()

    return contextvars.copy_context().run(run)


@pytest.mark.parametrize("name", sorted(ENCODE))
def test_an_ordinary_batch_inflates_as_aiokafka_inflates_it(name: str) -> None:
    """500 records of 300 bytes: the bounded codec's output is aiokafka's, byte for byte."""
    data = records([b"x" * 300] * 500)
    payload = ENCODE[name](data)
    assert (
        bounded(lambda: DECODE[name](payload))
        == data
        == bytes(inflation._ORIGINAL[f"{name}_decode"](payload))
    )


@pytest.mark.parametrize("name", sorted(ENCODE))
def test_a_batch_inflating_past_max_batch_bytes_is_oversize(name: str) -> None:
    """Small records adding up to 2 MiB (bound 1 MiB) are refused with OversizeBatch."""
    payload = ENCODE[name](records([b"a" * 10_000] * 210))
    with pytest.raises(inflation.OversizeBatch, match="max_batch_bytes=1048576"):
        bounded(lambda: DECODE[name](payload))


@pytest.mark.parametrize("name", sorted(ENCODE))
def test_a_batch_holding_a_record_past_the_record_bound_is_oversize(name: str) -> None:
    """One record of 100,000 bytes among small ones (bound 16,384 + 4,096) is refused."""
    payload = ENCODE[name](records([b"s" * 100, b"b" * 100_000, b"s" * 100]))
    with pytest.raises(inflation.OversizeBatch, match="over the 20480-byte bound"):
        bounded(lambda: DECODE[name](payload))


def test_outside_the_bounded_task_aiokafkas_codecs_run_unchanged() -> None:
    """In another context (the worker's changelog readers) a 2 MiB batch inflates in full."""
    inflation.install()
    data = records([b"a" * 10_000] * 210)
    assert inflation._gzip(codec.gzip_encode(data)) == data


def test_a_corrupt_payload_is_a_corrupt_record_not_a_crash() -> None:
    """Garbage under gzip or zstd is CorruptRecordException (undecodable_batch), no other error."""
    for decode in (inflation._gzip, inflation._zstd):
        with pytest.raises(CorruptRecordException) as caught:
            bounded(lambda decode=decode: decode(b"\x1f\x8b not really gzip or zstd"))
        assert not isinstance(caught.value, inflation.OversizeBatch)


def test_the_bound_is_per_task() -> None:
    """A task that set the bound and one that did not inflate the same payload differently."""
    payload = codec.zstd_encode(records([b"a" * 10_000] * 210))

    async def bounded_task() -> str:
        inflation.bound_decompression(MAX_BATCH, MAX_EVENT)
        try:
            inflation._zstd(payload)
        except inflation.OversizeBatch:
            return "refused"
        return "inflated"

    async def plain_task() -> str:
        inflation._zstd(payload)
        return "inflated"

    async def both() -> list[str]:
        return list(await asyncio.gather(bounded_task(), plain_task()))

    assert asyncio.run(both()) == ["refused", "inflated"]


def test_a_refused_batch_is_one_oversize_dead_letter_for_its_offsets() -> None:
    """The salvaged batch's dead letter has reason oversize, its offset range, no bytes."""
    from aiokafka.structs import TopicPartition

    found = Salvage(TopicPartition("auth.login-attempts", 3), 10, 18, "zstd")
    dead = found.dead_letter(inflation.OversizeBatch("the batch inflates to more than …"))
    headers = dict(dead.headers())
    assert (dead.reason, dead.offsets, dead.record.key, dead.record.value) == (
        "oversize",
        8,
        None,
        b"",
    )
    assert (headers["source_offset"], headers["source_offset_last"]) == (b"10", b"17")


def test_ingest_dead_letters_an_oversize_record_without_copying_it() -> None:
    """A 1 MB uncompressed value is dead-lettered oversize with no key and an empty value;
    a 17 KB one is too_large with its bytes; the valid event after both is counted."""
    ingest = Ingest(normaliser=build_normaliser(SETTINGS), partitions=4)
    huge = Record("auth.login-attempts", 0, 0, b"key", b"x" * 1_000_000)
    large = Record("auth.login-attempts", 0, 1, b"key", b"y" * 17_000)
    result = ingest.process([huge, large, _record(2)], NOW_MS)
    assert [
        (d.record.offset, d.reason, d.record.key, len(d.record.value or b"")) for d in result.dead
    ] == [
        (0, "oversize", None, 0),
        (1, "too_large", b"key", 17_000),
    ]
    assert (result.valid, dict(result.reasons)) == (1, {"oversize": 1, "too_large": 1})


def test_the_input_topic_is_created_with_a_1_mib_batch_bound() -> None:
    """The input topic's max.message.bytes is written out (1 MiB), whatever the broker's
    default; the other topics keep the broker's."""
    from pipeline.settings import KafkaSettings
    from pipeline.topics import Topics

    specs = {s.name: s.configs for s in Topics.from_settings(KafkaSettings()).specs(4)}
    assert specs["auth.login-attempts"]["max.message.bytes"] == "1048576"
    assert [name for name, c in specs.items() if "max.message.bytes" in c] == [
        "auth.login-attempts"
    ]
