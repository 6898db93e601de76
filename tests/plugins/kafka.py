"""Kafka broker fixtures: one real broker per test session.

``kafka_bootstrap`` is the broker's ``host:port``. With ``AUTHPIPE_TEST_KAFKA_BOOTSTRAP``
set, that broker is used as is; otherwise a ``LocalKafka`` starts in a temp dir on free
ports and stops at the end of the session. Its jars come from the shared cache
``<repo>/.state/kafka/libs`` (the CLI's default; ``scripts/setup`` fills it), so a test
session does not run Maven. A broker that cannot start fails the tests (also in CI),
with the tail of its broker.log; it never skips them.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.dev.cluster import LocalCluster, NodePorts
from pipeline.dev.jars import fetch_libs
from pipeline.dev.processes import pid_alive, port_free
from pipeline.dev.stack import LocalKafka, TlsListeners
from pipeline.dev.tls import TlsFiles, make_authority
from pipeline.errors import AuthpipeError
from pipeline.kafka_admin import wait_for_broker

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_LIBS_DIR = REPO_ROOT / ".state" / "kafka" / "libs"
ENV_BOOTSTRAP = "AUTHPIPE_TEST_KAFKA_BOOTSTRAP"
TEST_STATE_BASE = Path(tempfile.gettempdir()) / "authpipe-test-kafka"
EXTERNAL_READY_TIMEOUT_S = 30.0
_TOPIC_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


PORTS_LOW, PORTS_HIGH = 20_000, 32_000
"""Test services listen below Linux's ephemeral range (32768 up): a port the kernel hands
out for ``bind(0)`` can be taken again by any outgoing connection before the service binds
it (seen in CI: Keycloak's management port, "Address already in use")."""


def _port_range() -> range:
    """This test worker's share of the range: xdist workers never pick the same port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    width = (PORTS_HIGH - PORTS_LOW) // count
    low = PORTS_LOW + (index % count) * width
    return range(low, low + width)


def free_ports(count: int, span: int = 1) -> list[int]:
    """``count`` distinct ports P, each with P .. P + span - 1 free on 127.0.0.1 now, from
    this test worker's share of 20000-32000 (the one port picker of the tests)."""
    ports = _port_range()
    rng = random.Random()
    chosen: list[int] = []
    for _ in range(200 * count):
        port = rng.randrange(ports.start, ports.stop - span)
        block = range(port, port + span)
        if any(p in range(c, c + span) for c in chosen for p in block):
            continue
        if all(port_free(p) for p in block):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise AssertionError(f"no {count} free port blocks of {span} in {ports} on 127.0.0.1")


def free_port_pair() -> tuple[int, int]:
    """Two consecutive free ports (port, port + 1): the CLI's broker and controller ports."""
    (port,) = free_ports(1, span=2)
    return port, port + 1


def unique_topic(prefix: str = "test") -> str:
    """A topic name no other test (or earlier run on the same broker) has used."""
    safe = _TOPIC_UNSAFE.sub("-", prefix).strip("-.")[:120] or "test"
    return f"{safe}-{uuid.uuid4().hex[:10]}"


def shared_kafka_libs() -> Path:
    """The shared jar cache, fetched with Maven only if it is missing or outdated."""
    return fetch_libs(SHARED_LIBS_DIR)


def _reap_orphan_brokers(base: Path) -> None:
    """Stop brokers left by test sessions that died without teardown (e.g. SIGKILL).

    Each session's dir is ``<pytest pid>-<token>``; a dir whose pytest pid is gone is an
    orphan. Only a process that LocalKafka recognises as that dir's broker is stopped.
    """
    if not base.is_dir():
        return
    for state_dir in base.iterdir():
        owner = state_dir.name.split("-", 1)[0]
        if not owner.isdigit() or pid_alive(int(owner)):
            continue
        for node_dir in [state_dir, *sorted(state_dir.glob("node-*"))]:  # a cluster's nodes
            LocalKafka(node_dir, port=1, controller_port=2).down()
        shutil.rmtree(state_dir, ignore_errors=True)


def _fail(what: str, exc: BaseException) -> None:
    context = "CI" if os.environ.get("CI") else "local run"
    pytest.fail(
        f"{what} ({context}): {exc}\n"
        f"Run `bash scripts/setup` (Java 17+ and Maven needed), or point {ENV_BOOTSTRAP} "
        "at a running broker.",
        pytrace=False,
    )


@dataclass(frozen=True)
class SaslBroker:
    """The SASL/SCRAM listener of a test broker, the users it knows (name: password), and
    its plaintext listener, where the principal is the administrator (sets ACLs)."""

    bootstrap: str
    users: dict[str, str]
    admin_bootstrap: str

    def env(self, user: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
        """AUTHPIPE_KAFKA_* variables of a service connecting as ``user``."""
        return {
            "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "AUTHPIPE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "AUTHPIPE_KAFKA_SASL_MECHANISM": mechanism,
            "AUTHPIPE_KAFKA_SASL_USERNAME": user,
            "AUTHPIPE_KAFKA_SASL_PASSWORD": self.users[user],
        }


# SCRAM users of every test broker's SASL listener (dev secrets of a throwaway broker).
SCRAM_USERS = {
    "authpipe-worker": "worker-secret-0123",
    "authpipe-gateway": "gateway-secret-0123",
    "login-service": "login-secret-0123",
    "authpipe-sink": "sink-secret-0123",
    "authpipe-operator": "operator-secret-0123",
    "login-acme": "login-acme-secret-0123",
    "login-globex": "login-globex-secret-0123",
}

# Kafka's ACL codes (org.apache.kafka.common.acl / resource), as CreateAcls takes them.
RESOURCE = {"topic": 2, "group": 3, "cluster": 4}
PATTERN = {"literal": 3, "prefixed": 4}
OPERATION = {"all": 2, "read": 3, "write": 4, "create": 5, "describe": 8}
ALLOW = 3


@dataclass(frozen=True)
class Acl:
    """One ALLOW binding: ``operation`` on ``resource`` ``name`` (``pattern``) for ``user``."""

    user: str
    operation: str
    resource: str
    name: str
    pattern: str = "literal"


def grant(admin_bootstrap: str, acls: list[Acl]) -> None:
    """Create ``acls`` through the plaintext (administrator) listener, one CreateAcls each
    (aiokafka has no ACL API; its protocol module has the request)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.protocol.admin import CreateAclsRequest

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=admin_bootstrap)
        await admin.start()
        try:
            for acl in acls:
                request = CreateAclsRequest(
                    RESOURCE[acl.resource],
                    acl.name,
                    PATTERN[acl.pattern],
                    f"User:{acl.user}",
                    "*",
                    OPERATION[acl.operation],
                    ALLOW,
                )
                response = await admin._send_request(request)
                errors = [e for e in response.creation_responses if e[0] != 0]
                assert not errors, f"CreateAcls {acl}: {errors}"
        finally:
            await admin.close()

    asyncio.run(run())


def _start_local(kafka: LocalKafka) -> None:
    try:
        kafka.up()
    except AuthpipeError as exc:
        kafka.down()
        _fail("the test Kafka broker did not start", exc)


@contextmanager
def _local_broker() -> Iterator[LocalKafka]:
    """A LocalKafka on free ports in a temp dir, with a SASL/SCRAM listener beside the
    plaintext one (one broker serves both kinds of test); stopped and removed after."""
    _reap_orphan_brokers(TEST_STATE_BASE)
    state_dir = TEST_STATE_BASE / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    port, controller_port, sasl_port = free_ports(3)
    kafka = LocalKafka(
        state_dir,
        port,
        controller_port,
        libs_dir=SHARED_LIBS_DIR,
        sasl_port=sasl_port,
        scram_users=SCRAM_USERS,
    )
    _start_local(kafka)
    try:
        yield kafka
    finally:
        kafka.down()
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def local_kafka() -> Iterator[LocalKafka | None]:
    """The session's own broker, or None when AUTHPIPE_TEST_KAFKA_BOOTSTRAP names one."""
    external = os.environ.get(ENV_BOOTSTRAP)
    if external:
        try:
            asyncio.run(wait_for_broker(external, EXTERNAL_READY_TIMEOUT_S))
        except AuthpipeError as exc:
            _fail(f"the broker at {ENV_BOOTSTRAP}={external} is not reachable", exc)
        yield None
        return
    with _local_broker() as kafka:
        yield kafka


@pytest.fixture(scope="session")
def kafka_bootstrap(local_kafka: LocalKafka | None) -> str:
    """Bootstrap ``host:port`` of the session's real Kafka broker (plaintext listener)."""
    if local_kafka is None:
        return os.environ[ENV_BOOTSTRAP]
    return local_kafka.bootstrap


@pytest.fixture(scope="session")
def kafka_sasl(local_kafka: LocalKafka | None) -> Iterator[SaslBroker]:
    """The SASL/SCRAM listener of the session broker (with an external broker, a local
    one of its own starts for these tests)."""
    with ExitStack() as stack:
        kafka = local_kafka or stack.enter_context(_local_broker())
        assert kafka.sasl_bootstrap is not None
        yield SaslBroker(kafka.sasl_bootstrap, dict(SCRAM_USERS), kafka.bootstrap)


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A fresh topic name derived from the test's name."""
    return unique_topic(request.node.name)


CLUSTER_BROKERS = 3
# The test cluster's and TLS broker's JVMs: C1 only and the serial collector start a node
# in about half the CPU on 2 cores (cluster up 13 s against 29-31 s, measured 2026-12-02);
# their steady throughput is more than these tests need.
QUICK_START_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[LocalCluster]:
    """A three-node KRaft cluster of the session (every node broker and controller, one
    quorum; replication factor 3, min.insync.replicas 2), for the fault tests; tests may
    kill and restart nodes but must leave all three running."""
    _reap_orphan_brokers(TEST_STATE_BASE)
    state_dir = TEST_STATE_BASE / f"{os.getpid()}-cluster-{uuid.uuid4().hex[:8]}"
    ports = free_ports(2 * CLUSTER_BROKERS)
    nodes = [NodePorts(ports[2 * i], ports[2 * i + 1]) for i in range(CLUSTER_BROKERS)]
    cluster = LocalCluster(state_dir, nodes, libs_dir=SHARED_LIBS_DIR, jvm_options=QUICK_START_JVM)
    try:
        cluster.up()
    except AuthpipeError as exc:
        cluster.down()
        _fail("the test Kafka cluster did not start", exc)
    try:
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(state_dir, ignore_errors=True)


# Client certificate names of the TLS broker's authority: a trusted client, and one of a
# second authority the broker does not trust.
TLS_CLIENT = "authpipe-client"
UNTRUSTED_CLIENT = "intruder"


@dataclass(frozen=True)
class TlsBroker:
    """A test broker's TLS listeners: ``ssl`` (the broker proves itself), ``mtls`` (the
    client must too), ``sasl_ssl`` (SCRAM over TLS, users ``SCRAM_USERS``); ``plaintext``
    is its administrator's loopback listener. ``files``: the authority it trusts;
    ``untrusted``: another authority, with a client certificate ``UNTRUSTED_CLIENT``."""

    ssl: str
    mtls: str
    sasl_ssl: str
    plaintext: str
    files: TlsFiles
    untrusted: TlsFiles

    def env(self, mutual: bool) -> dict[str, str]:
        """AUTHPIPE_KAFKA_* variables of a service on the SSL (or mutual TLS) listener."""
        env = {
            "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": self.mtls if mutual else self.ssl,
            "AUTHPIPE_KAFKA_SECURITY_PROTOCOL": "SSL",
            "AUTHPIPE_KAFKA_SSL_CAFILE": str(self.files.ca_pem),
        }
        if mutual:
            env["AUTHPIPE_KAFKA_SSL_CERTFILE"] = str(self.files.client_cert(TLS_CLIENT))
            env["AUTHPIPE_KAFKA_SSL_KEYFILE"] = str(self.files.client_key(TLS_CLIENT))
        return env


@pytest.fixture(scope="session")
def kafka_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    """A broker of its own with TLS, mutual-TLS and SASL_SSL listeners, certificates from
    a keytool authority made for the session (and a second, untrusted, authority)."""
    _reap_orphan_brokers(TEST_STATE_BASE)
    base = tmp_path_factory.mktemp("tls")
    try:
        files = make_authority(base / "ca", (TLS_CLIENT,))
        untrusted = make_authority(base / "untrusted-ca", (UNTRUSTED_CLIENT,), broker=False)
    except AuthpipeError as exc:
        _fail("the test TLS authority could not be made", exc)
    state_dir = TEST_STATE_BASE / f"{os.getpid()}-tls-{uuid.uuid4().hex[:8]}"
    port, controller_port, ssl_port, mtls_port, sasl_ssl_port = free_ports(5)
    kafka = LocalKafka(
        state_dir,
        port,
        controller_port,
        libs_dir=SHARED_LIBS_DIR,
        scram_users=SCRAM_USERS,
        tls=TlsListeners(files, ssl_port, mtls_port, sasl_ssl_port),
        jvm_options=QUICK_START_JVM,
    )
    _start_local(kafka)
    try:
        yield TlsBroker(
            ssl=f"127.0.0.1:{ssl_port}",
            mtls=f"127.0.0.1:{mtls_port}",
            sasl_ssl=f"127.0.0.1:{sasl_ssl_port}",
            plaintext=kafka.bootstrap,
            files=files,
            untrusted=untrusted,
        )
    finally:
        kafka.down()
        shutil.rmtree(state_dir, ignore_errors=True)
