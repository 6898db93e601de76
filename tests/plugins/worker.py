"""Run the real ``authpipe worker`` as a subprocess, and read/write topics from tests.

Each test gets its own app id and topic names (unique per test), a free web port and its
own state dir, so workers of different tests never share a consumer group or a topic.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.plugins.kafka import free_ports, unique_topic
from tests.plugins.waiting import wait_until

READY_TIMEOUT_S = 90.0


@dataclass
class StreamNames:
    """The app id and every topic name of one test's pipeline, as AUTHPIPE_* env vars."""

    app_id: str = field(default_factory=lambda: unique_topic("app"))
    input: str = field(default_factory=lambda: unique_topic("in"))
    decisions: str = field(default_factory=lambda: unique_topic("decisions"))
    alerts: str = field(default_factory=lambda: unique_topic("alerts"))
    notices: str = field(default_factory=lambda: unique_topic("notices"))
    dlq: str = field(default_factory=lambda: unique_topic("dlq"))
    audit: str = field(default_factory=lambda: unique_topic("audit"))

    def env(self) -> dict[str, str]:
        return {
            "AUTHPIPE_KAFKA_APP_ID": self.app_id,
            "AUTHPIPE_KAFKA_INPUT_TOPIC": self.input,
            "AUTHPIPE_KAFKA_DECISIONS_TOPIC": self.decisions,
            "AUTHPIPE_KAFKA_ALERTS_TOPIC": self.alerts,
            "AUTHPIPE_KAFKA_NOTICES_TOPIC": self.notices,
            "AUTHPIPE_KAFKA_DLQ_TOPIC": self.dlq,
            "AUTHPIPE_KAFKA_AUDIT_TOPIC": self.audit,
        }


class WorkerProcess:
    """One ``authpipe worker`` subprocess; ``kill()`` is SIGKILL, ``stop()`` SIGTERM."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        (self.port,) = free_ports(1)
        self.env = {**env, "AUTHPIPE_WORKER_WEB_PORT": str(self.port)}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "worker"],
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited with {self.proc.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> WorkerProcess:
        wait_until(self.ready, timeout_s, interval_s=0.25, description="worker /readyz")
        return self

    def metric(self, name: str) -> float:
        """Sum of a Prometheus metric's samples (all label sets)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                head = line.split(" ")[0]
                if head == name or head.startswith(name + "{"):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def event(
    i: int,
    t: datetime,
    account: str,
    ip: str,
    *,
    ok: bool = False,
    run: str = "r",
    device: str | None = None,
    trusted: bool = False,
    reason: str = "bad_password",
) -> bytes:
    """One login attempt's JSON (``{run}-{i}`` its id): a failure with ``reason``, or a
    success with ``ok``; ``device`` sets the device cookie and whether it is trusted."""
    body: dict[str, Any] = {
        "event_id": f"{run}-{i}",
        "occurred_at": t.isoformat(),
        "service": "web",
        "account": account,
        "peer_ip": ip,
        "outcome": "success" if ok else "failure",
    }
    if not ok:
        body["failure_reason"] = reason
    if device:
        body["device_id"], body["device_trusted"] = device, trusted
    return orjson.dumps(body)


@pytest.fixture
def stream_names() -> StreamNames:
    return StreamNames()


@pytest.fixture
def worker_env(kafka_bootstrap: str, stream_names: StreamNames, tmp_path: Path) -> dict[str, str]:
    """Environment of a worker on the session broker, with this test's names."""
    return {
        **stream_names.env(),
        "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "AUTHPIPE_KAFKA_PARTITIONS": "4",
        "AUTHPIPE_STATE_DIR": str(tmp_path / "state"),
        "AUTHPIPE_LOG_FORMAT": "json",
        "AUTHPIPE_LOG_LEVEL": "warning",
    }


@pytest.fixture
def workers(worker_env: dict[str, str], tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    """A list to start workers into; all are stopped at teardown."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.kill()


def start_worker(
    started: list[WorkerProcess], env: dict[str, str], tmp_path: Path, **extra: str
) -> WorkerProcess:
    worker = WorkerProcess({**env, **extra}, tmp_path / f"worker-{len(started)}.log")
    started.append(worker)
    return worker.start()


# -- topic I/O ------------------------------------------------------------------------------


def produce(
    bootstrap: str,
    topic: str,
    messages: list[tuple[bytes | None, bytes]],
    security: dict[str, Any] | None = None,
) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, **(security or {}))
        await producer.start()
        try:
            batch = [await producer.send(topic, value=v, key=k) for k, v in messages]
            await asyncio.gather(*batch)
        finally:
            await producer.stop()

    asyncio.run(run())


def read_topic(bootstrap: str, topic: str, security: dict[str, Any] | None = None) -> list[Any]:
    """Every message of ``topic`` up to its end offsets now (no consumer group);
    ``security``: ``pipeline.kafka_client.security_kwargs``."""

    async def run() -> list[Any]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, **(security or {})
        )
        await consumer.start()
        try:
            partitions = consumer.partitions_for_topic(topic) or set()
            if not partitions:
                await consumer._client.force_metadata_update()  # topic may be brand new
                partitions = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            if not tps:
                return []
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            out: list[Any] = []
            deadline = asyncio.get_running_loop().time() + 60
            while True:
                behind = [tp for tp in tps if await consumer.position(tp) < ends[tp]]
                if not behind:
                    return out
                if asyncio.get_running_loop().time() > deadline:
                    raise AssertionError(f"could not read {topic} to its end in 60 s")
                batch = await consumer.getmany(*behind, timeout_ms=500)
                for messages in batch.values():
                    out.extend(
                        m for m in messages if m.offset < ends[TopicPartition(m.topic, m.partition)]
                    )
        finally:
            await consumer.stop()

    return asyncio.run(run())


def ensure_stream_topics(bootstrap: str, names: StreamNames, partitions: int = 4) -> None:
    """Create a test's topics as the worker would (the broker does not auto-create)."""
    from pipeline.kafka_admin import ensure_topics
    from pipeline.settings import KafkaSettings
    from pipeline.topics import Topics

    kafka = KafkaSettings(
        bootstrap_servers=bootstrap,
        partitions=partitions,
        app_id=names.app_id,
        input_topic=names.input,
        decisions_topic=names.decisions,
        alerts_topic=names.alerts,
        notices_topic=names.notices,
        dlq_topic=names.dlq,
        audit_topic=names.audit,
    )
    asyncio.run(ensure_topics(bootstrap, Topics.from_settings(kafka).specs(partitions)))
