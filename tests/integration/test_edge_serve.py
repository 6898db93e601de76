"""``authpipe edge serve`` as a process on the real broker (issue 6): it binds loopback,
becomes ready after reading the topic, enforces with the configured digest key and token,
and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiokafka import AIOKafkaProducer

from pipeline.clock import wall_ms
from pipeline.kafka_admin import TopicSpec, ensure_topics
from pipeline.topics import DECISIONS_CONFIG
from tests.plugins.kafka import REPO_ROOT, free_ports
from tests.plugins.waiting import wait_until_async
from tests.unit.test_edge_support import ACCOUNT, DIGEST_KEY, MIN, account_key, message

pytestmark = pytest.mark.integration

TOKEN = "edge-serve-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@pytest.fixture
def port() -> int:
    (free,) = free_ports(1)
    return free


@pytest.fixture
def edge_process(
    kafka_bootstrap: str, topic_name: str, port: int, tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    config = tmp_path / "authpipe.toml"
    config.write_text(
        f'[kafka]\nbootstrap_servers = "{kafka_bootstrap}"\ndecisions_topic = "{topic_name}"\n'
        f'[identity]\ndigest_key = "{DIGEST_KEY}"\n'
        f'[ingest]\ntrusted_proxies = ["10.0.0.0/8"]\n'
        f'[edge]\ntoken = "{TOKEN}"\n[log]\nformat = "json"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTHPIPE_")}
    env["AUTHPIPE_CONFIG"] = str(config)
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "edge", "serve", "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(STOP_TIMEOUT_S)


async def test_edge_serve_enforces_and_stops_on_sigterm(
    kafka_bootstrap: str, topic_name: str, port: int, edge_process: subprocess.Popen[bytes]
) -> None:
    """The served edge reads a block written before it started, answers 401 without the
    token, refuses the account's attempt once ready, and exits 0 on SIGTERM."""
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic_name, 2, DECISIONS_CONFIG)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        key, value = message(account_key(), wall_ms() + 10 * MIN)
        await producer.send_and_wait(topic_name, key=key, value=value)
    finally:
        await producer.stop()
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:

        async def ready() -> bool:
            try:
                async with http.get(f"{base}/readyz", headers=AUTH) as response:
                    return response.status == 200
            except aiohttp.ClientConnectionError:
                return False

        await wait_until_async(
            ready, START_TIMEOUT_S, interval_s=0.2, description="edge serve to be ready"
        )
        async with http.get(f"{base}/healthz") as response:
            assert response.status == 200
        url = f"{base}/v1/check?account={ACCOUNT}&ip=10.9.9.9&forwarded_for=198.51.100.7"
        async with http.get(url) as response:
            assert response.status == 401
        async with http.get(url, headers=AUTH) as response:
            assert response.status == 200
            body = orjson.loads(await response.read())
        assert body["allowed"] is False
        assert 9 * MIN < body["retry_after_ms"] <= 10 * MIN
        assert set(body) == {"allowed", "retry_after_ms", "challenge", "step_up"}
    edge_process.send_signal(signal.SIGTERM)
    assert edge_process.wait(STOP_TIMEOUT_S) == 0
    out = edge_process.stdout.read().decode() if edge_process.stdout else ""
    events = [orjson.loads(line)["event"] for line in out.splitlines() if line.startswith("{")]
    assert events[0] == "edge_listening"
    assert {"edge_view_ready", "edge_check_refused", "edge_stopped"} <= set(events)
    listening = orjson.loads(out.splitlines()[0])
    assert (listening["host"], listening["port"]) == ("127.0.0.1", port)
