"""The demo supervises its services: one that exits asking for a restart (status 75) is
started again, a bounded number of times; any other exit is a failure."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.demo_services import Service


def exiting(code: int, tmp_path: Path) -> Service:
    """A service whose program logs a line and exits with ``code`` at once."""
    program = ("/bin/sh", "-c", f"echo started; exit {code}")
    service = Service("worker", [], dict(os.environ), tmp_path, program=program)
    service.proc.wait(timeout=10)
    return service


def test_a_service_exiting_75_is_restarted_up_to_max_restarts(tmp_path: Path) -> None:
    """Status 75: alive() starts it again MAX_RESTARTS (3) times, then reports it dead."""
    service = exiting(75, tmp_path)
    answers = []
    for _ in range(4):
        answers.append(service.alive())
        service.proc.wait(timeout=10)
    assert answers == [True, True, True, False]
    assert service.restarts == 3
    assert service.log_path.read_text().splitlines() == ["started"] * 4


def test_a_service_exiting_otherwise_is_not_restarted(tmp_path: Path) -> None:
    """Status 1: alive() is False at once and nothing is started again."""
    service = exiting(1, tmp_path)
    assert service.alive() is False
    assert service.restarts == 0
    assert service.log_path.read_text().splitlines() == ["started"]
