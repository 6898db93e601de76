"""The demo explains an empty or short block-list feed instead of printing a bare count."""

from __future__ import annotations

from pathlib import Path

import orjson

from pipeline.sim.demo_notes import SourceDecision, blocklist_note, load_source_decisions

NOW = 1_800_000_000_000
MIN = 60_000


def test_all_expired_says_why_and_what_production_shows() -> None:
    """Source decisions that expired on the wall clock, or were tombstoned, are named as the
    reason (simulated time), with what a user sees in production."""
    decisions = [
        SourceDecision("198.51.100.7", "observe", NOW - 20 * MIN, False),
        SourceDecision("198.51.100.8", "block", NOW - 5 * MIN, False),
        SourceDecision("198.51.100.9", "block", NOW + 5 * MIN, True),
    ]
    lines = blocklist_note(decisions, 0, NOW)
    assert lines[0] == (
        "why: this run made 3 source-level decision(s) (2 block, 1 observe-only); 3 ended "
        "before the feed was read (latest expiry 2027-01-15T08:05:00.000Z). Decisions expire "
        "in event time and the worker tombstones them when that time passes on the wall clock; "
        "the demo plays its simulated hour in about a minute with event times ending now, so "
        "decisions made early in simulated time have ended by the time the feed is read."
    )
    assert lines[1].startswith("In production events arrive in real time")


def test_no_source_decision_says_the_feed_lists_only_source_scope() -> None:
    """A run without source-scope decisions says so and where account blocks are enforced."""
    lines = blocklist_note([], 0, NOW)
    assert lines[0].startswith("why: this run made no source-level decision.")
    assert "/v1/check" in lines[0]


def test_feed_showing_what_is_active_gets_a_plain_count() -> None:
    """When every decision is still active, the note only counts."""
    decisions = [SourceDecision("198.51.100.7", "observe", NOW + MIN, False)]
    assert blocklist_note(decisions, 1, NOW) == [
        "this run made 1 source-level decision(s) (0 block, 1 observe-only); all active."
    ]


def test_load_keeps_the_last_record_per_source_key(tmp_path: Path) -> None:
    """Only source-scope keys count; a tombstone marks its key lifted."""
    path = tmp_path / "decisions.jsonl"
    value = {"source": "198.51.100.7", "action": "observe", "expires_at": "2027-01-15T08:00:00Z"}
    rows = [
        {"key": "source|default|-|198.51.100.7|-", "value": value, "after": None},
        {"key": "account|default|abc|-|-", "value": {**value, "source": None}, "after": None},
        {"key": "source|default|-|198.51.100.7|-", "value": None, "after": None},
    ]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    assert load_source_decisions(path) == [SourceDecision("198.51.100.7", "observe", NOW, True)]


def test_demo_passes_simulate_progress_lines_to_its_narration(tmp_path: Path) -> None:
    """The demo forwards simulate's progress lines (stderr) as they come and returns its
    stdout (the summary); everything goes to the step's log file."""
    import os

    from pipeline.demo import _run_showing_progress

    said: list[str] = []
    env = {**os.environ, "AUTHPIPE_LOG_FORMAT": "json"}
    out = _run_showing_progress(
        [
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
        env,
        tmp_path,
        "simulate",
        said.append,
    )
    assert said and said[-1].startswith("simulate: 100 % ")
    assert out.splitlines()[0].split() == ["scenario", "role", "events"]
    log = (tmp_path / "simulate.log").read_text()
    assert '"event": "simulate_finished"' in log and said[-1] in log
