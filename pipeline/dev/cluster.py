"""A local KRaft cluster: ``brokers`` nodes on loopback, each broker and controller, one
controller quorum of all of them, from the same jars as the single node (``LocalKafka``).

Node ``i`` (1-based) lives in ``<state_dir>/node-<i>`` with the ports given for it; every
node is formatted with one cluster id. ``up`` spawns every node before waiting for any
(a node answers only once a majority of controllers runs). Invariant: topics created on
the cluster are replicated ``brokers`` times and writes need ``cluster_min_insync`` of
them in sync (the brokers' defaults; authpipe's own topics say so explicitly too).

A node may listen on another local address than 127.0.0.1 (``NodePorts.host``), and run
inside a network namespace (``NodePorts.netns``, made beforehand, e.g. with ``ip netns
add`` and a veth pair): the fault tests cut such a node off the others by its link.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.dev.broker_config import new_cluster_id
from pipeline.dev.errors import BrokerStartError, StackError
from pipeline.dev.processes import pid_alive, run_sync
from pipeline.dev.stack import LocalKafka, TlsListeners
from pipeline.dev.tls import TlsFiles

if TYPE_CHECKING:
    from pipeline.kafka_admin import PartitionReplicas


@dataclass(frozen=True)
class NodePorts:
    """One node's ports: its PLAINTEXT client listener and its controller listener, and
    (with TLS) its server-TLS and mutual-TLS listeners."""

    port: int
    controller_port: int
    ssl_port: int | None = None
    mtls_port: int | None = None
    host: str = "127.0.0.1"
    netns: str | None = None


LOOPBACK = "127.0.0.1"


class HostedKafka(LocalKafka):
    """A LocalKafka node listening on ``host`` instead of 127.0.0.1 and, with ``netns``,
    run (and formatted) inside that network namespace with ``ip netns exec``; the
    namespace and the route to ``host`` are the caller's (``LocalCluster`` sets both)."""

    host: str = LOOPBACK
    netns: str | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def _write_config(self) -> None:
        super()._write_config()
        lines = []
        for line in self.properties_path.read_text().splitlines():
            key = line.partition("=")[0]
            if key in ("listeners", "advertised.listeners"):
                line = line.replace(f"//{LOOPBACK}:", f"//{self.host}:")
            lines.append(line)
        self.properties_path.write_text("\n".join(lines) + "\n")

    def _jvm(self, java: str) -> list[str]:
        prefix = ["ip", "netns", "exec", self.netns] if self.netns is not None else []
        return [*prefix, *super()._jvm(java)]

    def wait_ready(self, pid: int) -> None:
        """Until the node answers metadata at ``host`` (the base class probes 127.0.0.1)."""
        from pipeline.kafka_admin import BrokerUnavailableError, wait_for_broker

        deadline = time.monotonic() + self.start_timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            try:
                run_sync(wait_for_broker(self.bootstrap, timeout_s=5.0))
            except BrokerUnavailableError:
                continue
            return
        alive = pid_alive(pid)
        if alive:
            self.down()
        raise BrokerStartError(
            f"the Kafka broker (pid {pid}) {'did not answer' if alive else 'exited'} at "
            f"{self.bootstrap} (netns {self.netns}); {self.log_path} ends with:\n{self.log_tail()}"
        )


