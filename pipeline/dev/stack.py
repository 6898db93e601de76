"""The local dev stack: a real single-node Apache Kafka broker (KRaft), no Docker.

``authpipe stack up|down|status`` and the test fixture both use ``LocalKafka``:

* jars: Maven copies the broker classpath (``deploy/local/kafka/pom.xml``) into
  ``libs/`` once; a marker file records the Kafka version and the POM digest, so a
  version bump fetches again;
* config: ``server.properties`` rendered from ``deploy/local/kafka/server.properties.template``;
* storage formatted once (``StorageTool format --ignore-formatted``), data in ``data/``;
* the broker runs detached (own session), output in ``broker.log``, pid in ``broker.pid``;
  ``up`` returns once the broker answers a metadata request.

State layout (``<state_dir>`` = ``settings.state_dir / "kafka"`` for the CLI)::

    libs/  data/  server.properties  log4j2.properties  cluster.id  broker.pid  broker.log
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.errors import AuthpipeError
from pipeline.logs import configure_logging, get_logger
from pipeline.settings import Settings, ensure_digest_key_file

log = get_logger("stack")

KAFKA_DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy" / "local" / "kafka"
POM_PATH = KAFKA_DEPLOY_DIR / "pom.xml"
TEMPLATE_PATH = KAFKA_DEPLOY_DIR / "server.properties.template"
LOG4J_PATH = KAFKA_DEPLOY_DIR / "log4j2.properties"

LIBS_MARKER = ".authpipe-libs"
MIN_JAVA_MAJOR = 17
EXIT_RUNNING = 0
EXIT_STOPPED = 3
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})

_POLL_INTERVAL_S = 0.1
_MAVEN_TIMEOUT_S = 900.0
_FORMAT_TIMEOUT_S = 120.0
_LOG_TAIL_LINES = 40
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


class StackError(AuthpipeError):
    """The local Kafka broker could not be prepared, started or stopped."""


class MissingToolError(StackError):
    """``java`` or ``mvn`` is not installed (or too old)."""


class BrokerStartError(StackError):
    """The broker process exited or did not become ready in time."""


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


# --- pure helpers -------------------------------------------------------------------------


def new_cluster_id() -> str:
    """A KRaft cluster id: base64url of 16 random bytes, without padding.

    Like Kafka's ``Uuid.randomUuid``, never one starting with ``-``: StorageTool's
    argument parser would take ``-t -abc...`` for an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode("ascii")
        if not cluster_id.startswith("-"):
            return cluster_id


def kafka_version(pom_text: str) -> str:
    """The ``kafka.version`` property of the broker POM."""
    node = ET.fromstring(pom_text).find("m:properties/m:kafka.version", _POM_NS)
    if node is None or not (node.text or "").strip():
        raise StackError(f"{POM_PATH} has no <kafka.version> property; restore it from git")
    return (node.text or "").strip()


def libs_marker_text(pom_text: str) -> str:
    """Marker content: the Kafka version plus the POM digest (any POM change re-fetches)."""
    digest = hashlib.sha256(pom_text.encode("utf-8")).hexdigest()
    return f"kafka {kafka_version(pom_text)}\npom-sha256 {digest}\n"


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
    lines += ["", "# --- SASL/SCRAM listener (LocalKafka sasl_port); users added at format time",
              f"sasl.enabled.mechanisms={','.join(SCRAM_MECHANISMS)}",
              "# ACLs decide what each SASL user may do; the loopback plaintext and controller",
              "# listeners (principal ANONYMOUS) stay the local administrator's.",
              "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
              "super.users=User:ANONYMOUS",
              "allow.everyone.if.no.acl.found=false"]  # fmt: skip
    lines += [f"listener.name.sasl_plaintext.{m.lower()}.sasl.jaas.config={_SCRAM_LOGIN}" for m in SCRAM_MECHANISMS]
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


