"""A login service confined to its tenant (issue 26 item 9): with ``ingest.tenant_topics``
binding ``<input>.acme`` to acme and ``<input>.globex`` to globex, and ACLs letting
login-acme write only the acme topic, login-acme's failures for acme lock and block as
usual, an event for globex it writes into its own topic is dead-lettered
``tenant_not_allowed``, and it cannot write globex's topic or the shared input at all."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from pipeline.kafka_client import security_kwargs
from tests.integration.test_kafka_sasl import kafka_settings
from tests.plugins.kafka import Acl, SaslBroker, grant
from tests.plugins.waiting import wait_until
from tests.plugins.worker import StreamNames, event, produce, read_topic, start_worker

pytestmark = pytest.mark.integration

ACME, GLOBEX = "login-acme", "login-globex"


def tenant_event(i: int, when: datetime, tenant: str, account: str, ip: str) -> bytes:
    body = orjson.loads(event(i, when, account, ip, run=tenant))
    return orjson.dumps({**body, "tenant": tenant})


def test_a_login_service_writes_only_its_tenants_events(
    kafka_sasl: SaslBroker, stream_names: StreamNames, workers: list[Any], tmp_path: Path
) -> None:
    """login-acme's five acme failures give acme's block; its forged globex failure in the
    acme topic is one tenant_not_allowed dead letter and decides nothing; it may not write
    the globex topic or the shared input topic."""
    names = stream_names
    acme_topic, globex_topic = f"{names.input}.acme", f"{names.input}.globex"
    grant(
        kafka_sasl.admin_bootstrap,
        [Acl(ACME, "write", "topic", acme_topic), Acl(GLOBEX, "write", "topic", globex_topic)],
    )
    env = {
        **names.env(),
        # The worker on the administrator's listener: the producers' confinement is tested.
        "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": kafka_sasl.admin_bootstrap,
        "AUTHPIPE_KAFKA_PARTITIONS": "2",
        "AUTHPIPE_INGEST_TENANT_TOPICS": json.dumps({acme_topic: "acme", globex_topic: "globex"}),
        "AUTHPIPE_STATE_DIR": str(tmp_path / "state"),
        "AUTHPIPE_LOG_FORMAT": "json",
        "AUTHPIPE_LOG_LEVEL": "warning",
    }
    start_worker(workers, env, tmp_path).wait_ready()
    acme = security_kwargs(kafka_settings(kafka_sasl, ACME))
    now = datetime.now(UTC)
    forged = tenant_event(99, now, "globex", "ceo@globex.example", "198.51.100.66")
    produce(kafka_sasl.bootstrap, acme_topic, [(b"forged", forged)], acme)
    failures = [
        (b"a", tenant_event(i, now + timedelta(milliseconds=i), "acme", "ann", "203.0.113.60"))
        for i in range(5)
    ]
    produce(kafka_sasl.bootstrap, acme_topic, failures, acme)
    for topic in (globex_topic, names.input):
        with pytest.raises(TopicAuthorizationFailedError):
            produce(kafka_sasl.bootstrap, topic, [(b"g", forged)], acme)

    def blocked() -> list[dict[str, Any]] | None:
        found = [
            orjson.loads(m.value)
            for m in read_topic(kafka_sasl.admin_bootstrap, names.decisions)
            if m.value
        ]
        return found if any(d["rule"] == "account_source" for d in found) else None

    decisions = wait_until(blocked, 60, interval_s=0.5, description="acme's block")
    assert {d["tenant"] for d in decisions} == {"acme"}
    block = next(d for d in decisions if d["rule"] == "account_source")
    assert (block["source"], block["count"]) == ("203.0.113.60", 5)
    dlq = read_topic(kafka_sasl.admin_bootstrap, names.dlq)
    assert [(dict(m.headers)["error"], dict(m.headers)["source_topic"], m.value) for m in dlq] == [
        (b"tenant_not_allowed", acme_topic.encode(), forged)
    ]
