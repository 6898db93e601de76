"""The report's data: whole buckets only (no cliff at the edges), accounts named from the
ground truth, takeovers listed and marked."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.policy import DEFAULT_POLICY
from pipeline.settings import load_settings
from pipeline.sim.outputs import run_engine
from pipeline.sim.report import ReportInputs, build_data
from pipeline.sim.truth import load_truth
from pipeline.wiring import build_normaliser
from tests.unit.test_sim_scorecard import SEC, T0, row, write_truth


def stream() -> list[dict[str, object]]:
    """Ordinary attempts (one in five fails) every 2 s from T0+7 s to T0+1005 s (5 s buckets: the first and the
    last bucket are partial); an attacker guesses alice's password at the 4th try."""
    rows = [
        row(k, T0 + 7 * SEC + 2 * SEC * k, f"user{k % 50}", "198.18.0.9", ok=k % 5 > 0)
        for k in range(500)
    ]
    for k in range(4):
        rows.append(
            row(
                500 + k,
                T0 + 100 * SEC + k * 10,
                "alice",
                "203.0.113.7",
                ok=k == 3,
                role="attacker",
                scenario="brute_force",
                cohort="attacker",
            )
        )
    return sorted(rows, key=lambda r: str(r["event"]["occurred_at"]))  # type: ignore[index]


def test_partial_edge_buckets_are_left_out_and_counted(tmp_path: Path) -> None:
    """The line starts at the first whole bucket and ends at the last one; what was left out
    is reported."""
    events = load_truth(write_truth(tmp_path, stream()), build_normaliser(load_settings()))
    data = build_data(ReportInputs(events, run_engine(events, DEFAULT_POLICY), None))
    series = data["series"]
    assert (series["bucket_ms"], series["start_ms"]) == (5 * SEC, T0 + 10 * SEC)
    assert len(series["attempts"]) == 199
    assert series["trimmed"] == {"first": True, "last": True, "events": 3}
    assert sum(series["attempts"]) == len(events) - 3


def test_accounts_named_from_truth_and_takeovers_marked(tmp_path: Path) -> None:
    """Labelled truth names accounts by their (synthetic) identifier; the account an attacker
    got into is listed under takeovers and marked in the top accounts."""
    events = load_truth(write_truth(tmp_path, stream()), build_normaliser(load_settings()))
    data = build_data(ReportInputs(events, run_engine(events, DEFAULT_POLICY), None))
    assert data["takeovers"] == [{"account": "alice", "tenant": "default", "successes": 1}]
    alice = next(r for r in data["top_accounts"] if r["label"] == "alice")
    assert (alice["role"], alice["takeover"], alice["note"]) == ("attacker", True, "brute_force")
    assert not any(r["takeover"] for r in data["top_accounts"] if r["label"] != "alice")
