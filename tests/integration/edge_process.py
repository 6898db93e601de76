"""An ``authpipe edge serve`` process on the test broker, and ``authpipe`` commands run
with the same configuration (for the operator's block-list and the nginx round trip)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.plugins.kafka import REPO_ROOT
from tests.plugins.waiting import wait_until
from tests.unit.test_edge_support import DIGEST_KEY

TOKEN = "edge-process-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START_TIMEOUT_S = 60.0


def write_config(tmp_path: Path, kafka_bootstrap: str, topic: str) -> Path:
    config = tmp_path / "authpipe.toml"
    config.write_text(
        f'[kafka]\nbootstrap_servers = "{kafka_bootstrap}"\ndecisions_topic = "{topic}"\n'
        f'[identity]\ndigest_key = "{DIGEST_KEY}"\n'
        f'[edge]\ntoken = "{TOKEN}"\n[log]\nformat = "json"\n'
    )
    return config


def env_for(config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTHPIPE_")}
    env["AUTHPIPE_CONFIG"] = str(config)
    return env


def authpipe(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``authpipe <args>`` to completion with the test's configuration."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=REPO_ROOT,
        env=env_for(config),
        capture_output=True,
        text=True,
        timeout=120,
    )


def get(url: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=AUTH)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


@contextmanager
def edge_serving(config: Path, port: int, log_path: Path) -> Iterator[str]:
    """Start the edge, wait until it is ready; yields its base URL; kills it at the end."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "edge", "serve", "--port", str(port)],
            cwd=REPO_ROOT,
            env=env_for(config),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(
                lambda: process.poll() is not None or get(f"{base}/readyz")[0] == 200,
                START_TIMEOUT_S,
                interval_s=0.2,
                description="the edge to be ready",
            )
            assert process.poll() is None, log_path.read_text(errors="replace")[-2000:]
            yield base
        finally:
            process.kill()
            process.wait(15)
