"""One voice on the terminal: Kafka clients' startup noise is dropped only while starting,
one-shot commands keep stdout for people, progress lines come as documented."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

from pipeline.logs import StartupNoise
from pipeline.progress import Progress

REPO = Path(__file__).resolve().parents[2]


def record(name: str, message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


def test_startup_noise_dropped_only_during_grace_and_only_transient_kafka_errors() -> None:
    """GroupCoordinatorNotAvailableError / NotLeaderForPartitionError from aiokafka, and faust's
    leader topic not found yet, are dropped while starting; other errors (another topic not
    found), other loggers and anything after the grace period pass."""
    noise = StartupNoise(grace_s=60.0)
    coordinator = record(
        "aiokafka.consumer.group_coordinator",
        "Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError",
    )
    leader = record("aiokafka.producer.sender", "NotLeaderForPartitionError for tp")
    assigner = record(
        "aiokafka.cluster", "Topic demo-1-__assignor-__leader not found in cluster metadata"
    )
    assert not noise.filter(coordinator) and not noise.filter(leader)
    assert not noise.filter(assigner)
    assert noise.dropped == 3
    assert noise.filter(
        record("aiokafka.cluster", "Topic auth.alerts not found in cluster metadata")
    )
    assert noise.filter(record("aiokafka.consumer.fetcher", "Unexpected error in fetcher routine"))
    assert noise.filter(record("pipeline.x", "NotLeaderForPartitionError"))
    later = StartupNoise(grace_s=0.0)
    assert later.filter(coordinator)


def test_progress_prints_lines_when_not_a_terminal() -> None:
    """Off a terminal: no bar, no escape codes, one line per period and a final 100 % line."""
    out = io.StringIO()
    progress = Progress("simulate", stream=out, every_s=0.0, tty=False)
    progress.update(0.5, "of simulated time, 1,000 events")
    progress.done("2,000 events")
    assert out.getvalue() == (
        "simulate: 50 % of simulated time, 1,000 events\nsimulate: 100 % 2,000 events\n"
    )


def test_progress_draws_a_bar_on_a_terminal() -> None:
    """On a terminal: one line redrawn in place, ended by a newline."""
    out = io.StringIO()
    progress = Progress("simulate", stream=out, tty=True)
    progress.done("10 events")
    assert out.getvalue() == f"\rsimulate: [{'#' * 30}] 100 % 10 events\x1b[K\n"


def test_one_shot_command_keeps_stdout_for_people(tmp_path: Path) -> None:
    """`simulate --dry-run` off a terminal: stdout has no JSON and no escape codes; log events
    and progress are console lines on stderr."""
    env = {**os.environ, "AUTHPIPE_LOG_LEVEL": "info"}
    env.pop("AUTHPIPE_LOG_FORMAT", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "simulate",
            "--dry-run",
            "--out",
            str(tmp_path / "e.jsonl"),
            "--scenario",
            "baseline",
            "--rate",
            "1",
            "--duration-s",
            "60",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert not any(line.startswith("{") for line in done.stdout.splitlines())
    assert "\x1b" not in done.stdout + done.stderr
    errors = done.stderr.splitlines()
    assert any("simulate_started" in line and not line.startswith("{") for line in errors)
    assert errors[-2].startswith("simulate: 100 % ")


def test_every_log_event_name_is_one_snake_case_word_list() -> None:
    """Log events are constant names in one style, ``component_event`` (snake case), never
    ``component.event``: a search for one event finds it in every service's logs."""
    import re
    from pathlib import Path

    call = re.compile(r"\blog\w*\.(?:debug|info|warning|error|exception|critical)\(\s*\"([^\"]+)\"")
    names = {
        name
        for path in Path(__file__).resolve().parents[2].joinpath("pipeline").rglob("*.py")
        for name in call.findall(path.read_text())
    }
    assert len(names) > 50
    assert sorted(n for n in names if not re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)+", n)) == []
