"""The local Kafka stack: a real broker round-trips messages, compacts, and survives restarts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from pipeline.dev.processes import pid_alive
from pipeline.dev.stack import LocalKafka
from pipeline.kafka_admin import TopicMismatchError, TopicSpec, ensure_topics
from tests.plugins.kafka import free_port_pair, shared_kafka_libs, unique_topic
from tests.plugins.waiting import wait_until_async

pytestmark = pytest.mark.integration

READ_TIMEOUT_S = 30.0
COMPACTION_TIMEOUT_S = 90.0


@asynccontextmanager
async def producer(bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    client = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await client.start()
    try:
        yield client
    finally:
        await client.stop()


async def read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record of partition 0, from the beginning to the end."""
    partition = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        end_offset = (await consumer.end_offsets([partition]))[partition]
        records: list[tuple[int, bytes | None, bytes | None]] = []
        async with asyncio.timeout(READ_TIMEOUT_S):
            while await consumer.position(partition) < end_offset:
                batches = await consumer.getmany(partition, timeout_ms=500)
                records.extend((r.offset, r.key, r.value) for r in batches.get(partition, []))
        return records
    finally:
        await consumer.stop()


async def test_produce_consume_100_messages(kafka_bootstrap: str, topic_name: str) -> None:
    """100 messages produced to a 1-partition topic come back in order with exact keys/values."""
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic_name, partitions=1)])
    expected = [(i, f"key-{i}".encode(), f"value-{i}".encode()) for i in range(100)]
    async with producer(kafka_bootstrap) as client:
        for _, key, value in expected:
            await client.send(topic_name, key=key, value=value)
        await client.flush()

    assert await read_all(kafka_bootstrap, topic_name) == expected


async def test_ensure_topics_is_idempotent_and_checks_partitions(kafka_bootstrap: str) -> None:
    """ensure_topics twice is a no-op; a spec with more partitions than the topic fails."""
    name = unique_topic("ensure")
    spec = TopicSpec(name, partitions=3, configs={"retention.ms": "3600000"})
    await ensure_topics(kafka_bootstrap, [spec])
    await ensure_topics(kafka_bootstrap, [spec])
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([name])
    finally:
        await admin.close()
    assert len(described["partitions"]) == 3

    with pytest.raises(TopicMismatchError, match=f"topic '{name}' exists with 3 partitions but 5"):
        await ensure_topics(kafka_bootstrap, [TopicSpec(name, partitions=5)])


async def test_compaction_drops_overwritten_value(kafka_bootstrap: str, topic_name: str) -> None:
    """On a compacted topic the cleaner removes k=v1 once k=v2 is in a closed segment."""
    configs = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "100",
        "min.compaction.lag.ms": "0",
    }
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic_name, partitions=1, configs=configs)])
    unique_keys = [f"unique-{i}".encode() for i in range(50)]

    async with producer(kafka_bootstrap) as client:
        await client.send_and_wait(topic_name, key=b"k", value=b"v1")
        for key in unique_keys:
            await client.send_and_wait(topic_name, key=key, value=b"x")
        await client.send_and_wait(topic_name, key=b"k", value=b"v2")

        async def compacted() -> bool:
            # Segments roll only on append: filler closes the segment holding v2.
            await client.send_and_wait(topic_name, key=b"filler", value=b"f")
            records = await read_all(kafka_bootstrap, topic_name)
            return [value for _, key, value in records if key == b"k"] == [b"v2"]

        await wait_until_async(
            compacted,
            COMPACTION_TIMEOUT_S,
            interval_s=0.5,
            description="the cleaner to drop k=v1",
        )

    records = await read_all(kafka_bootstrap, topic_name)
    assert [value for _, key, value in records if key == b"k"] == [b"v2"]
    assert [key for _, key, _ in records if key in unique_keys] == unique_keys


def run_cli(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


async def test_stack_cli_up_twice_status_down_keeps_data(tmp_path: Path) -> None:
    """stack up twice is harmless, status reports it, down leaves no process, data survives;
    the first up writes a random digest key (0600) into the state dir, later ups keep it."""
    port, controller_port = free_port_pair()  # the CLI puts the controller on port + 1
    state_dir = tmp_path / "state"
    kafka_dir = state_dir / "kafka"
    kafka_dir.mkdir(parents=True)
    (kafka_dir / "libs").symlink_to(shared_kafka_libs(), target_is_directory=True)
    # A stale pidfile naming a live process that is not a broker (this pytest) is ignored.
    (kafka_dir / "broker.pid").write_text(f"{os.getpid()}\n")
    env = {
        **os.environ,
        "AUTHPIPE_STATE_DIR": str(state_dir),
        "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
        "AUTHPIPE_LOG_FORMAT": "json",
    }
    env.pop("AUTHPIPE_CONFIG", None)
    env.pop("AUTHPIPE_IDENTITY_DIGEST_KEY", None)
    bootstrap = f"127.0.0.1:{port}"
    cleanup = LocalKafka(kafka_dir, port, controller_port)
    try:
        first = run_cli(tmp_path, env, "stack", "up")
        assert first.returncode == 0, first.stderr + first.stdout
        key_file = state_dir / "digest.key"
        key = key_file.read_text()
        assert len(key.strip()) >= 32
        assert key_file.stat().st_mode & 0o777 == 0o600
        assert (
            f"digest key: {key_file} (identity.digest_key; give gateways the same key)"
            in first.stdout
        )
        pid = int((kafka_dir / "broker.pid").read_text())
        assert pid != os.getpid()
        assert "kafka: running" in first.stdout.splitlines()

        second = run_cli(tmp_path, env, "stack", "up")
        assert second.returncode == 0, second.stderr + second.stdout
        assert '"event": "kafka_already_running"' in second.stderr  # log events: stderr
        assert int((kafka_dir / "broker.pid").read_text()) == pid
        assert key_file.read_text() == key

        status = run_cli(tmp_path, env, "stack", "status")
        assert status.returncode == 0, status.stderr + status.stdout
        assert status.stdout.splitlines()[-5:] == [
            "kafka: running",
            f"pid: {pid}",
            f"bootstrap: {bootstrap}",
            f"data dir: {kafka_dir / 'data'}",
            f"log: {kafka_dir / 'broker.log'}",
        ]

        topic = unique_topic("restart")
        await ensure_topics(bootstrap, [TopicSpec(topic, partitions=1)])
        async with producer(bootstrap) as client:
            await client.send_and_wait(topic, key=b"kept", value=b"across-restart")

        down = run_cli(tmp_path, env, "stack", "down")
        assert down.returncode == 0, down.stderr + down.stdout
        assert not pid_alive(pid)
        assert not (kafka_dir / "broker.pid").exists()
        stopped = run_cli(tmp_path, env, "stack", "status")
        assert stopped.returncode == 3
        assert "kafka: stopped" in stopped.stdout.splitlines()

        again = run_cli(tmp_path, env, "stack", "up")
        assert again.returncode == 0, again.stderr + again.stdout
        assert int((kafka_dir / "broker.pid").read_text()) != pid
        assert await read_all(bootstrap, topic) == [(0, b"kept", b"across-restart")]
    finally:
        cleanup.down()
    assert cleanup.running_pid() is None
