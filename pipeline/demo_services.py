"""The demo's services: ``authpipe`` subprocesses with their own logs, supervised (one that
exits with ``EX_STUCK`` is started again), and the wait on a condition while they run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.errors import AuthpipeError
from pipeline.stream.watch import EX_STUCK


class DemoError(AuthpipeError):
    """A step of the demo failed; the message names the step and its log file."""


class Service:
    """A subprocess of ``authpipe <args>`` with its own log file, started again (up to
    ``MAX_RESTARTS`` times) when it exits asking for it: a worker with a stuck partition
    exits with ``EX_STUCK`` for its supervisor to restart it (``pipeline.stream.watch``)."""

    MAX_RESTARTS = 3

    def __init__(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        log_dir: Path,
        program: tuple[str, ...] = (sys.executable, "-m", "pipeline.cli"),
    ) -> None:
        self.name = name
        self.command = [*program, *args]
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.restarts = 0
        self.proc = self._start("wb")

    def _start(self, mode: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.command,
            env=self.env,
            stdout=self.log_path.open(mode),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        if self.proc.returncode == EX_STUCK and self.restarts < self.MAX_RESTARTS:
            self.restarts += 1
            self.proc = self._start("ab")
            return True
        return False

    def stop(self, timeout_s: float = 30.0) -> None:
        if not self.alive():
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def failed(self, what: str) -> DemoError:
        tail = self.log_path.read_text(errors="replace").splitlines()[-15:]
        return DemoError(f"{self.name} {what}; its log is {self.log_path}:\n" + "\n".join(tail))


def wait_on(predicate: Callable[[], bool], timeout_s: float, service: Service, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not service.alive():
            raise service.failed(f"exited while waiting for {what}")
        if predicate():
            return
        time.sleep(0.25)
    raise service.failed(f"did not get {what} within {timeout_s:g} s")
