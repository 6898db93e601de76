"""Peers and ceiling of the worker benchmark; each runs as its own process.

* ``ceiling``: plain aiokafka ``getmany`` + orjson, nothing else;
* ``naive_faust``: per-event faust agent with two windowed tables;
* ``quix_peer``: Quix Streams windowed counts, in its own virtualenv (``quix``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_peer(command: list[str], timeout_s: float, log_path: Path) -> dict[str, Any]:
    """Run one peer to completion; its last stdout line is its JSON result.

    A peer that fails or times out gives ``{"error": ...}`` (with its log's tail) rather
    than failing the whole benchmark run."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=log, start_new_session=True
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"error": f"timed out after {timeout_s:.0f} s", "log_tail": tail(log_path)}
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    # A terminal spinner may share the line: the result is from its first "{" on.
    lines = [
        line[line.index("{") :] for line in out.decode(errors="replace").splitlines() if "{" in line
    ]
    for line in reversed(lines):
        with contextlib.suppress(orjson.JSONDecodeError):
            result: dict[str, Any] = orjson.loads(line)
            return result
    return {"error": f"exit {proc.returncode}, no result line", "log_tail": tail(log_path)}


def tail(path: Path, lines: int = 8) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])
