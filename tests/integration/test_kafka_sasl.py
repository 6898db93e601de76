"""A worker and the edge through the broker's SASL/SCRAM listener, each as its own user
under the ACLs docs/security.md lists (issue 15, item 1): a client without credentials, or
with a wrong password, is refused; a gateway can read decisions and nothing else."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from pipeline.fingerprint import fingerprint_topic
from pipeline.kafka_admin import BrokerUnavailableError, TopicSpec, ensure_topics, wait_for_broker
from pipeline.kafka_client import security_kwargs
from pipeline.settings import ClickHouseSettings, KafkaSettings
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.migrate import apply_migrations
from pipeline.topics import DECISIONS_CONFIG
from tests.integration.test_worker import as_messages
from tests.plugins.clickhouse import ChHttpEndpoint
from tests.plugins.kafka import REPO_ROOT, Acl, SaslBroker, free_ports, grant
from tests.plugins.waiting import wait_until
from tests.plugins.worker import StreamNames, event, produce, read_topic, start_worker

pytestmark = pytest.mark.integration

WORKER, GATEWAY, LOGIN, SINK, OPERATOR = (
    "authpipe-worker",
    "authpipe-gateway",
    "login-service",
    "authpipe-sink",
    "authpipe-operator",
)


def documented_acls(names: StreamNames) -> list[Acl]:
    """The ACLs of docs/security.md ("Kafka ACLs") for one test's topic names."""
    outputs = (names.decisions, names.alerts, names.notices, names.dlq, names.audit)
    return [
        Acl(LOGIN, "write", "topic", names.input),
        Acl(WORKER, "read", "topic", names.input),
        Acl(WORKER, "create", "topic", names.input),
        *[Acl(WORKER, op, "topic", topic) for topic in outputs for op in ("write", "create")],
        Acl(WORKER, "all", "topic", names.app_id, "prefixed"),
        Acl(WORKER, "read", "group", names.app_id, "prefixed"),
        Acl(GATEWAY, "read", "topic", names.decisions),
        *[Acl(SINK, "read", "topic", topic) for topic in outputs],
        Acl(SINK, "read", "group", f"{names.app_id}-sink"),
    ]


def operator_acls(names: StreamNames) -> list[Acl]:
    """docs/security.md's ``authpipe-operator`` rows: read and write the decisions topic,
    read its normalisation fingerprint, nothing else."""
    return [
        Acl(OPERATOR, "read", "topic", names.decisions),
        Acl(OPERATOR, "write", "topic", names.decisions),
        Acl(OPERATOR, "read", "topic", fingerprint_topic(names.decisions)),
    ]


def kafka_settings(sasl: SaslBroker, user: str, password: str | None = None) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=sasl.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username=user,
        sasl_password=password if password is not None else sasl.users[user],  # type: ignore[arg-type]
    )


def test_client_without_credentials_or_with_a_wrong_password_is_refused(
    kafka_sasl: SaslBroker,
) -> None:
    """Plaintext and a wrong SCRAM password get no metadata; the right password does."""
    with pytest.raises(BrokerUnavailableError):
        asyncio.run(wait_for_broker(kafka_sasl.bootstrap, 3.0))
    wrong = kafka_settings(kafka_sasl, GATEWAY, password="not-the-password")
    with pytest.raises(
        BrokerUnavailableError, match=r"check kafka\.security_protocol and the SASL user"
    ):
        asyncio.run(wait_for_broker(wrong.bootstrap_servers, 3.0, security=security_kwargs(wrong)))
    right = kafka_settings(kafka_sasl, GATEWAY)
    asyncio.run(wait_for_broker(right.bootstrap_servers, 10.0, security=security_kwargs(right)))


def _check(port: int, account: str, ip: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/v1/check?account={account}&ip={ip}", timeout=2
        ) as response:
            body: dict[str, Any] = orjson.loads(response.read())
            return body
    except OSError:
        return None


