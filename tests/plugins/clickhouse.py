"""ClickHouse fixtures: a chdb data directory, the chdb-backed HTTP endpoint, both backends.

* ``chdb_path``: a fresh, not yet created chdb data directory.
* ``chhttp``: the HTTP endpoint of :mod:`tests.chhttp` in its own process on a free
  loopback port, ready (``/ping`` answers) when the test starts; ``stop()``/``start()``
  take it down and bring it back on the same port and data, to simulate an outage.
* ``clickhouse_settings`` / ``clickhouse``: parametrized over ``chdb`` (embedded) and
  ``http`` (clickhouse-connect to ``chhttp``), each in a fresh data directory with the
  migrations applied, so one test runs against both backends.

Helpers for tests that write attempts: ``ATTEMPT_COLUMNS``, ``attempt_row``, ``recent_minute``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipeline.contracts.models import AUDIT_COLUMNS
from pipeline.settings import ClickHouseSettings
from pipeline.sinks.clickhouse import ClickHouse
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.migrate import apply_migrations

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
PING_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.05
BACKENDS = ("chdb", "http")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ChHttpEndpoint:
    """The chdb-backed HTTP endpoint as a subprocess that can be stopped and restarted."""

    def __init__(self, data_path: Path, port: int, log_path: Path) -> None:
        self.data_path = data_path
        self.port = port
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL to put in ``clickhouse.url`` (any user and password are accepted)."""
        return f"http://authpipe:test@127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the endpoint and wait until ``/ping`` answers; fail with its log if not."""
        if self.running:
            raise RuntimeError(f"chhttp on port {self.port} is already running")
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.chhttp",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--path",
                    str(self.data_path),
                ],
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_ready()

    def stop(self) -> None:
        """Stop the endpoint (SIGTERM, then SIGKILL after STOP_TIMEOUT_S); data is kept."""
        process = self._process
        self._process = None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def ping(self) -> bool:
        """True when ``GET /ping`` answers ``Ok.``."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/ping", timeout=PING_TIMEOUT_S
            ) as response:
                return bool(response.read() == b"Ok.\n")
        except OSError:
            return False

    def _wait_ready(self) -> None:
        process = self._process
        assert process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.ping():
                return
            try:
                code = process.wait(timeout=POLL_INTERVAL_S)
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError(f"chhttp exited with {code} before ready:\n{self._log_tail()}")
        self.stop()
        raise RuntimeError(
            f"chhttp did not answer /ping within {START_TIMEOUT_S:.0f} s:\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture
def chdb_path(tmp_path: Path) -> Path:
    """A fresh chdb data directory (not created yet)."""
    return tmp_path / "chdb"


@pytest.fixture
def chhttp(tmp_path: Path) -> Iterator[ChHttpEndpoint]:
    """The chdb-backed HTTP endpoint, running, with its own data directory; stopped after."""
    endpoint = ChHttpEndpoint(tmp_path / "chhttp-data", free_port(), tmp_path / "chhttp.log")
    endpoint.start()
    try:
        yield endpoint
    finally:
        endpoint.stop()


@pytest.fixture(params=BACKENDS)
def clickhouse_settings(request: pytest.FixtureRequest, chdb_path: Path) -> ClickHouseSettings:
    """Settings for one backend: ``chdb`` in chdb_path, or ``http`` to a fresh chhttp."""
    if request.param == "http":
        endpoint: ChHttpEndpoint = request.getfixturevalue("chhttp")
        return ClickHouseSettings(url=endpoint.url, path=chdb_path)
    return ClickHouseSettings(path=chdb_path)


@pytest.fixture
def clickhouse(clickhouse_settings: ClickHouseSettings) -> Iterator[ClickHouse]:
    """An open ClickHouse on a fresh data directory with every migration applied."""
    with open_clickhouse(clickhouse_settings, create_database=True) as ch:
        apply_migrations(ch, clickhouse_settings)
        yield ch


# The attempts table: the audit batches' columns with the timestamp as ``ts``.
ATTEMPT_COLUMNS = ("ts", *AUDIT_COLUMNS[1:])


def recent_minute() -> datetime:
    """The start of a minute an hour ago: inside every TTL, away from 'now'."""
    return (datetime.now(UTC) - timedelta(hours=1)).replace(second=0, microsecond=0)


def attempt_row(
    ts: datetime | int,
    event_id: str,
    *,
    tenant: str = "acme",
    account_digest: str = "a" * 32,
    account: str | None = None,
    source: str = "203.0.113.7",
    outcome: str = "failure",
    weight: int = 1,
    offset: int = 0,
) -> list[Any]:
    """One ``attempts`` row in ATTEMPT_COLUMNS order."""
    return [
        ts,
        tenant,
        "idp",
        "login",
        account_digest,
        account,
        source,
        "dev-1",
        False,
        outcome,
        "bad_password" if outcome == "failure" else "",
        "allowed",
        weight,
        weight > 1,
        "policy-1",
        event_id,
        "auth.audit",
        3,
        offset,
    ]
