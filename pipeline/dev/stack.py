"""The local dev stack: a real single-node Apache Kafka broker (KRaft), no Docker.

``authpipe stack up|down|status`` and the test fixture both use ``LocalKafka``:

* jars: ``pipeline.dev.jars`` (Maven, once per POM);
* config: ``pipeline.dev.broker_config`` renders ``server.properties``;
* storage formatted once (``StorageTool format --ignore-formatted``), data in ``data/``;
* the broker runs detached (own session), output in ``broker.log``, pid in ``broker.pid``;
  ``up`` returns once the broker answers a metadata request.

State layout (``<state_dir>`` = ``settings.state_dir / "kafka"`` for the CLI)::

    libs/  data/  server.properties  log4j2.properties  cluster.id  broker.pid  broker.log
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline.dev.broker_config import (
    LOG4J_PATH,
    TEMPLATE_PATH,
    add_sasl_listener,
    add_tls_listeners,
    cluster_node_properties,
    new_cluster_id,
    parse_local_port,
    render_server_properties,
    scram_format_args,
)
from pipeline.dev.errors import BrokerStartError, StackError
from pipeline.dev.jars import LOG_TAIL_LINES, fetch_libs
from pipeline.dev.processes import (
    POLL_INTERVAL_S,
    is_broker_cmdline,
    java_binary,
    pid_alive,
    port_accepts,
    process_cmdline,
    run_sync,
    tail_lines,
    wait_gone,
    wait_port_free,
)
from pipeline.dev.tls import TlsFiles
from pipeline.logs import get_logger
from pipeline.settings import Settings

log = get_logger("stack")

_FORMAT_TIMEOUT_S = 120.0
# A node restarted right after kill -9 may find a port still held for a moment.
_PORT_FREE_WAIT_S = 10.0


@dataclass(frozen=True)
class TlsListeners:
    """A node's TLS listeners: ``ssl_port`` (server TLS), ``mtls_port`` (mutual TLS) and,
    optionally, ``sasl_ssl_port`` (SCRAM over TLS); certificates from ``files``."""

    files: TlsFiles
    ssl_port: int
    mtls_port: int
    sasl_ssl_port: int | None = None

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(p for p in (self.ssl_port, self.mtls_port, self.sasl_ssl_port) if p)


@dataclass(frozen=True)
class StackStatus:
    """What ``authpipe stack status`` reports."""

    running: bool
    pid: int | None
    bootstrap: str
    data_dir: Path
    log_path: Path

    def lines(self) -> list[str]:
        return [
            f"kafka: {'running' if self.running else 'stopped'}",
            f"pid: {self.pid if self.pid is not None else '-'}",
            f"bootstrap: {self.bootstrap}",
            f"data dir: {self.data_dir}",
            f"log: {self.log_path}",
        ]


class LocalKafka:
    """One local single-node KRaft broker whose state lives in ``state_dir``."""

    def __init__(
        self,
        state_dir: Path,
        port: int,
        controller_port: int,
        *,
        libs_dir: Path | None = None,
        heap_mb: int = 512,
        start_timeout_s: float = 120.0,
        stop_timeout_s: float = 30.0,
        sasl_port: int | None = None,
        scram_users: dict[str, str] | None = None,
        node_id: int = 1,
        voters: str | None = None,
        replicas: int = 1,
        tls: TlsListeners | None = None,
        cluster_id: str | None = None,
        jvm_options: tuple[str, ...] = (),
    ) -> None:
        ports = [p for p in (port, controller_port, sasl_port) if p is not None]
        ports += list(tls.ports if tls is not None else ())
        if len(set(ports)) < len(ports):
            raise StackError(
                f"port, controller_port and sasl_port must all differ ({ports}); use distinct ports"
            )
        if scram_users and sasl_port is None and (tls is None or tls.sasl_ssl_port is None):
            raise StackError(
                "scram_users need a sasl_port or a tls.sasl_ssl_port (a SASL/SCRAM listener)"
            )
        self.sasl_port = sasl_port
        self.node_id = node_id
        self.voters = voters
        self.replicas = replicas
        self.tls = tls
        self.cluster_id = cluster_id
        self.jvm_options = jvm_options
        self.scram_users = dict(scram_users or {})
        self.state_dir = state_dir.resolve()
        self.port = port
        self.controller_port = controller_port
        self.libs_dir = (libs_dir or self.state_dir / "libs").absolute()
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalKafka:
        """The CLI's broker: ``<state_dir>/kafka``, port from bootstrap_servers, controller +1."""
        port = parse_local_port(settings.kafka.bootstrap_servers)
        return cls(settings.state_dir / "kafka", port=port, controller_port=port + 1)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str | None:
        """``127.0.0.1:<sasl_port>`` of the SASL/SCRAM listener, if there is one."""
        return None if self.sasl_port is None else f"127.0.0.1:{self.sasl_port}"

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "broker.log"

    @property
    def pid_path(self) -> Path:
        return self.state_dir / "broker.pid"

    @property
    def properties_path(self) -> Path:
        return self.state_dir / "server.properties"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 64 * 1024))
                text = handle.read().decode("utf-8", errors="replace")
        except OSError:
            return "(no broker.log yet)"
        return tail_lines(text, lines)

    def running_pid(self) -> int | None:
        """The pid in broker.pid if that process is alive and is our broker, else None."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        if pid_alive(pid) and is_broker_cmdline(process_cmdline(pid), self.properties_path):
            return pid
        return None

    def status(self) -> StackStatus:
        pid = self.running_pid()
        return StackStatus(
            running=pid is not None,
            pid=pid,
            bootstrap=self.bootstrap,
            data_dir=self.data_dir,
            log_path=self.log_path,
        )

    def up(self) -> StackStatus:
        """Start the broker unless ours already runs; return once it answers metadata."""
        self.wait_ready(self.start())
        return self.status()

    def start(self) -> int:
        """Spawn the broker unless ours already runs (no wait: a cluster's nodes answer
        only once a quorum of controllers is up); its pid."""
        pid = self.running_pid()
        if pid is not None:
            log.info("kafka_already_running", pid=pid, bootstrap=self.bootstrap)
            return pid
        if self.pid_path.exists():
            log.info("kafka_stale_pidfile_removed", pid_path=str(self.pid_path))
            self.pid_path.unlink(missing_ok=True)
        tls_ports = self.tls.ports if self.tls is not None else ()
        for port in (self.port, self.controller_port, self.sasl_port, *tls_ports):
            if port is not None and not wait_port_free(port, _PORT_FREE_WAIT_S):
                raise StackError(
                    f"port {port} on 127.0.0.1 is in use by another process; stop it, or pick "
                    "another port (AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:<port>, "
                    "the controller uses <port>+1)"
                )
        java = java_binary()
        fetch_libs(self.libs_dir)
        self._write_config()
        self._format_storage(java)
        pid = self._spawn(java)
        log.info("kafka_starting", pid=pid, bootstrap=self.bootstrap, state_dir=str(self.state_dir))
        return pid

    def wait_ready(self, pid: int) -> None:
        """Until the broker ``pid`` answers metadata (BrokerStartError after start_timeout_s)."""
        self._wait_ready(pid, started=time.monotonic())

    def kill(self) -> bool:
        """SIGKILL our broker (a crash: no controlled shutdown); False if none ran."""
        pid = self.running_pid()
        if pid is None:
            return False
        log.warning("kafka_sigkill", pid=pid, node_id=self.node_id)
        os.kill(pid, signal.SIGKILL)
        if not wait_gone(pid, 10.0):
            raise StackError(f"Kafka broker pid {pid} survived SIGKILL; check it with `ps`")
        self.pid_path.unlink(missing_ok=True)
        return True

    def down(self) -> bool:
        """Stop our broker (SIGTERM, then SIGKILL after stop_timeout_s); False if none ran."""
        pid = self.running_pid()
        if pid is None:
            self.pid_path.unlink(missing_ok=True)
            log.info("kafka_not_running", state_dir=str(self.state_dir))
            return False
        log.info("kafka_stopping", pid=pid)
        started = time.monotonic()
        self._terminate(pid)
        log.info("kafka_stopped", pid=pid, elapsed_s=round(time.monotonic() - started, 1))
        return True

    # --- steps of up/down

    def _write_config(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        rendered = render_server_properties(
            TEMPLATE_PATH.read_text(), self.port, self.controller_port, self.data_dir
        )
        if self.voters is not None:
            rendered = cluster_node_properties(rendered, self.node_id, self.voters, self.replicas)
        if self.sasl_port is not None:
            rendered = add_sasl_listener(rendered, self.sasl_port)
        if self.tls is not None:
            tls = self.tls
            rendered = add_tls_listeners(
                rendered,
                tls.files.broker_properties(),
                tls.ssl_port,
                tls.mtls_port,
                tls.sasl_ssl_port,
            )
        self.properties_path.write_text(rendered)
        shutil.copyfile(LOG4J_PATH, self.state_dir / "log4j2.properties")

    def _jvm(self, java: str) -> list[str]:
        return [
            java,
            f"-Xmx{self.heap_mb}m",
            "-XX:+ExitOnOutOfMemoryError",
            *self.jvm_options,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.state_dir / 'log4j2.properties'}",
            "-cp",
            f"{self.libs_dir}/*",
        ]

    def _cluster_id(self) -> str:
        path = self.state_dir / "cluster.id"
        if not path.exists():
            path.write_text((self.cluster_id or new_cluster_id()) + "\n")
        return path.read_text().strip()

    def _format_storage(self, java: str) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        command = [
            *self._jvm(java),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self._cluster_id(),
            "-c",
            str(self.properties_path),
            "--ignore-formatted",
            *scram_format_args(self.scram_users),
        ]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=_FORMAT_TIMEOUT_S, check=False
        )
        with self.log_path.open("a") as handle:
            handle.write(result.stdout + result.stderr)
        if result.returncode != 0:
            raise BrokerStartError(
                f"formatting Kafka storage in {self.data_dir} failed (exit {result.returncode}):\n"
                f"{tail_lines(result.stdout + result.stderr, LOG_TAIL_LINES)}\n"
                f"if the data dir is corrupt, remove {self.state_dir / 'data'} and retry"
            )
        log.info("kafka_storage_formatted", data_dir=str(self.data_dir))

    def _spawn(self, java: str) -> int:
        command = [*self._jvm(java), "kafka.Kafka", str(self.properties_path)]
        with self.log_path.open("ab") as out:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            out.write(f"=== authpipe: starting broker at {stamp} ===\n".encode())
            out.flush()
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                start_new_session=True,
                close_fds=True,
            )
        self.pid_path.write_text(f"{process.pid}\n")
        return process.pid

    def _wait_ready(self, pid: int, started: float) -> None:
        from pipeline.kafka_admin import BrokerUnavailableError, wait_for_broker

        deadline = started + self.start_timeout_s
        while True:
            if not pid_alive(pid):
                self.pid_path.unlink(missing_ok=True)
                raise BrokerStartError(
                    f"the Kafka broker (pid {pid}) exited during start; {self.log_path} ends with:\n"
                    f"{self.log_tail()}"
                )
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                break
            if port_accepts(self.port):
                try:
                    run_sync(wait_for_broker(self.bootstrap, timeout_s=min(remaining_s, 5.0)))
                except BrokerUnavailableError:
                    continue
                log.info(
                    "kafka_ready",
                    pid=pid,
                    bootstrap=self.bootstrap,
                    elapsed_s=round(time.monotonic() - started, 1),
                )
                return
            time.sleep(POLL_INTERVAL_S)
        tail = self.log_tail()
        self._terminate(pid)
        raise BrokerStartError(
            f"the Kafka broker (pid {pid}) did not answer at {self.bootstrap} within "
            f"{self.start_timeout_s:.0f}s and was stopped; {self.log_path} ends with:\n{tail}"
        )

    def _terminate(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, self.stop_timeout_s):
            log.warning("kafka_kill", pid=pid, waited_s=self.stop_timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not wait_gone(pid, 10.0):
                raise StackError(f"Kafka broker pid {pid} survived SIGKILL; check it with `ps`")
        self.pid_path.unlink(missing_ok=True)