def test_worker_edge_and_sink_run_through_the_sasl_listener(
    kafka_sasl: SaslBroker,
    stream_names: StreamNames,
    workers: list[Any],
    tmp_path: Path,
    chhttp: ChHttpEndpoint,
    chdb_path: Path,
) -> None:
    """Under the documented ACLs, the worker creates its topics, reads five failures from a
    login service and writes a block, the edge enforces it and the sink writes the audit rows
    and the decision to ClickHouse, each connected only to the SASL/SCRAM listener as its own
    user; the gateway user may not write a decision (lift or plant a block) nor see the input."""
    grant(kafka_sasl.admin_bootstrap, documented_acls(stream_names))
    env = {
        **stream_names.env(),
        **kafka_sasl.env(WORKER),
        "AUTHPIPE_KAFKA_PARTITIONS": "2",
        "AUTHPIPE_STATE_DIR": str(tmp_path / "state"),
        "AUTHPIPE_LOG_FORMAT": "json",
        "AUTHPIPE_LOG_LEVEL": "warning",
    }
    start_worker(workers, env, tmp_path).wait_ready()
    now = datetime.now(UTC)
    attempts = [
        event(i, now + timedelta(milliseconds=i), "sasl-alice", "203.0.113.77") for i in range(5)
    ]
    login = security_kwargs(kafka_settings(kafka_sasl, LOGIN))
    produce(kafka_sasl.bootstrap, stream_names.input, as_messages(attempts), login)

    def by_scope() -> dict[str, Any] | None:
        found = {
            orjson.loads(m.value)["scope"]: orjson.loads(m.value)
            for m in read_topic(kafka_sasl.admin_bootstrap, stream_names.decisions)
            if m.value
        }
        return found if "account_source" in found else None

    scopes = wait_until(by_scope, 60, interval_s=0.5, description="a decision over SASL")
    decision = scopes["account_source"]  # with the seed 002 lock beside it
    assert (decision["scope"], decision["action"], decision["count"]) == (
        "account_source",
        "block",
        5,
    )

    (port,) = free_ports(1)
    edge_env = {k: v for k, v in os.environ.items() if not k.startswith("AUTHPIPE_")}
    edge_env.update(
        {
            **kafka_sasl.env(GATEWAY, mechanism="SCRAM-SHA-256"),
            "AUTHPIPE_KAFKA_DECISIONS_TOPIC": stream_names.decisions,
            "AUTHPIPE_IDENTITY_DIGEST_KEY": os.environ["AUTHPIPE_IDENTITY_DIGEST_KEY"],
            "AUTHPIPE_STATE_DIR": str(tmp_path / "edge-state"),
        }
    )
    log_path = tmp_path / "edge.log"
    with log_path.open("wb") as log:
        edge = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "edge", "serve", "--port", str(port)],
            cwd=REPO_ROOT,
            env=edge_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def refused() -> dict[str, Any] | None:
            assert edge.poll() is None, log_path.read_text()
            body = _check(port, "sasl-alice", "203.0.113.77")
            return body if body is not None and body["allowed"] is False else None

        body = wait_until(refused, 60, interval_s=0.25, description="the edge to refuse sasl-alice")
        assert body["retry_after_ms"] > 0
        other = _check(port, "sasl-bob", "203.0.113.77")
        assert other is not None and other["allowed"] is True
        gateway = security_kwargs(kafka_settings(kafka_sasl, GATEWAY))
        with pytest.raises(TopicAuthorizationFailedError):  # a tombstone would lift the block
            produce(
                kafka_sasl.bootstrap,
                stream_names.decisions,
                [(decision["key"].encode(), b"")],
                gateway,
            )
        # The input is not even visible to the gateway (metadata leaves it out).
        assert len(read_topic(kafka_sasl.admin_bootstrap, stream_names.input)) == 5
        assert read_topic(kafka_sasl.bootstrap, stream_names.input, gateway) == []
    finally:
        edge.terminate()
        edge.wait(15)

    clickhouse = ClickHouseSettings(url=chhttp.url, path=chdb_path)
    with open_clickhouse(clickhouse, create_database=True) as ch:
        apply_migrations(ch, clickhouse)
    sink_env = {
        **edge_env,
        **stream_names.env(),
        **kafka_sasl.env(SINK),
        "AUTHPIPE_KAFKA_PARTITIONS": "2",
        "AUTHPIPE_CLICKHOUSE_URL": chhttp.url,
        "AUTHPIPE_AUDIT_FLUSH_INTERVAL_MS": "200",
    }
    with (tmp_path / "sink.log").open("wb") as log:
        sink = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "sink"],
            cwd=REPO_ROOT,
            env=sink_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def written() -> tuple[int, int] | None:
            assert sink.poll() is None, (tmp_path / "sink.log").read_text()
            with open_clickhouse(clickhouse) as ch:
                counts = (
                    int(ch.query("SELECT count() FROM attempts")[0][0]),
                    int(ch.query("SELECT count() FROM decisions")[0][0]),
                )
            return counts if counts == (5, 2) else None

        # The account_source block and the seed 002 lock beside it.
        wait_until(
            written,
            60,
            interval_s=0.5,
            description="5 audit rows and the 2 decisions in ClickHouse",
        )
    finally:
        sink.terminate()
        sink.wait(30)


