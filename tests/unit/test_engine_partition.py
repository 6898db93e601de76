"""The engine's placement of decision keys (``authpipe_engine.partition_slots``,
engine/src/partition.rs) against aiokafka's own partitioner, which it replaces on the
worker's hot path: the same partition for every key, so compaction and the edge see what
they saw before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner, murmur2
from aiokafka.structs import PartitionMetadata
from hypothesis import given
from hypothesis import strategies as st

from pipeline.stream import emit

try:
    import authpipe_engine as engine
except ImportError as exc:  # never skipped: an unbuilt engine is a failure that says why
    raise ImportError("authpipe_engine is not installed: run scripts/build-engine") from exc

TOPIC = "auth.throttle-decisions"


@given(st.lists(st.binary(max_size=200), max_size=40), st.integers(1, 1_000))
def test_slots_are_kafkas_murmur2_over_the_partition_count(keys: list[bytes], count: int) -> None:
    """Any keys (empty, short tails of 1-3 bytes, long), any partition count: the index
    aiokafka's DefaultPartitioner computes."""
    assert engine.partition_slots(keys, count) == [(murmur2(k) & 0x7FFFFFFF) % count for k in keys]


def test_the_java_clients_vectors() -> None:
    """Kafka's own murmur2 test values, over 2**31 partitions, give the positive hash."""
    keys = [b"21", b"foobar", b"a-little-bit-long-string", b"abc"]
    assert engine.partition_slots(keys, 2**31) == [
        -973932308 & 0x7FFFFFFF,
        -790332482 & 0x7FFFFFFF,
        -985981536 & 0x7FFFFFFF,
        479470107 & 0x7FFFFFFF,
    ]


def test_no_partitions_is_a_clear_error() -> None:
    """A topic whose metadata names no partition is refused, not divided by."""
    with pytest.raises(ValueError, match="partitions must be at least 1"):
        engine.partition_slots([b"k"], 0)


@asynccontextmanager
async def producer_of(partitions: list[int]) -> AsyncIterator[AIOKafkaProducer]:
    """An aiokafka producer (never connected) whose metadata lists ``partitions`` of
    TOPIC, in that order."""
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")
    producer._metadata._partitions[TOPIC] = {
        p: PartitionMetadata(TOPIC, p, 0, [0], [0], None) for p in partitions
    }
    try:
        yield producer
    finally:
        await producer.stop()


@pytest.mark.parametrize("partitions", [[0], list(range(8)), [5, 1, 3, 0, 2, 4], list(range(48))])
async def test_place_keys_is_the_producers_own_partition(partitions: list[int]) -> None:
    """``emit.place_keys`` with the engine gives what the producer's ``_partition`` gives,
    for decision keys of every kind and odd ones."""
    keys = [f"familiar|default|{i:032x}|203.0.113.{i % 256}|-".encode() for i in range(500)] + [
        b"",
        b"x",
        b"account|t|a|-|-",
        "tenant|ü|-|-|-".encode(),
    ]
    async with producer_of(partitions) as producer:
        expected = [producer._partition(TOPIC, None, key, None, key, None) for key in keys]
        assert emit._SLOTS is not None
        assert emit.place_keys(producer, TOPIC, keys) == expected
    assert set(expected) == set(partitions)  # the 500 keys reach every partition


async def test_another_partitioner_is_left_to_the_producer() -> None:
    """A producer configured with another partitioner places keys itself."""
    async with producer_of(list(range(8))) as producer:
        producer._partitioner = lambda key, all_partitions, available: all_partitions[-1]
        assert not isinstance(producer._partitioner, DefaultPartitioner)
        assert emit.place_keys(producer, TOPIC, [b"a", b"b"]) == [7, 7]


async def test_without_the_engine_the_producer_places_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AUTHPIPE_ENGINE=python`` (no ``partition_slots``): the producer's own partitioner,
    with the same answer."""
    keys = [f"familiar|default|{i:032x}|-|dev{i}".encode() for i in range(100)]
    async with producer_of(list(range(8))) as producer:
        with_engine = emit.place_keys(producer, TOPIC, keys)
        monkeypatch.setattr(emit, "_SLOTS", None)
        assert emit.place_keys(producer, TOPIC, keys) == with_engine
