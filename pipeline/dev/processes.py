"""Processes, ports and tools on this machine, for the local broker (development only)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pipeline.dev.errors import MissingToolError

MIN_JAVA_MAJOR = 17
POLL_INTERVAL_S = 0.1


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


def process_cmdline(pid: int) -> list[str]:
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


def is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int) -> bool:
    reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not is_zombie(pid)


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(POLL_INTERVAL_S)
    return not pid_alive(pid)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_port_free(port: int, wait_s: float) -> bool:
    """True once ``port`` is free on 127.0.0.1, polled for up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while not port_free(port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL_S)
    return True


def port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def run_sync(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine to completion, also when called from inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, coro).result()


def require_tool(name: str, install_hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise MissingToolError(f"`{name}` was not found on PATH; {install_hint}")
    return path


def java_binary() -> str:
    java = require_tool(
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
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
