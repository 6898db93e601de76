"""The simulate, scorecard, backtest and report subcommands: flags, exit codes, files.

The CLI runs as a subprocess, as users run it (it configures logging once per process)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

POLICY = 'policy_version = "ceiling-10"\n[defaults.account]\nthreshold = 10\n'
REPO = Path(__file__).resolve().parents[2]


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AUTHPIPE_LOG_LEVEL": "warning",
        "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    }
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--dry-run"], "--dry-run needs --out PATH"),
        (["simulate", "--out", "x.jsonl"], "--out goes with --dry-run"),
        (["simulate", "--rate", "0"], "argument --rate: 0 must be above 0"),
        (["simulate", "--speedup", "-1"], "argument --speedup: -1 must be 0 or more"),
        (["simulate", "--scenario", "spray,nope"], "unknown scenario nope"),
        (
            ["simulate", "--start", "2026-01-01T00:00:00"],
            "is not an RFC 3339 timestamp with an offset",
        ),
        (
            ["scorecard", "--truth", "pyproject.toml"],
            "one of the arguments --decisions-from-topic --decisions --engine is required",
        ),
        (
            ["scorecard", "--truth", "pyproject.toml", "--engine", "--alerts", "pyproject.toml"],
            "--alerts goes with --decisions PATH",
        ),
        (
            [
                "backtest",
                "--policy",
                "pyproject.toml",
                "--events",
                "pyproject.toml",
                "--to-ts",
                "2026-01-01T00:00:00Z",
            ],
            "--to-ts goes with --from-ts",
        ),
        (
            ["backtest", "--policy", "pyproject.toml", "--from-offset", "5", "--to-offset", "5"],
            "--to-offset must be above --from-offset",
        ),
        (
            ["backtest", "--policy", "missing.toml", "--from-offset", "1"],
            "missing.toml is not a file",
        ),
        (["report", "--out", "r.html"], "give --truth PATH (labelled) or --events PATH"),
        (["demo", "--history-s", "-5"], "argument --history-s: -5 must be 0 or more"),
        (
            ["backtest", "--events", "pyproject.toml"],
            "--policy is required (or --verdicts OUT.jsonl for per-event verdicts)",
        ),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(argv: list[str], message: str) -> None:
    """Each bad flag combination is an argparse error (exit 2) naming the problem."""
    done = cli(*argv)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_start_beyond_retention_is_an_authpipe_error() -> None:
    """Producing a run dated years ago is refused with exit 1 before any broker is contacted."""
    done = cli("simulate", "--start", "2020-01-01T00:00:00Z", "--duration-s", "10")
    assert done.returncode == 1
    assert "more than 6 days ago" in done.stderr


def run_ok(*argv: str) -> str:
    done = cli(*argv)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_dry_run_scorecard_backtest_report_end_to_end(tmp_path: Path) -> None:
    """simulate --dry-run writes events and truth; scorecard --engine --strict exits 0 and writes
    JSON and outputs; backtest and report read them; the report fetches nothing."""
    events, truth = tmp_path / "events.jsonl", tmp_path / "events.truth.jsonl"
    run_ok(
        "simulate",
        "--dry-run",
        "--out",
        str(events),
        "--scenario",
        "baseline,brute_force",
        "--rate",
        "2",
        "--duration-s",
        "300",
        "--start",
        "2026-11-29T20:00:00Z",
    )
    lines = events.read_bytes().splitlines()
    assert len(lines) == len(truth.read_bytes().splitlines()) > 240
    assert orjson.loads(lines[0])["occurred_at"].startswith("2026-11-29T20:0")

    card_path, outputs = tmp_path / "card.json", tmp_path / "outputs"
    printed = run_ok(
        "scorecard",
        "--truth",
        str(truth),
        "--engine",
        "--strict",
        "--out",
        str(card_path),
        "--save-outputs",
        str(outputs),
    )
    card = orjson.loads(card_path.read_bytes())
    assert [(a["attack"], a["status"]) for a in card["attacks"]] == [("brute_force", "stopped")]
    assert card["legitimate"]["refused"] == 0
    assert "1 of 1 attacks stopped, no account taken over" in printed

    policy = tmp_path / "candidate.toml"
    policy.write_text(POLICY)
    diff_path = tmp_path / "diff.json"
    run_ok(
        "backtest",
        "--policy",
        str(policy),
        "--events",
        str(events),
        "--truth",
        str(truth),
        "--out",
        str(diff_path),
    )
    diff = orjson.loads(diff_path.read_bytes())
    assert (diff["baseline_policy"], diff["candidate_policy"]) == ("default-1", "ceiling-10")
    assert set(diff["scorecards"]) == {"baseline", "candidate"}

    report = tmp_path / "report.html"
    run_ok(
        "report",
        "--truth",
        str(truth),
        "--decisions",
        str(outputs / "decisions.jsonl"),
        "--alerts",
        str(outputs / "alerts.jsonl"),
        "--scorecard",
        str(card_path),
        "--out",
        str(report),
    )
    page = report.read_text()
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert set(re.findall(r"https?://[^\s\"'<>)]+", page)) == {"http://www.w3.org/2000/svg"}
    assert "<script src" not in page and "<link" not in page


def test_backtest_verdicts_reproduce_the_patient_attackers_figures(tmp_path: Path) -> None:
    """backtest --verdicts over a day of both slow attackers: one line per event, 34 and 35
    guesses let through (seed 002's allowance), refused attempts named by their rule."""
    events = tmp_path / "slow.jsonl"
    run_ok(
        "simulate",
        "--dry-run",
        "--out",
        str(events),
        "--scenario",
        "low_and_slow_bruteforce,low_and_slow_bruteforce_rotating",
        "--duration-s",
        "86400",
        "--start",
        "2026-11-01T00:00:00Z",
    )
    verdicts = tmp_path / "verdicts.jsonl"
    printed = run_ok("backtest", "--events", str(events), "--verdicts", str(verdicts))
    lines = [orjson.loads(line) for line in verdicts.read_bytes().splitlines()]
    assert [v["event_id"] for v in lines] == [
        orjson.loads(line)["event_id"] for line in events.read_bytes().splitlines()
    ]
    through: dict[str, int] = {}
    for v in lines:
        through[v["account"]] = through.get(v["account"], 0) + v["allowed"]
        assert v["allowed"] == (v["refused_by"] == []) == (v["retry_after_ms"] == 0)
    assert through == {
        "victim.low_and_slow_bruteforce@example.com": 34,
        "victim.low_and_slow_bruteforce_rotating@example.com": 35,
    }
    assert {r for v in lines for r in v["refused_by"]} == {"lockout"}
    first_lock = next(v for v in lines if v["decisions"])
    assert [(d["rule"], d["count"]) for d in first_lock["decisions"]] == [("lockout", 5)]
    assert len(first_lock["notices"]) == 1
    assert "35  victim.low_and_slow_bruteforce_rotating@example.com" in printed
