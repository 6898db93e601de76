"""The ceiling: a plain aiokafka ``getmany`` + orjson consumer that does nothing else.

Run as ``python -m bench.peers.ceiling BOOTSTRAP TOPIC EVENTS``; reads the topic from
the start (a fresh consumer group) until EVENTS values are decoded. The rate is counted
from the first batch received to the last value decoded (connection and group join are
not timed). The last line printed is JSON.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

BATCH_MAX_EVENTS = 5000


async def consume(bootstrap: str, topic: str, events: int) -> dict[str, Any]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"ceiling-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_wait_ms=50,
    )
    await consumer.start()
    decoded = 0
    first_s = cpu_first_s = 0.0
    try:
        while decoded < events:
            batch = await consumer.getmany(timeout_ms=100, max_records=BATCH_MAX_EVENTS)
            if batch and not decoded:
                first_s, cpu_first_s = time.perf_counter(), time.process_time()
            for messages in batch.values():
                for message in messages:
                    orjson.loads(message.value)
                    decoded += 1
    finally:
        seconds = time.perf_counter() - first_s
        cpu_s = time.process_time() - cpu_first_s
        await consumer.stop()
    return {
        "peer": "ceiling",
        "events": decoded,
        "seconds": round(seconds, 3),
        "events_per_s": round(decoded / seconds),
        "cpu_s": round(cpu_s, 2),
        "events_per_cpu_s": round(decoded / max(cpu_s, 1e-9)),
    }


def main(argv: list[str] | None = None) -> int:
    bootstrap, topic, events = (argv or sys.argv[1:])[:3]
    result = asyncio.run(consume(bootstrap, topic, int(events)))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
