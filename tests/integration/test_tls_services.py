"""TLS for real: the broker's TLS listeners (a keytool CA's certificates) refuse what they
must, and the worker, edge, sink, CLI and the example login service work over them."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer

from pipeline.kafka_admin import BrokerUnavailableError, wait_for_broker
from pipeline.kafka_client import producer_kwargs, security_kwargs
from pipeline.settings import ClickHouseSettings, KafkaSettings
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.migrate import apply_migrations
from tests.integration.test_audit_sink import SinkProcess
from tests.plugins.clickhouse import ChHttpEndpoint
from tests.plugins.kafka import REPO_ROOT, TLS_CLIENT, UNTRUSTED_CLIENT, TlsBroker, free_ports
from tests.plugins.waiting import wait_until
from tests.plugins.worker import StreamNames, WorkerProcess, start_worker

pytestmark = pytest.mark.integration

REFUSAL_WAIT_S = 3.0


@pytest.fixture
def sink_processes() -> Iterator[list[SinkProcess]]:
    """A list to start sinks into; any still running is killed at teardown."""
    started: list[SinkProcess] = []
    yield started
    for sink in started:
        if sink.process is not None and sink.process.poll() is None:
            sink.process.kill()
            sink.process.wait(30)


def _settings(env: dict[str, str]) -> KafkaSettings:
    """The Kafka settings a service started with ``env`` (AUTHPIPE_KAFKA_*) would have."""
    prefix = "AUTHPIPE_KAFKA_"
    return KafkaSettings.model_validate(
        {k[len(prefix) :].lower(): v for k, v in env.items() if k.startswith(prefix)}
    )


def answers(env: dict[str, str]) -> bool:
    """Whether a client with ``env``'s settings gets a metadata answer."""
    kafka = _settings(env)
    try:
        asyncio.run(
            wait_for_broker(
                kafka.bootstrap_servers, REFUSAL_WAIT_S, security=security_kwargs(kafka)
            )
        )
    except BrokerUnavailableError:
        return False
    return True


def test_tls_listeners_refuse_plaintext_unknown_brokers_and_untrusted_client_certificates(
    kafka_tls: TlsBroker,
) -> None:
    """A plaintext client, a client that does not trust the broker's CA, and on the mutual
    listener a client without a certificate or with one of another CA, all get no answer;
    the trusted client on both listeners does."""
    ssl, mtls = kafka_tls.env(mutual=False), kafka_tls.env(mutual=True)
    assert answers(ssl) and answers(mtls)
    assert not answers({"AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": kafka_tls.ssl})
    assert not answers({**ssl, "AUTHPIPE_KAFKA_SSL_CAFILE": str(kafka_tls.untrusted.ca_pem)})
    assert not answers({**ssl, "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": kafka_tls.mtls})
    intruder = kafka_tls.untrusted
    assert not answers(
        {
            **mtls,
            "AUTHPIPE_KAFKA_SSL_CERTFILE": str(intruder.client_cert(UNTRUSTED_CLIENT)),
            "AUTHPIPE_KAFKA_SSL_KEYFILE": str(intruder.client_key(UNTRUSTED_CLIENT)),
        }
    )
    assert kafka_tls.files.client_cert(TLS_CLIENT).read_text().count("BEGIN CERTIFICATE") == 1


def _login_service() -> ModuleType:
    path = REPO_ROOT / "examples" / "gateway" / "login_service.py"
    spec = importlib.util.spec_from_file_location("tls_login_service", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def edge_over_ssl(kafka_tls: TlsBroker, stream_names: StreamNames, tmp_path: Path) -> Iterator[str]:
    """``authpipe edge serve`` reading the decisions over server TLS; its base URL."""
    (port,) = free_ports(1)
    env = {**os.environ, **stream_names.env(), **kafka_tls.env(mutual=False)}
    with (tmp_path / "edge.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "edge", "serve", "--port", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait(15)


@pytest.mark.timeout(300)
def test_worker_edge_sink_cli_and_login_service_run_over_tls_and_mutual_tls(
    kafka_tls: TlsBroker,
    stream_names: StreamNames,
    workers: list[WorkerProcess],
    edge_over_ssl: str,
    chhttp: ChHttpEndpoint,
    sink_processes: list[SinkProcess],
    tmp_path: Path,
) -> None:
    """The login service reports 5 failed logins over mutual TLS; the worker (mutual TLS)
    locks the account, the edge (server TLS) refuses the 6th login, the sink (mutual TLS)
    audits the 5 attempts (sum of weights 5), the CLI lists the lock (server TLS)."""
    base_env = {
        **stream_names.env(),
        "AUTHPIPE_KAFKA_PARTITIONS": "2",
        "AUTHPIPE_STATE_DIR": str(tmp_path / "state"),
        "AUTHPIPE_LOG_FORMAT": "json",
        "AUTHPIPE_LOG_LEVEL": "warning",
    }
    mutual = {**base_env, **kafka_tls.env(mutual=True)}
    worker = start_worker(workers, mutual, tmp_path).wait_ready()
    ch_settings = ClickHouseSettings(url=chhttp.url, path=tmp_path / "chdb")
    with open_clickhouse(ch_settings, create_database=True) as handle:
        apply_migrations(handle, ch_settings)
    sink_env = {
        **mutual,
        "AUTHPIPE_CLICKHOUSE_URL": chhttp.url,
        "AUTHPIPE_AUDIT_FLUSH_INTERVAL_MS": "200",
    }
    sink = SinkProcess(sink_env, tmp_path, tmp_path / "sink.log")
    sink_processes.append(sink)
    sink.start()
    service = _login_service()
    users = {"carol@example.com": service.hash_password("right password")}

    async def logins() -> tuple[list[object], object]:
        producer = AIOKafkaProducer(**producer_kwargs(_settings(mutual)))
        await producer.start()
        try:
            report = service.kafka_report(producer, stream_names.input)
            async with aiohttp.ClientSession() as session:
                edge = service.EdgeClient(session, edge_over_ssl)
                attempt = service.Attempt("carol@example.com", "wrong", peer_ip="203.0.113.50")
                failed = [await service.login(attempt, edge, users, report) for _ in range(5)]
                await producer.flush()

                async def refused() -> object:
                    result = await service.login(attempt, edge, users)
                    return result if not result.ok and result.retry_after_ms > 0 else None

                deadline = asyncio.get_running_loop().time() + 90
                while (result := await refused()) is None:
                    assert asyncio.get_running_loop().time() < deadline, "no lock at the edge"
                    await asyncio.sleep(0.2)
                return failed, result
        finally:
            await producer.stop()

    wait_until(lambda: _ready(edge_over_ssl), 90, interval_s=0.2, description="edge ready")
    failed, refused = asyncio.run(logins())
    assert [(r.ok, r.retry_after_ms) for r in failed] == [(False, 0)] * 5
    assert refused.retry_after_ms > 0
    assert worker.metric("authpipe_events_total") == 5

    def audited() -> int:
        with open_clickhouse(ch_settings) as handle:
            return int(handle.query("SELECT toInt64(sum(weight)) FROM attempts")[0][0])

    wait_until(lambda: audited() == 5, 90, interval_s=0.5, description="the 5 attempts audited")
    assert sink.stop() == 0

    ssl_env = {**base_env, **kafka_tls.env(mutual=False)}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AUTHPIPE_KAFKA_")}
    listed = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "decisions", "list", "--all"],
        cwd=REPO_ROOT,
        env={**clean, **ssl_env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    (lock,) = [line for line in listed.stdout.splitlines() if "lockout" in line]
    assert "account" in lock, listed.stdout


def _ready(base: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
