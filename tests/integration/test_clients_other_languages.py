"""Gateways in other languages: the librdkafka (confluent-kafka) and Java examples, run as
their READMEs say, over SASL_SSL (librdkafka) and mutual TLS (Java) to the TLS broker.

The operator CLI (``authpipe decisions add|remove``, over SASL_SSL too) publishes two
decisions and lifts one (a tombstone): both tables hold exactly the other one, having
read three records of which one was a tombstone. The librdkafka reporter's attempts are
on the input topic exactly as it printed them, keyed by the account."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.kafka_admin import ensure_topics
from pipeline.settings import KafkaSettings
from pipeline.topics import Topics
from tests.plugins.kafka import REPO_ROOT, SCRAM_USERS, SHARED_LIBS_DIR, TlsBroker, unique_topic
from tests.plugins.worker import read_topic

pytestmark = pytest.mark.integration

EXAMPLES = REPO_ROOT / "examples"
USER = "login-service"


def sasl_ssl_env(broker: TlsBroker) -> dict[str, str]:
    return {
        "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": broker.sasl_ssl,
        "AUTHPIPE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "AUTHPIPE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "AUTHPIPE_KAFKA_SASL_USERNAME": USER,
        "AUTHPIPE_KAFKA_SASL_PASSWORD": SCRAM_USERS[USER],
        "AUTHPIPE_KAFKA_SSL_CAFILE": str(broker.files.ca_pem),
    }


def run(argv: list[str], env: dict[str, str], cwd: Path = REPO_ROOT) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AUTHPIPE_KAFKA_")}
    done = subprocess.run(
        argv, cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"{argv[:3]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture
def topics(kafka_tls: TlsBroker) -> dict[str, str]:
    """This test's input and decisions topics, created through the admin listener."""
    names = {
        "AUTHPIPE_KAFKA_INPUT_TOPIC": unique_topic("in"),
        "AUTHPIPE_KAFKA_DECISIONS_TOPIC": unique_topic("decisions"),
    }
    kafka = KafkaSettings(
        bootstrap_servers=kafka_tls.plaintext,
        partitions=2,
        input_topic=names["AUTHPIPE_KAFKA_INPUT_TOPIC"],
        decisions_topic=names["AUTHPIPE_KAFKA_DECISIONS_TOPIC"],
    )
    wanted = {kafka.input_topic, kafka.decisions_topic}
    specs = [s for s in Topics.from_settings(kafka).specs(2) if s.name in wanted]
    asyncio.run(ensure_topics(kafka_tls.plaintext, specs))
    return names


def authpipe(env: dict[str, str], *args: str) -> str:
    return run([sys.executable, "-m", "pipeline.cli", *args], env)


def test_librdkafka_and_java_gateways_report_attempts_and_hold_the_decisions_table(
    kafka_tls: TlsBroker, topics: dict[str, str]
) -> None:
    """librdkafka reports 3 attempts (on the topic as printed, keyed by account) and loads
    the decisions table; Java loads it over mutual TLS: both hold the one decision left
    after the CLI added two and removed one (3 records read, 1 tombstone)."""
    env = {**sasl_ssl_env(kafka_tls), **topics}
    gateway = str(EXAMPLES / "librdkafka" / "gateway.py")
    printed = run(
        [sys.executable, gateway, "report", "mallory@example.com", "203.0.113.7", "3"], env
    )
    events = [json.loads(line) for line in printed.splitlines()]
    assert len(events) == 3
    on_topic = read_topic(kafka_tls.plaintext, topics["AUTHPIPE_KAFKA_INPUT_TOPIC"])
    assert sorted((m.key, json.loads(m.value)["event_id"]) for m in on_topic) == sorted(
        (b"mallory@example.com", e["event_id"]) for e in events
    )
    assert {json.loads(m.value)["event_id"]: json.loads(m.value) for m in on_topic} == {
        e["event_id"]: e for e in events
    }

    added = authpipe(
        env,
        "decisions",
        "add",
        "--source",
        "203.0.113.7",
        "--ttl",
        "1h",
        "--reason",
        "librdkafka test",
        "--by",
        "ci",
    )
    kept_id = added.split()[1].rstrip(":")
    added = authpipe(
        env,
        "decisions",
        "add",
        "--source",
        "198.51.100.9",
        "--ttl",
        "1h",
        "--reason",
        "to be lifted",
        "--by",
        "ci",
    )
    lifted_id = added.split()[1].rstrip(":")
    authpipe(env, "decisions", "remove", lifted_id)

    table: dict[str, Any] = json.loads(run([sys.executable, gateway, "table"], env))
    assert (table["records"], table["tombstones"]) == (3, 1)
    ((key, decision),) = table["table"].items()
    assert (decision["decision_id"], decision["key"], decision["source"]) == (
        kept_id,
        key,
        "203.0.113.7",
    )

    java_env = {**kafka_tls.env(mutual=True), **topics}
    java = run(
        ["java", "-cp", f"{SHARED_LIBS_DIR}/*", "DecisionTable.java"],
        java_env,
        cwd=EXAMPLES / "java",
    )
    assert json.loads(java.strip().splitlines()[-1]) == table
