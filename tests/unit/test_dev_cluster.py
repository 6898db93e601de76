"""The local cluster's and TLS listeners' configuration, the stack's port layout, and the
replica settings every topic and producer of ours gets (issue 27)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.dev.broker_config import (
    add_tls_listeners,
    cluster_min_insync,
    cluster_node_properties,
    render_server_properties,
)
from pipeline.dev.cluster import LocalCluster
from pipeline.dev.command import build_stack
from pipeline.dev.errors import StackError
from pipeline.dev.jars import KAFKA_DEPLOY_DIR
from pipeline.dev.stack import LocalKafka
from pipeline.kafka_client import PRODUCER_GUARANTEES, producer_kwargs
from pipeline.settings import KafkaSettings, Settings
from pipeline.topics import Topics


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and line[:1] != "#")


def _template(tmp_path: Path) -> str:
    template = (KAFKA_DEPLOY_DIR / "server.properties.template").read_text()
    return render_server_properties(template, 9092, 9093, tmp_path)


def test_a_cluster_node_gets_its_id_the_quorum_and_three_replicas(tmp_path: Path) -> None:
    """Node 2 of 3: its node.id, the three voters, replication 3 and min ISR 2 everywhere."""
    voters = "1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097"
    props = _props(cluster_node_properties(_template(tmp_path), 2, voters, 3))
    assert (props["node.id"], props["controller.quorum.voters"]) == ("2", voters)
    assert {props[k] for k in props if k.endswith("replication.factor")} == {"3"}
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert [cluster_min_insync(n) for n in (1, 2, 3, 5)] == [1, 1, 2, 4]


def test_tls_listeners_add_ssl_mtls_and_sasl_ssl(tmp_path: Path) -> None:
    """Three more listeners, mutual TLS required on MTLS only, SCRAM on SASL_SSL."""
    ssl = {"ssl.keystore.location": "/k.p12"}
    props = _props(add_tls_listeners(_template(tmp_path), ssl, 9100, 9101, 9102))
    assert props["listeners"].endswith(
        ",SSL://127.0.0.1:9100,MTLS://127.0.0.1:9101,SASL_SSL://127.0.0.1:9102"
    )
    assert props["listener.security.protocol.map"].endswith(",SSL:SSL,MTLS:SSL,SASL_SSL:SASL_SSL")
    assert props["listener.name.mtls.ssl.client.auth"] == "required"
    assert "ssl.client.auth" not in props
    assert props["ssl.keystore.location"] == "/k.p12"
    assert "ScramLoginModule" in props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]


def test_stack_layout_for_one_node_and_for_three_with_tls(tmp_path: Path) -> None:
    """One node keeps .state/kafka and P, P+1; three nodes with TLS take P..P+11."""
    settings = Settings(state_dir=tmp_path, kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9092"))
    single = build_stack(settings, 1, False)
    assert isinstance(single, LocalKafka)
    assert (single.state_dir, single.port, single.controller_port) == (
        (tmp_path / "kafka").resolve(),
        9092,
        9093,
    )
    cluster = build_stack(settings, 3, True)
    assert isinstance(cluster, LocalCluster)
    assert cluster.bootstrap == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"
    assert cluster.tls_bootstrap(mutual=True) == "127.0.0.1:9099,127.0.0.1:9101,127.0.0.1:9103"
    assert [n.voters for n in cluster.nodes] == [
        "1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097"
    ] * 3
    assert len({n.cluster_id for n in cluster.nodes}) == 1
    with pytest.raises(StackError, match="--brokers 0"):
        build_stack(settings, 0, False)


def test_every_topic_carries_min_insync_replicas_and_producers_acks_all() -> None:
    """min.insync.replicas from the settings on every spec; producers acks=all, idempotent."""
    kafka = KafkaSettings(replication_factor=3, min_insync_replicas=2)
    specs = Topics.from_settings(kafka).specs(4)
    assert {spec.configs["min.insync.replicas"] for spec in specs} == {"2"}
    assert dict(PRODUCER_GUARANTEES) == {"acks": "all", "enable_idempotence": True}
    assert producer_kwargs(kafka)["acks"] == "all"
    with pytest.raises(ValueError, match="min_insync_replicas=3 exceeds replication_factor=1"):
        KafkaSettings(min_insync_replicas=3)
