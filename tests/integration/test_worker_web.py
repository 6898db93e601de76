"""The worker's web port on a real worker: loopback only, and only health, readiness and
metrics (issue 15, item 13): faust's pages that show or reroute internal state are gone."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.worker import start_worker

pytestmark = pytest.mark.integration


def status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp) of the sockets listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, _, port_hex = fields[1].rpartition(":")
            if fields[3] == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_worker_web_serves_only_health_readiness_and_metrics_on_loopback(
    worker_env: dict[str, str], workers: list[Any], tmp_path: Path
) -> None:
    """/healthz, /readyz and /metrics answer 200; faust's /router, /table, /stats, /graph,
    /performance and /assignment answer 404; the port listens on 127.0.0.1 only."""
    worker = start_worker(workers, worker_env, tmp_path).wait_ready()
    assert {path: status(worker.port, path) for path in ("/healthz", "/readyz", "/metrics")} == {
        "/healthz": 200,
        "/readyz": 200,
        "/metrics": 200,
    }
    faust_pages = ("/router/", "/table/", "/stats/", "/graph/", "/performance/", "/assignment/")
    assert {path: status(worker.port, path) for path in faust_pages} == dict.fromkeys(
        faust_pages, 404
    )
    assert listening_addresses(worker.port) == {"0100007F"}  # 127.0.0.1