def java_major(version_output: str) -> int | None:
    """Major version from ``java -version`` output (``1.8.0`` is 8, ``17.0.15`` is 17)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def is_broker_cmdline(cmdline: Sequence[str], properties_path: Path) -> bool:
    """True if a command line is ``java ... kafka.Kafka <our server.properties>``."""
    return (
        bool(cmdline)
        and Path(cmdline[0]).name.startswith("java")
        and "kafka.Kafka" in cmdline
        and str(properties_path) in cmdline
    )


def tail_lines(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


# --- process helpers ----------------------------------------------------------------------


def _cmdline(pid: int) -> list[str]:
    proc = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self").exists():
        try:
            return [part for part in proc.read_bytes().decode(errors="replace").split("\0") if part]
        except OSError:
            return []
    result = subprocess.run(
        ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, check=False
    )
    return result.stdout.split()


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int) -> bool:
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(_POLL_INTERVAL_S)
    return not pid_alive(pid)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _run_sync(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine to completion, also when called from inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, coro).result()


def _require_tool(name: str, install_hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise MissingToolError(f"`{name}` was not found on PATH; {install_hint}")
    return path


def _java() -> str:
    java = _require_tool(
        "java", "install a Java 17+ runtime (e.g. `apt-get install openjdk-17-jre-headless`)"
    )
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    major = java_major(result.stderr + result.stdout)
    if major is not None and major < MIN_JAVA_MAJOR:
        raise MissingToolError(
            f"{java} is Java {major}; Kafka 4 needs Java {MIN_JAVA_MAJOR}+; "
            "install a newer JDK/JRE and put it first on PATH"
        )
    return java


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- jars ---------------------------------------------------------------------------------


def libs_ready(libs_dir: Path, pom_path: Path = POM_PATH) -> bool:
    marker = libs_dir / LIBS_MARKER
    try:
        return marker.read_text() == libs_marker_text(pom_path.read_text())
    except OSError:
        return False


def fetch_libs(libs_dir: Path, pom_path: Path = POM_PATH) -> Path:
    """Copy the broker classpath into ``libs_dir`` with Maven, unless it is already there."""
    if libs_ready(libs_dir, pom_path):
        return libs_dir
    _require_tool("java", "install a Java 17+ runtime (Maven and the broker need it)")
    mvn = _require_tool("mvn", "install Apache Maven 3.6+ (e.g. `apt-get install maven`)")
    with _file_lock(libs_dir.parent / f".{libs_dir.name}.lock"):
        if libs_ready(libs_dir, pom_path):  # another process fetched them meanwhile
            return libs_dir
        pom_text = pom_path.read_text()
        staging = libs_dir.parent / f".{libs_dir.name}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        log.info(
            "kafka_libs_fetching", kafka_version=kafka_version(pom_text), libs_dir=str(libs_dir)
        )
        started = time.monotonic()
        command = [
            mvn, "-q", "-B", "-f", str(pom_path),
            "dependency:copy-dependencies", f"-DoutputDirectory={staging}",
        ]  # fmt: skip
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=_MAVEN_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise StackError(
                f"Maven did not finish fetching the Kafka jars within {_MAVEN_TIMEOUT_S:.0f}s; "
                "check network access to Maven Central (or ~/.m2/settings.xml)"
            ) from exc
        if result.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
            shutil.rmtree(staging, ignore_errors=True)
            raise StackError(
                f"Maven could not fetch the Kafka jars (exit {result.returncode}):\n"
                f"{tail_lines(result.stdout + result.stderr, _LOG_TAIL_LINES)}\n"
                "check network access to Maven Central (or ~/.m2/settings.xml)"
            )
        (staging / LIBS_MARKER).write_text(libs_marker_text(pom_text))
        old = libs_dir.parent / f".{libs_dir.name}.old-{os.getpid()}"
        if libs_dir.is_symlink():
            # A shared jar cache linked in: refresh its target, keep the link.
            target = libs_dir.resolve()
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        else:
            if libs_dir.exists():
                libs_dir.rename(old)
            staging.rename(libs_dir)
            shutil.rmtree(old, ignore_errors=True)
        log.info(
            "kafka_libs_ready",
            libs_dir=str(libs_dir),
            elapsed_s=round(time.monotonic() - started, 1),
        )
    return libs_dir


# --- the broker ---------------------------------------------------------------------------


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
    ) -> None:
        ports = [p for p in (port, controller_port, sasl_port) if p is not None]
        if len(set(ports)) < len(ports):
            raise StackError(f"port, controller_port and sasl_port must all differ ({ports}); use distinct ports")
        if scram_users and sasl_port is None:
            raise StackError("scram_users need a sasl_port (the SASL/SCRAM listener)")
        self.sasl_port = sasl_port
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

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
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
        if pid_alive(pid) and is_broker_cmdline(_cmdline(pid), self.properties_path):
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
        pid = self.running_pid()
        if pid is not None:
            log.info("kafka_already_running", pid=pid, bootstrap=self.bootstrap)
            self._wait_ready(pid, started=time.monotonic())
            return self.status()
        if self.pid_path.exists():
            log.info("kafka_stale_pidfile_removed", pid_path=str(self.pid_path))
            self.pid_path.unlink(missing_ok=True)
        for port in (self.port, self.controller_port, self.sasl_port):
            if port is not None and not port_free(port):
                raise StackError(
                    f"port {port} on 127.0.0.1 is in use by another process; stop it, or pick "
                    "another port (AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:<port>, "
                    "the controller uses <port>+1)"
                )
        java = _java()
        fetch_libs(self.libs_dir)
        self._write_config()
        self._format_storage(java)
        started = time.monotonic()
        pid = self._spawn(java)
        log.info("kafka_starting", pid=pid, bootstrap=self.bootstrap, state_dir=str(self.state_dir))
        self._wait_ready(pid, started)
        return self.status()

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
        if self.sasl_port is not None:
            rendered = add_sasl_listener(rendered, self.sasl_port)
        self.properties_path.write_text(rendered)
        shutil.copyfile(LOG4J_PATH, self.state_dir / "log4j2.properties")

    def _jvm(self, java: str) -> list[str]:
        return [
            java,
            f"-Xmx{self.heap_mb}m",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.state_dir / 'log4j2.properties'}",
            "-cp",
            f"{self.libs_dir}/*",
        ]

    def _cluster_id(self) -> str:
        path = self.state_dir / "cluster.id"
        if not path.exists():
            path.write_text(new_cluster_id() + "\n")
        return path.read_text().strip()

    def _format_storage(self, java: str) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        command = [
            *self._jvm(java), "kafka.tools.StorageTool", "format",
            "-t", self._cluster_id(), "-c", str(self.properties_path), "--ignore-formatted",
            *scram_format_args(self.scram_users),
        ]  # fmt: skip
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=_FORMAT_TIMEOUT_S, check=False
        )
        with self.log_path.open("a") as handle:
            handle.write(result.stdout + result.stderr)
        if result.returncode != 0:
            raise BrokerStartError(
                f"formatting Kafka storage in {self.data_dir} failed (exit {result.returncode}):\n"
                f"{tail_lines(result.stdout + result.stderr, _LOG_TAIL_LINES)}\n"
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
            if _port_accepts(self.port):
                try:
                    _run_sync(wait_for_broker(self.bootstrap, timeout_s=min(remaining_s, 5.0)))
                except BrokerUnavailableError:
                    continue
                log.info(
                    "kafka_ready",
                    pid=pid,
                    bootstrap=self.bootstrap,
                    elapsed_s=round(time.monotonic() - started, 1),
                )
                return
            time.sleep(_POLL_INTERVAL_S)
        tail = self.log_tail()
        self._terminate(pid)
        raise BrokerStartError(
            f"the Kafka broker (pid {pid}) did not answer at {self.bootstrap} within "
            f"{self.start_timeout_s:.0f}s and was stopped; {self.log_path} ends with:\n{tail}"
        )

    def _terminate(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, self.stop_timeout_s):
            log.warning("kafka_kill", pid=pid, waited_s=self.stop_timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not _wait_gone(pid, 10.0):
                raise StackError(f"Kafka broker pid {pid} survived SIGKILL; check it with `ps`")
        self.pid_path.unlink(missing_ok=True)


# --- entry points -------------------------------------------------------------------------


def run_stack_command(action: str, settings: Settings) -> int:
    """``authpipe stack up|down|status``; status exits 0 when running, 3 when stopped."""
    kafka = LocalKafka.from_settings(settings)
    if action == "up":
        status = kafka.up()
        if settings.identity.digest_key is None:
            key_path = ensure_digest_key_file(settings.state_dir)
            print(f"digest key: {key_path} (identity.digest_key; give gateways the same key)")
    elif action == "down":
        kafka.down()
        status = kafka.status()
    elif action == "status":
        status = kafka.status()
    else:
        raise StackError(f"unknown stack action {action!r}; use up, down or status")
    print("\n".join(status.lines()), flush=True)
    if action == "status":
        return EXIT_RUNNING if status.running else EXIT_STOPPED
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipeline.dev.stack fetch-libs <dir>``: pre-fetch the broker jars (scripts/setup)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "fetch-libs":
        print("usage: python -m pipeline.dev.stack fetch-libs <libs-dir>", file=sys.stderr)
        return 2
    configure_logging(one_shot=True)  # like `authpipe stack`: console lines on stderr
    try:
        fetch_libs(Path(args[1]).absolute())
    except AuthpipeError as exc:
        print(f"authpipe: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