def _operator(sasl: SaslBroker, names: StreamNames, *args: str) -> subprocess.CompletedProcess[str]:
    """``authpipe decisions <args>`` as an operator would run it, as user authpipe-operator
    through the SASL listener."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTHPIPE_")}
    env.update(
        {
            **sasl.env(OPERATOR),
            "AUTHPIPE_KAFKA_DECISIONS_TOPIC": names.decisions,
            "AUTHPIPE_IDENTITY_DIGEST_KEY": os.environ["AUTHPIPE_IDENTITY_DIGEST_KEY"],
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "decisions", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_operator_adds_lists_and_removes_through_sasl_with_its_own_acls_only(
    kafka_sasl: SaslBroker, stream_names: StreamNames
) -> None:
    """authpipe decisions add, list and remove run as authpipe-operator under only its
    documented ACLs (decisions read/write, fingerprint read): the block is on the topic, is
    listed with who and why, and its tombstone lifts it; the operator can neither read nor
    write the input topic."""
    names = stream_names
    asyncio.run(
        ensure_topics(
            kafka_sasl.admin_bootstrap,
            [
                TopicSpec(names.decisions, 2, DECISIONS_CONFIG),
                TopicSpec(fingerprint_topic(names.decisions), 1, DECISIONS_CONFIG),
                TopicSpec(names.input, 2, {}),
            ],
        )
    )
    grant(kafka_sasl.admin_bootstrap, operator_acls(names))
    added = _operator(
        kafka_sasl, names, "add", "--source", "203.0.113.9", "--ttl", "1h",
        "--reason", "proxy, ticket 7", "--by", "olga",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("added "), added.stdout
    decision_id = added.stdout.split()[1].rstrip(":")
    values = [
        orjson.loads(m.value) for m in read_topic(kafka_sasl.admin_bootstrap, names.decisions)
    ]
    assert [(v["decision_id"], v["source"], v["operator"]) for v in values] == [
        (decision_id, "203.0.113.9", "olga")
    ]

    listed = _operator(kafka_sasl, names, "list")
    assert listed.returncode == 0, listed.stderr
    assert decision_id in listed.stdout and "olga: proxy, ticket 7" in listed.stdout

    removed = _operator(kafka_sasl, names, "remove", decision_id)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.startswith(f"removed {decision_id} "), removed.stdout
    after = _operator(kafka_sasl, names, "list")
    assert (after.returncode, after.stdout.strip()) == (0, "no active operator decisions")

    produce(kafka_sasl.admin_bootstrap, names.input, [(b"k", b"an attempt")])
    operator = security_kwargs(kafka_settings(kafka_sasl, OPERATOR))
    assert read_topic(kafka_sasl.bootstrap, names.input, operator) == []
    with pytest.raises(TopicAuthorizationFailedError):
        produce(kafka_sasl.bootstrap, names.input, [(b"k", b"forged")], operator)