class LocalCluster:
    """``len(ports)`` LocalKafka nodes forming one KRaft cluster in ``state_dir``."""

    def __init__(
        self,
        state_dir: Path,
        ports: list[NodePorts],
        *,
        libs_dir: Path,
        tls: TlsFiles | None = None,
        heap_mb: int = 384,
        jvm_options: tuple[str, ...] = (),
    ) -> None:
        if not ports:
            raise StackError("a cluster needs at least one node; give one NodePorts per node")
        self.state_dir = state_dir.resolve()
        voters = ",".join(f"{i}@{p.host}:{p.controller_port}" for i, p in enumerate(ports, 1))
        id_path = self.state_dir / "cluster.id"
        if not id_path.exists():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            id_path.write_text(new_cluster_id() + "\n")
        cluster_id = id_path.read_text().strip()
        self.nodes: list[LocalKafka] = []
        for i, p in enumerate(ports, 1):
            kind = LocalKafka if p.host == LOOPBACK and p.netns is None else HostedKafka
            node = kind(
                self.state_dir / f"node-{i}",
                p.port,
                p.controller_port,
                libs_dir=libs_dir,
                heap_mb=heap_mb,
                stop_timeout_s=15.0,
                jvm_options=jvm_options,
                node_id=i,
                voters=voters,
                replicas=len(ports),
                cluster_id=cluster_id,
                tls=_node_tls(tls, p),
            )
            if isinstance(node, HostedKafka):
                node.host, node.netns = p.host, p.netns
            self.nodes.append(node)

    @property
    def bootstrap(self) -> str:
        """Every node's PLAINTEXT listener, comma-separated (what clients take)."""
        return ",".join(node.bootstrap for node in self.nodes)

    def tls_bootstrap(self, mutual: bool) -> str:
        """Every node's server-TLS (or, ``mutual``, mutual-TLS) listener."""
        ports = [
            (node.tls.mtls_port if mutual else node.tls.ssl_port)
            for node in self.nodes
            if node.tls is not None
        ]
        if not ports:
            raise StackError("this cluster has no TLS listeners; start it with tls files")
        return ",".join(f"127.0.0.1:{port}" for port in ports)

    def node(self, node_id: int) -> LocalKafka:
        return self.nodes[node_id - 1]

    def up(self) -> None:
        """Start every node that is not running, then wait until each answers metadata."""
        pids = [node.start() for node in self.nodes]
        for node, pid in zip(self.nodes, pids, strict=True):
            node.wait_ready(pid)

    def down(self) -> None:
        """SIGTERM every node at once (one by one, the last would wait for a quorum that is
        gone), then wait for each (SIGKILL after its stop_timeout_s)."""
        for node in self.nodes:
            pid = node.running_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        for node in self.nodes:
            node.down()

    def running(self) -> list[LocalKafka]:
        return [node for node in self.nodes if node.running_pid() is not None]

    def leader_counts(self, topics: list[str]) -> Counter[int]:
        """Partitions of ``topics`` each node leads now."""
        return Counter(p.leader for p in self.partitions() if p.topic in topics)

    def partitions(self) -> list[PartitionReplicas]:
        """Every partition's leader and replicas, asked of the running nodes."""
        from pipeline.kafka_admin import describe_partitions

        alive = self.running()
        if not alive:
            return []
        found: list[PartitionReplicas] = []

        async def ask() -> None:
            found.extend(await describe_partitions(",".join(n.bootstrap for n in alive)))

        run_sync(ask())
        return found

    def status_lines(self) -> list[str]:
        """One line per node, then the under-replicated partitions (``stack status``)."""
        lines = []
        for node in self.nodes:
            pid = node.running_pid()
            listeners = [node.bootstrap]
            if node.tls is not None:
                listeners += [
                    f"ssl 127.0.0.1:{node.tls.ssl_port}",
                    f"mtls 127.0.0.1:{node.tls.mtls_port}",
                ]
            state = f"running (pid {pid})" if pid is not None else "stopped"
            lines.append(f"node {node.node_id}: {state} {' '.join(listeners)} log {node.log_path}")
        if self.running():
            under = [p for p in self.partitions() if p.under_replicated]
            shown = ", ".join(f"{p.topic}-{p.partition} isr={list(p.isr)}" for p in under[:10])
            more = f" (+{len(under) - 10} more)" if len(under) > 10 else ""
            lines.append(
                f"under-replicated partitions: {len(under)}" + (f": {shown}{more}" if under else "")
            )
        return lines


def _node_tls(tls: TlsFiles | None, ports: NodePorts) -> TlsListeners | None:
    if tls is None:
        return None
    if ports.ssl_port is None or ports.mtls_port is None:
        raise StackError("a TLS cluster needs ssl_port and mtls_port for every node")
    return TlsListeners(tls, ports.ssl_port, ports.mtls_port)
