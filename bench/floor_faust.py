"""``floor_faust``: the floor (``bench.floor``) on the worker's faust app.

Run as ``python -m bench.floor_faust BOOTSTRAP INPUT EVENTS TRAFFIC_JSON [batched]``
(``batched``: ``bench.floor.Shell``'s record-batch outputs). The worker's
shape with the stages' work taken out: its faust app (``new_app``: the same producer,
consumer, commit and buffer settings), its topics (``prepare_topics``), three agents on
the three stage topics iterating ``stream.events()`` as the worker's do, ingest as a faust
task with its own aiokafka consumer sending envelopes through faust's topics, outputs
through faust's ``Topic.send`` and changelogs as record batches on faust's producer
(``pipeline.stream.emit``). Started as ``authpipe worker`` starts it (``run_worker``:
``tune_gc``, ``tune_allocator``, faust's ``Worker`` with the same options, the library
logging quieted).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import faust
import orjson
from aiokafka import AIOKafkaConsumer

from bench.floor import Clock, Shell, load_traffic, run_ingest, wait_done
from bench.floor_aiokafka import floor_settings, role_topics
from bench.floor_model import Model, Record
from bench.floor_traffic import Traffic
from bench.stream import free_port
from pipeline.logs import stdlib_logging_config
from pipeline.runtime import tune_allocator, tune_gc
from pipeline.settings import Settings
from pipeline.stream.app import Worker
from pipeline.stream.emit import send_records
from pipeline.stream.faust_app import RAW, new_app
from pipeline.stream.ingest_loop import ingest_consumer_options
from pipeline.stream.worker import prepare_topics
from pipeline.topics import Topics

STAGE_ROLES = ("by_account", "by_source", "shares")


def build(settings: Settings, events: int, traffic: Traffic, batched: bool) -> faust.App:
    """The floor's faust app: agents, ingest and the end of the run as tasks."""
    kafka, worker = settings.kafka, settings.worker
    app = new_app(settings)
    topic_of = role_topics(Topics.from_settings(kafka))
    topics = {
        role: app.topic(topic_of[role], partitions=kafka.partitions, **RAW)
        for role in (*STAGE_ROLES, "decisions", "alerts", "notices", "audit")
    }

    async def send(role: str, key: bytes | None, value: bytes | None, partition: int | None) -> Any:
        return await topics[role].send(key=key, value=value, partition=partition)

    async def write(role: str, partition: int, records: list[Record]) -> list[Awaitable[Any]]:
        producer: Any = app.producer  # faust's aiokafka producer, which faust flushes
        return await send_records(producer._ensure_producer(), topic_of[role], partition, records)

    model = Model(traffic, kafka.partitions)
    shell = Shell(model, send, write, worker.forward_linger_ms, batched)
    clock = Clock()

    for role in STAGE_ROLES:

        async def agent(stream: Any, role: str = role) -> None:
            async for event in stream.events():
                message = event.message
                await shell.apply(role, message.partition, message.value)

        app.agent(topics[role], name=f"floor-{role}")(agent)

    async def ingest() -> None:
        await _assigned(app, len(STAGE_ROLES) * kafka.partitions)
        consumer = _ingest_consumer(settings)
        await consumer.start()
        try:
            await run_ingest(consumer, shell, clock, worker, events)
        finally:
            await consumer.stop()

    async def finish() -> None:
        await wait_done(shell, events)
        result = clock.result(f"floor_faust{'_batched' * batched}", events, shell)
        sys.stdout.write("\n" + orjson.dumps(result).decode() + "\n")
        sys.stdout.flush()
        os._exit(0)

    # faust calls a task function of one parameter with the app: ``self`` is unused
    app.task(Worker._quiet_library_logging)
    app.task(ingest)
    app.task(finish)
    return app


async def _assigned(app: faust.App, partitions: int) -> None:
    """Until faust's consumer holds every stage partition (B1's clock starts at ready)."""
    while app.rebalancing or len(app.consumer.assignment()) < partitions:
        await asyncio.sleep(0.05)


def _ingest_consumer(settings: Settings) -> AIOKafkaConsumer:
    """Ingest's consumer, configured as ``IngestLoop.run`` configures it."""
    consumer = AIOKafkaConsumer(**ingest_consumer_options(settings))
    consumer.subscribe([settings.kafka.input_topic])
    return consumer


def main(argv: list[str] | None = None) -> int:
    args = argv or sys.argv[1:]
    bootstrap, topic, events, traffic = args[:4]
    state_dir = Path(tempfile.mkdtemp(prefix="authpipe-floor-faust-"))
    settings = floor_settings(bootstrap, topic, "floor-faust", state_dir)
    settings = settings.model_copy(
        update={"worker": settings.worker.model_copy(update={"web_port": free_port()})}
    )
    tune_gc()
    tune_allocator()
    asyncio.run(prepare_topics(settings))
    (state_dir / "faust").mkdir(parents=True, exist_ok=True)
    app = build(settings, int(events), load_traffic(traffic), args[4:5] == ["batched"])
    faust_worker = faust.Worker(
        app,
        loglevel="WARNING",
        quiet=True,
        redirect_stdouts=False,
        logging_config=stdlib_logging_config(settings.log.level, settings.log.format),
    )
    faust_worker.spinner = None
    faust_worker.execute_from_commandline()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
