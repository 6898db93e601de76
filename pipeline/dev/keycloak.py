"""A local Keycloak with authpipe's provider (issue 47): ``authpipe keycloak up|down|status``
and the tests' fixture.

``scripts/keycloak-setup`` builds the provider and leaves an optimized Keycloak dist in a
cache outside the clone (``cache_dir()``). Each instance gets its own home under
``state_dir``: ``lib``, ``providers`` and ``themes`` link to the cached dist, ``conf`` and
``data`` (the embedded H2 database, ``data/import`` with the realm) are its own, so two
instances never share a database. ``up`` starts ``kc.sh start --optimized`` (the Java
command kc.sh runs, without the shell around it) on loopback with the realm imported, the
event listener pointing at the broker and the authenticator at the edge, and returns once
the realm answers; ``down`` stops it. State layout::

    home/{lib,providers,themes -> dist, conf/, data/}  keycloak.pid  keycloak.log  admin.password
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pipeline.dev.errors import StackError
from pipeline.dev.processes import (
    POLL_INTERVAL_S,
    java_binary,
    pid_alive,
    port_free,
    process_cmdline,
    tail_lines,
    wait_gone,
)
from pipeline.logs import get_logger

log = get_logger("keycloak")

KEYCLOAK_VERSION = "26.5.6"
REPO_ROOT = Path(__file__).resolve().parents[2]
REALM_FILE = REPO_ROOT / "integrations" / "keycloak" / "realm" / "authpipe-realm.json"
REALM = "authpipe"
DEFAULT_PORT = 8180
ADMIN_USER = "admin"
_LINKED = ("lib", "providers", "themes")
_ENTRY = "io.quarkus.bootstrap.runner.QuarkusEntryPoint"


class KeycloakError(StackError):
    """The local Keycloak could not be prepared, started or stopped."""


def cache_dir() -> Path:
    """Where ``scripts/keycloak-setup`` keeps the dist (``AUTHPIPE_KEYCLOAK_CACHE``, else
    ``$XDG_CACHE_HOME/authpipe/keycloak/<version>``, else under ``~/.cache``)."""
    explicit = os.environ.get("AUTHPIPE_KEYCLOAK_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "authpipe" / "keycloak" / KEYCLOAK_VERSION


def dist_dir() -> Path:
    """The built dist; KeycloakError naming the fix when scripts/keycloak-setup has not run."""
    dist = cache_dir() / f"keycloak-{KEYCLOAK_VERSION}"
    if not (dist / ".authpipe-build").is_file() or not (dist / "lib" / "quarkus-run.jar").is_file():
        raise KeycloakError(
            f"no Keycloak {KEYCLOAK_VERSION} built with authpipe's provider in {dist}; "
            "run `bash scripts/keycloak-setup` (Java 17+ and Maven needed)"
        )
    return dist


@dataclass(frozen=True)
class ProviderConfig:
    """What the provider is told: the broker (with authpipe's TLS/SASL choices), the edge.
    ``spi_options`` renders them as Keycloak's ``--spi-...`` options."""

    bootstrap_servers: str
    edge_url: str
    edge_token: str | None = None
    timeout_ms: int = 250
    fail_open: bool = True
    captcha_key: str | None = None
    topic: str = "auth.login-attempts"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "SCRAM-SHA-512"
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    extra: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.edge_url.startswith(("http://", "https://")):
            raise KeycloakError(f"edge URL {self.edge_url!r} must start with http:// or https://")
        if self.timeout_ms <= 0:
            raise KeycloakError(f"timeout_ms {self.timeout_ms} must be positive (milliseconds)")

    def spi_options(self) -> list[str]:
        listener = "--spi-events-listener--authpipe--"
        check = "--spi-authenticator--authpipe-edge-check--"
        values = {
            f"{listener}bootstrap-servers": self.bootstrap_servers,
            f"{listener}topic": self.topic,
            f"{listener}security-protocol": self.security_protocol,
            f"{listener}sasl-mechanism": self.sasl_mechanism,
            f"{listener}sasl-username": self.sasl_username,
            f"{listener}sasl-password": self.sasl_password,
            f"{listener}ssl-cafile": self.ssl_cafile,
            f"{listener}ssl-certfile": self.ssl_certfile,
            f"{listener}ssl-keyfile": self.ssl_keyfile,
            f"{check}edge-url": self.edge_url,
            f"{check}edge-token": self.edge_token,
            f"{check}timeout-ms": str(self.timeout_ms),
            f"{check}fail-open": "true" if self.fail_open else "false",
            f"{check}captcha-key": self.captcha_key,
        }
        return [f"{k}={v}" for k, v in values.items() if v is not None] + list(self.extra)


@dataclass(frozen=True)
class KeycloakStatus:
    running: bool
    pid: int | None
    url: str
    log_path: Path

    def lines(self) -> list[str]:
        return [
            f"keycloak: {'running' if self.running else 'stopped'}",
            f"pid: {self.pid if self.pid is not None else '-'}",
            f"url: {self.url} (realm {REALM}: {self.url}/realms/{REALM}/account)",
            f"log: {self.log_path}",
        ]


class LocalKeycloak:
    """One local Keycloak whose state lives in ``state_dir``."""

    def __init__(
        self,
        state_dir: Path,
        port: int,
        provider: ProviderConfig,
        *,
        dist: Path | None = None,
        realm_file: Path = REALM_FILE,
        heap_mb: int = 512,
        start_timeout_s: float = 180.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        if not 1 <= port <= 65534:
            raise KeycloakError(f"port {port}: pick 1-65534 (the management port is port + 1)")
        if not realm_file.is_file():
            raise KeycloakError(f"realm file {realm_file} does not exist")
        self.state_dir = state_dir.resolve()
        self.port = port
        self.provider = provider
        self._dist = dist
        self.realm_file = realm_file
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def home(self) -> Path:
        return self.state_dir / "home"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "keycloak.log"

    @property
    def pid_path(self) -> Path:
        return self.state_dir / "keycloak.pid"

    def admin_password(self) -> str:
        """The bootstrap administrator's password (user ``admin``), made once per state dir."""
        path = self.state_dir / "admin.password"
        if not path.is_file():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(18) + "\n")
            path.chmod(0o600)
        return path.read_text().strip()

    def running_pid(self) -> int | None:
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        cmdline = process_cmdline(pid)
        if pid_alive(pid) and _ENTRY in cmdline and f"-Dkc.home.dir={self.home}" in cmdline:
            return pid
        return None

    def status(self) -> KeycloakStatus:
        pid = self.running_pid()
        return KeycloakStatus(pid is not None, pid, self.url, self.log_path)

    def up(self) -> KeycloakStatus:
        """Start unless ours already runs; return once the realm answers."""
        started = time.monotonic()
        pid = self.running_pid()
        if pid is None:
            for port in (self.port, self.port + 1):
                if not port_free(port):
                    raise KeycloakError(
                        f"port {port} on 127.0.0.1 is in use; stop what holds it or pick "
                        "another with --port (Keycloak uses the port and the next one)"
                    )
            pid = self._spawn(java_binary())
            log.info("keycloak_starting", pid=pid, url=self.url)
        self._wait_ready(pid, started)
        return self.status()

    def down(self) -> bool:
        """Stop our Keycloak (SIGTERM, SIGKILL after stop_timeout_s); False if none ran."""
        pid = self.running_pid()
        if pid is None:
            self.pid_path.unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, self.stop_timeout_s):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not wait_gone(pid, 10.0):
                raise KeycloakError(f"Keycloak pid {pid} survived SIGKILL; check it with `ps`")
        self.pid_path.unlink(missing_ok=True)
        log.info("keycloak_stopped", pid=pid)
        return True

    def log_tail(self, lines: int = 40) -> str:
        try:
            return tail_lines(self.log_path.read_text(errors="replace")[-64 * 1024 :], lines)
        except OSError:
            return "(no keycloak.log yet)"

    # --- steps of up

    def _prepare_home(self, dist: Path) -> None:
        home = self.home
        (home / "data" / "import").mkdir(parents=True, exist_ok=True)
        for name in _LINKED:
            link = home / name
            if link.is_symlink() and link.resolve() != (dist / name).resolve():
                link.unlink()
            if not link.exists():
                link.symlink_to(dist / name)
        if not (home / "conf").is_dir():
            shutil.copytree(dist / "conf", home / "conf")
        shutil.copyfile(self.realm_file, home / "data" / "import" / self.realm_file.name)

    def command(self, java: str, dist: Path) -> list[str]:
        """The Java command ``kc.sh start --optimized`` would run for this instance."""
        return [
            java,
            "-Xms64m",
            f"-Xmx{self.heap_mb}m",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:TieredStopAtLevel=1",
            "-Djava.util.concurrent.ForkJoinPool.common.threadFactory="
            "io.quarkus.bootstrap.forkjoin.QuarkusForkJoinWorkerThreadFactory",
            f"-Dkc.home.dir={self.home}",
            f"-Djboss.server.config.dir={self.home / 'conf'}",
            "-Djava.util.logging.manager=org.jboss.logmanager.LogManager",
            "-Dpicocli.disable.closures=true",
            "-Dquarkus-log-max-startup-records=10000",
            "-cp",
            str(dist / "lib" / "quarkus-run.jar"),
            _ENTRY,
            "start",
            "--optimized",
            "--http-enabled=true",
            "--http-host=127.0.0.1",
            f"--http-port={self.port}",
            f"--http-management-port={self.port + 1}",
            "--hostname-strict=false",
            "--cache=local",
            "--import-realm",
            "--log-level=INFO,org.apache.kafka:ERROR",
            *self.provider.spi_options(),
        ]

    def _spawn(self, java: str) -> int:
        dist = self._dist or dist_dir()
        self._prepare_home(dist)
        env = {
            **os.environ,
            "KC_BOOTSTRAP_ADMIN_USERNAME": ADMIN_USER,
            "KC_BOOTSTRAP_ADMIN_PASSWORD": self.admin_password(),
        }
        with self.log_path.open("ab") as out:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            out.write(f"=== authpipe: starting keycloak at {stamp} ===\n".encode())
            out.flush()
            process = subprocess.Popen(
                self.command(java, dist),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        self.pid_path.write_text(f"{process.pid}\n")
        return process.pid

    def admin(self, method: str, path: str, body: object | None = None) -> object:
        """One call of the admin API under ``/admin/realms/authpipe`` as the bootstrap
        administrator; the JSON answer (None when empty)."""
        form = urllib.parse.urlencode(
            {
                "grant_type": "password",
                "client_id": "admin-cli",
                "username": ADMIN_USER,
                "password": self.admin_password(),
            }
        ).encode()
        token_url = f"{self.url}/realms/master/protocol/openid-connect/token"
        try:
            with urllib.request.urlopen(token_url, data=form, timeout=30) as response:
                token = json.loads(response.read())["access_token"]
            request = urllib.request.Request(
                f"{self.url}/admin/realms/{REALM}{path}",
                method=method,
                data=None if body is None else json.dumps(body).encode(),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                text = response.read()
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            raise KeycloakError(
                f"Keycloak's admin API refused {method} {path}: {exc}; is it running at "
                f"{self.url} with the admin password in {self.state_dir / 'admin.password'}?"
            ) from exc
        return json.loads(text) if text else None

    def point_smtp_at(self, port: int) -> None:
        """The realm's SMTP server: 127.0.0.1:``port`` (a mail sink), no TLS, no login."""
        smtp = {
            "host": "127.0.0.1",
            "port": str(port),
            "from": "keycloak@authpipe.invalid",
            "fromDisplayName": "authpipe demo realm",
            "auth": "false",
            "ssl": "false",
            "starttls": "false",
        }
        self.admin("PUT", "", {"smtpServer": smtp})

    def realm_ready(self) -> bool:
        url = f"{self.url}/realms/{REALM}/.well-known/openid-configuration"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _wait_ready(self, pid: int, started: float) -> None:
        deadline = started + self.start_timeout_s
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                self.pid_path.unlink(missing_ok=True)
                raise KeycloakError(
                    f"Keycloak (pid {pid}) exited during start; {self.log_path} ends with:\n"
                    f"{self.log_tail()}"
                )
            if self.realm_ready():
                log.info("keycloak_ready", pid=pid, elapsed_s=round(time.monotonic() - started, 1))
                return
            time.sleep(POLL_INTERVAL_S * 5)
        tail = self.log_tail()
        self.down()
        raise KeycloakError(
            f"Keycloak (pid {pid}) did not serve realm {REALM} at {self.url} within "
            f"{self.start_timeout_s:.0f}s and was stopped; {self.log_path} ends with:\n{tail}"
        )
