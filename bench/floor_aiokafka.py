"""``floor_aiokafka``: the floor (``bench.floor``) on plain aiokafka clients, no faust.

Run as ``python -m bench.floor_aiokafka BOOTSTRAP INPUT EVENTS TRAFFIC_JSON [batched]``
(``batched``: ``bench.floor.Shell``'s record-batch outputs). The same
topics as a worker (``pipeline.stream.worker.prepare_topics``), one producer with the
worker's settings (acks=all and idempotence, ``PRODUCER_GUARANTEES``; faust's producer
defaults, which the worker keeps: linger 0, 16 kB batches, 1 MB requests), ingest's
consumer as the worker's, and one consumer of the three stage topics (faust's, for the
worker), fetching within ``worker.batch_max_wait_ms`` and committing its positions every
second (the worker's ``broker_commit_interval``). The process is set up as the worker's
(``tune_gc``, ``tune_allocator``). ``BENCH_FLOOR_PRODUCER`` (JSON) overrides producer
options for an A/B run.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench.floor import Clock, Shell, load_traffic, run_ingest, wait_done
from bench.floor_model import Model, Record
from bench.floor_traffic import Traffic
from pipeline.kafka_client import client_kwargs, producer_kwargs
from pipeline.runtime import tune_allocator, tune_gc
from pipeline.settings import KafkaSettings, Settings
from pipeline.stream.emit import send_records
from pipeline.stream.ingest_loop import ingest_consumer_options
from pipeline.stream.worker import prepare_topics
from pipeline.topics import Topics

# faust's producer defaults (``producer_linger``, ``producer_max_batch_size``,
# ``producer_max_request_size``), which the worker's faust app keeps
PRODUCER_OPTIONS = {"linger_ms": 0, "max_batch_size": 16_384, "max_request_size": 1_000_000}
COMMIT_INTERVAL_S = 1.0


def floor_settings(bootstrap: str, input_topic: str, label: str, state_dir: Path) -> Settings:
    """A worker's settings with a fresh app id and output topics, reading ``input_topic``."""
    tag = f"{label}-{uuid.uuid4().hex[:8]}"
    kafka = KafkaSettings(
        bootstrap_servers=bootstrap,
        app_id=tag,
        input_topic=input_topic,
        decisions_topic=f"{tag}-decisions",
        alerts_topic=f"{tag}-alerts",
        notices_topic=f"{tag}-notices",
        dlq_topic=f"{tag}-dlq",
        audit_topic=f"{tag}-audit",
    )
    return Settings(kafka=kafka, state_dir=state_dir)


def role_topics(topics: Topics) -> dict[str, str]:
    """The topic of each role the floor's shell sends to, changelogs by stage."""
    return {
        "by_account": topics.by_account,
        "by_source": topics.by_source,
        "shares": topics.shares,
        "decisions": topics.decisions,
        "alerts": topics.alerts,
        "notices": topics.notices,
        "audit": topics.audit,
        **{
            f"{stage}_changelog": topics.changelog(f"{stage}-state")
            for stage in ("account", "source", "rollup")
        },
    }


async def run(
    bootstrap: str, input_topic: str, events: int, traffic: Traffic, batched: bool
) -> dict[str, Any]:
    settings = floor_settings(bootstrap, input_topic, "floor-aiokafka", Path(tempfile.mkdtemp()))
    kafka, worker = settings.kafka, settings.worker
    await prepare_topics(settings)
    topics = Topics.from_settings(kafka)
    topic_of = role_topics(topics)
    role_of = {topics.by_account: "by_account", topics.by_source: "by_source"}
    role_of[topics.shares] = "shares"
    options = {**PRODUCER_OPTIONS, **orjson.loads(os.environ.get("BENCH_FLOOR_PRODUCER", "{}"))}
    producer = AIOKafkaProducer(**producer_kwargs(kafka), **options)

    async def send(role: str, key: bytes | None, value: bytes | None, partition: int | None) -> Any:
        return await producer.send(topic_of[role], value, key=key, partition=partition)

    async def write(role: str, partition: int, records: list[Record]) -> list[Awaitable[Any]]:
        return await send_records(producer, topic_of[role], partition, records)

    model = Model(traffic, kafka.partitions)
    shell = Shell(model, send, write, worker.forward_linger_ms, batched)
    fetch = {"enable_auto_commit": False, "auto_offset_reset": "earliest"}
    fetch |= {"max_partition_fetch_bytes": 4 << 20, "fetch_max_wait_ms": worker.batch_max_wait_ms}
    ingest = AIOKafkaConsumer(input_topic, **ingest_consumer_options(settings))
    stages = AIOKafkaConsumer(*role_of, **client_kwargs(kafka), group_id=kafka.app_id, **fetch)
    clock = Clock()

    async def apply_stages() -> None:
        committed_s = time.monotonic()
        while True:
            batch = await stages.getmany(timeout_ms=worker.batch_max_wait_ms)
            for tp, messages in batch.items():
                role = role_of[tp.topic]
                for message in messages:
                    await shell.apply(role, tp.partition, message.value)
            if time.monotonic() - committed_s >= COMMIT_INTERVAL_S:
                await stages.commit()
                committed_s = time.monotonic()

    async def ingest_when_assigned() -> None:
        # B1's clock starts at the worker's ready: once the stages hold their partitions
        while len(stages.assignment()) < len(role_of) * kafka.partitions:
            await asyncio.sleep(0.05)
        await run_ingest(ingest, shell, clock, worker, events)

    await producer.start()
    await ingest.start()
    await stages.start()
    tasks = [
        asyncio.ensure_future(ingest_when_assigned()),
        asyncio.ensure_future(apply_stages()),
    ]
    try:
        done = asyncio.ensure_future(wait_done(shell, events))
        running = {done, *tasks}
        while not done.done():
            finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                task.result()  # a failed task fails the run
        result = clock.result(f"floor_aiokafka{'_batched' * batched}", events, shell)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await stages.stop()
        await ingest.stop()
        await producer.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    args = argv or sys.argv[1:]
    bootstrap, topic, events, traffic = args[:4]
    batched = args[4:5] == ["batched"]
    tune_gc()
    tune_allocator()
    result = asyncio.run(run(bootstrap, topic, int(events), load_traffic(traffic), batched))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
