"""Changelogs read back from the real broker: the live records of each partition, in order."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from pipeline.kafka_admin import TopicSpec, ensure_topics
from pipeline.stream.envelopes import commit_key
from pipeline.stream.restore import read_changelogs
from pipeline.topics import CHANGELOG_CONFIG

pytestmark = pytest.mark.integration


async def test_each_partition_folds_to_its_last_values_without_deleted_keys(
    kafka_bootstrap: str, topic_name: str
) -> None:
    """Updates keep a key's first position, tombstones drop it, an empty partition is empty."""
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic_name, 3, CHANGELOG_CONFIG)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        writes: list[tuple[int, bytes, bytes | None]] = [
            (0, b"a", b"1"),
            (0, b"b", b"1"),
            (0, b"a", b"2"),
            (0, b"c", b"1"),
            (0, b"b", None),
            (1, b"x", b"9"),
            (1, b"x", None),
            (1, b"x", b"10"),
            (1, b"y", b"1"),
        ]
        for partition, key, value in writes:
            await producer.send_and_wait(topic_name, key=key, value=value, partition=partition)
    finally:
        await producer.stop()
    tps = [TopicPartition(topic_name, p) for p in range(3)]
    # Ten readers: a position reset racing the seek to the start once left a reader at
    # the end, reading nothing.
    for _ in range(10):
        got = {
            tp.partition: list(live.items())
            async for tp, live in read_changelogs(kafka_bootstrap, tps)
        }
        assert got == {0: [(b"a", b"2"), (b"c", b"1")], 1: [(b"x", b"10"), (b"y", b"1")], 2: []}


async def test_a_torn_tail_after_the_last_commit_record_is_not_restored(
    kafka_bootstrap: str, topic_name: str
) -> None:
    """Records after a partition's last commit record (a crash mid-message) are dropped; before it all count."""
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic_name, 2, CHANGELOG_CONFIG)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        writes: list[tuple[int, bytes, bytes | None]] = [
            (0, b"a", b"1"),
            (0, commit_key(0), b"1"),
            (0, b"a", b"2"),
            (0, b"b", b"1"),
            (0, commit_key(0), b"2"),
            (0, b"a", None),  # the torn tail: a message cut before its commit record
            (0, b"c", b"1"),
            (1, b"x", b"1"),  # a partition with no commit record yet: nothing is whole
        ]
        for partition, key, value in writes:
            await producer.send_and_wait(topic_name, key=key, value=value, partition=partition)
    finally:
        await producer.stop()
    tps = [TopicPartition(topic_name, p) for p in range(2)]
    got = {
        tp.partition: list(live.items())
        async for tp, live in read_changelogs(kafka_bootstrap, tps, commit_key=commit_key)
    }
    assert got == {0: [(b"a", b"2"), (commit_key(0), b"2"), (b"b", b"1")], 1: []}
