"""The local broker's configuration: ``server.properties`` rendered from
``deploy/local/kafka/server.properties.template``, the optional SASL/SCRAM listener, the
KRaft cluster id and the port taken from ``bootstrap_servers``. Pure text in, text out."""

from __future__ import annotations

import base64
import os
import re
import string
from pathlib import Path

from pipeline.dev.errors import StackError
from pipeline.dev.jars import KAFKA_DEPLOY_DIR

TEMPLATE_PATH = KAFKA_DEPLOY_DIR / "server.properties.template"
LOG4J_PATH = KAFKA_DEPLOY_DIR / "log4j2.properties"
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def new_cluster_id() -> str:
    """A KRaft cluster id: base64url of 16 random bytes, without padding.

    Like Kafka's ``Uuid.randomUuid``, never one starting with ``-``: StorageTool's
    argument parser would take ``-t -abc...`` for an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode("ascii")
        if not cluster_id.startswith("-"):
            return cluster_id


def render_server_properties(template: str, port: int, controller_port: int, data_dir: Path) -> str:
    """server.properties from the template; every placeholder must be filled."""
    try:
        return string.Template(template).substitute(
            port=port, controller_port=controller_port, data_dir=str(data_dir)
        )
    except (KeyError, ValueError) as exc:
        raise StackError(
            f"{TEMPLATE_PATH} has an unknown or broken placeholder ({exc}); "
            "only ${port}, ${controller_port} and ${data_dir} exist"
        ) from exc


SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
_SCRAM_SAFE = re.compile(r"[A-Za-z0-9._-]+")


def add_sasl_listener(properties: str, sasl_port: int) -> str:
    """server.properties with a second client listener, SASL_PLAINTEXT with SCRAM-SHA-256
    and -512 on 127.0.0.1:``sasl_port`` (credentials come from ``scram_format_args``)."""
    lines = []
    for line in properties.splitlines():
        key, _, value = line.partition("=")
        if key == "listeners" or key == "advertised.listeners":
            line = f"{key}={value},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
        elif key == "listener.security.protocol.map":
            line = f"{key}={value},SASL_PLAINTEXT:SASL_PLAINTEXT"
        lines.append(line)
    lines += [
        "",
        "# --- SASL/SCRAM listener (LocalKafka sasl_port); users added at format time",
        f"sasl.enabled.mechanisms={','.join(SCRAM_MECHANISMS)}",
        "# ACLs decide what each SASL user may do; the loopback plaintext and controller",
        "# listeners (principal ANONYMOUS) stay the local administrator's.",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users=User:ANONYMOUS",
        "allow.everyone.if.no.acl.found=false",
    ]
    lines += [
        f"listener.name.sasl_plaintext.{m.lower()}.sasl.jaas.config={_SCRAM_LOGIN}"
        for m in SCRAM_MECHANISMS
    ]
    return "\n".join(lines) + "\n"


def scram_format_args(users: dict[str, str]) -> list[str]:
    """StorageTool ``--add-scram`` arguments: each user with both SCRAM mechanisms."""
    args: list[str] = []
    for name, password in sorted(users.items()):
        if not (_SCRAM_SAFE.fullmatch(name) and _SCRAM_SAFE.fullmatch(password)):
            raise StackError(
                f"SCRAM user {name!r}: use only letters, digits, '.', '_' and '-' in names and "
                "passwords of the local broker (StorageTool's --add-scram syntax)"
            )
        for mechanism in SCRAM_MECHANISMS:
            args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
    return args


def parse_local_port(bootstrap_servers: str) -> int:
    """Port of the first ``host:port`` entry; the host must be this machine."""
    first = bootstrap_servers.split(",")[0].strip()
    host, sep, port_text = first.rpartition(":")
    if not sep or not port_text.isdigit():
        raise StackError(
            f"bootstrap_servers={bootstrap_servers!r} is not host:port; "
            "set AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092"
        )
    if host not in LOCAL_HOSTS:
        raise StackError(
            f"authpipe stack runs a broker on this machine only, but bootstrap_servers="
            f"{bootstrap_servers!r} points at {host}; use 127.0.0.1:<port>"
        )
    port = int(port_text)
    if not 1 <= port <= 65534:
        raise StackError(
            f"port {port} is out of range; use 1..65534 (the next one is the controller)"
        )
    return port


# Cluster-wide replica settings a node of a ``replicas``-node cluster gets (every one of
# them 1 on a single node): internal topics replicated like ours, min ISR 2 from 3 nodes.
_REPLICA_KEYS = (
    "default.replication.factor",
    "offsets.topic.replication.factor",
    "transaction.state.log.replication.factor",
    "share.coordinator.state.topic.replication.factor",
)
_MIN_ISR_KEYS = (
    "min.insync.replicas",
    "transaction.state.log.min.isr",
    "share.coordinator.state.topic.min.isr",
)


def cluster_min_insync(replicas: int) -> int:
    """The in-sync replicas a write needs on a ``replicas``-node cluster: all but one from 3
    nodes up (one node may fail, or restart, without refusing writes), else 1."""
    return replicas - 1 if replicas >= 3 else 1


def set_properties(properties: str, overrides: dict[str, str]) -> str:
    """``properties`` with the value of each key of ``overrides`` replaced (keys the text
    lacks are appended), comments and order kept."""
    left = dict(overrides)
    lines = []
    for line in properties.splitlines():
        key = line.partition("=")[0]
        if key in left:
            line = f"{key}={left.pop(key)}"
        lines.append(line)
    lines += [f"{key}={value}" for key, value in left.items()]
    return "\n".join(lines) + "\n"


def cluster_node_properties(properties: str, node_id: int, voters: str, replicas: int) -> str:
    """server.properties of node ``node_id`` of a KRaft cluster whose controller quorum is
    ``voters`` (``1@127.0.0.1:p1,2@...``; every node is broker and controller), with every
    topic replicated ``replicas`` times and writes needing ``cluster_min_insync`` replicas."""
    min_isr = str(cluster_min_insync(replicas))
    overrides = {"node.id": str(node_id), "controller.quorum.voters": voters}
    overrides.update(dict.fromkeys(_REPLICA_KEYS, str(replicas)))
    overrides.update(dict.fromkeys(_MIN_ISR_KEYS, min_isr))
    return set_properties(properties, overrides)


def add_listener(properties: str, name: str, protocol: str, port: int) -> str:
    """server.properties with one more client listener ``name`` (``protocol``) on
    127.0.0.1:``port``, advertised as such."""
    lines = []
    for line in properties.splitlines():
        key, _, value = line.partition("=")
        if key in ("listeners", "advertised.listeners"):
            line = f"{key}={value},{name}://127.0.0.1:{port}"
        elif key == "listener.security.protocol.map":
            line = f"{key}={value},{name}:{protocol}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def add_tls_listeners(
    properties: str,
    ssl_properties: dict[str, str],
    ssl_port: int,
    mtls_port: int,
    sasl_ssl_port: int | None = None,
) -> str:
    """server.properties with TLS client listeners on 127.0.0.1: ``SSL`` (the broker proves
    itself), ``MTLS`` (clients must too: ``ssl.client.auth=required``) and, if
    ``sasl_ssl_port``, ``SASL_SSL`` with SCRAM (users added at format time). No authorizer
    here: on a TLS-only broker every authenticated client may do everything."""
    rendered = add_listener(properties, "SSL", "SSL", ssl_port)
    rendered = add_listener(rendered, "MTLS", "SSL", mtls_port)
    extra = {**ssl_properties, "listener.name.mtls.ssl.client.auth": "required"}
    if sasl_ssl_port is not None:
        rendered = add_listener(rendered, "SASL_SSL", "SASL_SSL", sasl_ssl_port)
        extra["sasl.enabled.mechanisms"] = ",".join(SCRAM_MECHANISMS)
        extra.update(
            (f"listener.name.sasl_ssl.{m.lower()}.sasl.jaas.config", _SCRAM_LOGIN)
            for m in SCRAM_MECHANISMS
        )
    return set_properties(rendered, extra)
