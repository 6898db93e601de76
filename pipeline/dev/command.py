"""``authpipe stack up|down|status [--brokers N] [--tls]``: the local single node, or a
cluster of N nodes, optionally with TLS listeners.

Layout for ``bootstrap_servers`` port ``P`` and N nodes: node ``i`` (0-based) listens
PLAINTEXT on ``P + 2i`` and CONTROLLER on ``P + 2i + 1``; with ``--tls``, server TLS on
``P + 2N + 2i`` and mutual TLS on ``P + 2N + 2i + 1``. One node keeps its state in
``<state_dir>/kafka`` (as before); a cluster in ``<state_dir>/kafka-cluster/node-<i>``;
TLS material in ``<state_dir>/kafka-tls``. ``up`` records the layout in
``<state_dir>/kafka-stack.json`` so ``down`` and ``status`` need no flags (``up`` takes
only its own: one plaintext node unless told otherwise).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.dev.broker_config import cluster_min_insync, parse_local_port
from pipeline.dev.cluster import LocalCluster, NodePorts
from pipeline.dev.errors import StackError
from pipeline.dev.stack import LocalKafka, TlsListeners
from pipeline.dev.tls import TlsFiles, make_authority
from pipeline.settings import Settings, ensure_digest_key_file

EXIT_RUNNING = 0
EXIT_STOPPED = 3
LAYOUT_FILE = "kafka-stack.json"
CLIENT_NAME = "authpipe-client"
MAX_BROKERS = 9


def stack_tls_dir(settings: Settings) -> Path:
    """Where ``stack up --tls`` keeps its CA, keystores and client certificates."""
    return settings.state_dir / "kafka-tls"


def _saved_layout(settings: Settings) -> tuple[int, bool]:
    """(brokers, tls) of the last ``stack up`` in this state dir; (1, False) if none."""
    path = settings.state_dir / LAYOUT_FILE
    saved = json.loads(path.read_text()) if path.is_file() else {}
    return int(saved.get("brokers", 1)), bool(saved.get("tls", False))


def build_stack(settings: Settings, brokers: int, tls: bool) -> LocalCluster | LocalKafka:
    """The stack ``stack up --brokers brokers [--tls]`` runs (nothing started yet)."""
    if not 1 <= brokers <= MAX_BROKERS:
        raise StackError(
            f"--brokers {brokers}: run 1 to {MAX_BROKERS} local brokers (3 for a cluster)"
        )
    port = parse_local_port(settings.kafka.bootstrap_servers)
    if port + 4 * brokers > 65535:
        raise StackError(f"port {port} leaves no room for {brokers} brokers; pick a lower port")
    files = TlsFiles(stack_tls_dir(settings)) if tls else None
    ports = [
        NodePorts(
            port + 2 * i,
            port + 2 * i + 1,
            ssl_port=port + 2 * brokers + 2 * i if tls else None,
            mtls_port=port + 2 * brokers + 2 * i + 1 if tls else None,
        )
        for i in range(brokers)
    ]
    libs = settings.state_dir / "kafka" / "libs"
    if brokers > 1:
        return LocalCluster(settings.state_dir / "kafka-cluster", ports, libs_dir=libs, tls=files)
    node = ports[0]
    listeners = None
    if files is not None and node.ssl_port and node.mtls_port:
        listeners = TlsListeners(files, node.ssl_port, node.mtls_port)
    return LocalKafka(settings.state_dir / "kafka", node.port, node.controller_port, tls=listeners)


def _status_lines(stack: LocalCluster | LocalKafka) -> tuple[list[str], bool]:
    if isinstance(stack, LocalKafka):
        status = stack.status()
        lines = status.lines()
        if stack.tls is not None:
            lines.append(
                f"tls: ssl 127.0.0.1:{stack.tls.ssl_port} mtls 127.0.0.1:{stack.tls.mtls_port}"
            )
        return lines, status.running
    lines = [f"kafka: cluster of {len(stack.nodes)}", f"bootstrap: {stack.bootstrap}"]
    lines += stack.status_lines()
    return lines, len(stack.running()) == len(stack.nodes)


def _client_lines(
    stack: LocalCluster | LocalKafka, brokers: int, files: TlsFiles | None
) -> list[str]:
    """The settings a client of this stack takes, as AUTHPIPE_* lines to export."""
    bootstrap = stack.bootstrap
    lines = [f"AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS={bootstrap}"]
    if brokers > 1:
        lines += [
            f"AUTHPIPE_KAFKA_REPLICATION_FACTOR={brokers}",
            f"AUTHPIPE_KAFKA_MIN_INSYNC_REPLICAS={cluster_min_insync(brokers)}",
        ]
    if files is not None:
        if isinstance(stack, LocalCluster):
            mtls = stack.tls_bootstrap(mutual=True)
        else:
            assert stack.tls is not None
            mtls = f"127.0.0.1:{stack.tls.mtls_port}"
        lines += [
            "# over mutual TLS instead (the server-TLS listener takes the same minus the cert):",
            f"#   AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS={mtls}",
            "#   AUTHPIPE_KAFKA_SECURITY_PROTOCOL=SSL",
            f"#   AUTHPIPE_KAFKA_SSL_CAFILE={files.ca_pem}",
            f"#   AUTHPIPE_KAFKA_SSL_CERTFILE={files.client_cert(CLIENT_NAME)}",
            f"#   AUTHPIPE_KAFKA_SSL_KEYFILE={files.client_key(CLIENT_NAME)}",
        ]
    return lines


def run_stack_command(
    action: str, settings: Settings, brokers: int | None = None, tls: bool | None = None
) -> int:
    """``authpipe stack up|down|status``; status exits 0 when every node runs, 3 otherwise."""
    if action not in ("up", "down", "status"):
        raise StackError(f"unknown stack action {action!r}; use up, down or status")
    if action == "up":  # what the flags say (one plaintext node by default)
        count, with_tls = brokers or 1, bool(tls)
    else:  # the layout of the last `up`
        count, with_tls = _saved_layout(settings)
    stack = build_stack(settings, count, with_tls)
    if action == "up":
        files = make_authority(stack_tls_dir(settings), (CLIENT_NAME,)) if with_tls else None
        stack.up()
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        (settings.state_dir / LAYOUT_FILE).write_text(
            json.dumps({"brokers": count, "tls": with_tls})
        )
        if settings.identity.digest_key is None:
            key_path = ensure_digest_key_file(settings.state_dir)
            print(f"digest key: {key_path} (identity.digest_key; give gateways the same key)")
        print("\n".join(_client_lines(stack, count, files)))
    elif action == "down":
        stack.down()
    lines, running = _status_lines(stack)
    print("\n".join(lines), flush=True)
    if action == "status":
        return EXIT_RUNNING if running else EXIT_STOPPED
    return 0
