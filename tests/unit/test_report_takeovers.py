"""Account takeovers are counted by one function: the report's banner, the scorecard and
``backtest --verdicts`` agree (issue 46, item 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.sim.outputs import run_engine
from pipeline.sim.report import ReportInputs, build_data
from pipeline.sim.scoring import score
from pipeline.sim.verdicts import VerdictSummary, verdicts
from tests.unit.test_sim_scorecard import SEC, T0, load, row, stuffing_stream, wave_policy


def attacker(i: int, at_ms: int, account: str, ip: str, cohort: str = "attacker") -> dict[str, Any]:
    return row(
        i,
        at_ms,
        account,
        ip,
        ok=True,
        role="attacker",
        scenario="stuffing",
        cohort=cohort,
        tenant="shop",
    )


def stream() -> list[dict[str, Any]]:
    """The stuffing stream (carol's credential signs in during the wave's lead-in), then the
    stuffer signs in to its own account (mallory) and, with the wave's captcha in force,
    to dave's."""
    rows = [
        *stuffing_stream(),
        attacker(20, T0 + 5 * SEC, "mallory", "203.0.113.80", cohort="attacker_own_account"),
        attacker(21, T0 + 6 * SEC, "dave", "203.0.113.81"),
    ]
    return sorted(rows, key=lambda r: str(r["event"]["occurred_at"]))


def test_no_takeover_in_the_scorecard_is_none_in_the_report(tmp_path: Path) -> None:
    """A sign-in the session review stepped up, an attacker's own account and a success met
    by a captcha are no takeover: the scorecard and the report's banner both count 0."""
    events = load(tmp_path, stream())
    policy = wave_policy(60_000)
    outputs = run_engine(events, policy)
    card = score(events, outputs, policy)
    data = build_data(ReportInputs(events, outputs, card.as_json(), policy=policy))
    assert (card.takeovers, card.attacks[0].account_takeovers) == (0, 0)
    assert data["takeovers"] == []
    assert not any(r["takeover"] for r in data["top_accounts"])


def test_report_scorecard_and_verdicts_name_the_same_takeover(tmp_path: Path) -> None:
    """Without the wave's lead-in carol's sign-in is not stepped up: the scorecard, the report
    and backtest --verdicts each count that one takeover (and not mallory's own account nor
    dave's captcha)."""
    events = load(tmp_path, stream())
    policy = wave_policy(0)
    outputs = run_engine(events, policy)
    card = score(events, outputs, policy)
    data = build_data(ReportInputs(events, outputs, card.as_json(), policy=policy))
    summary = VerdictSummary()
    lines = list(verdicts(events, policy, summary))
    assert (card.takeovers, card.attacks[0].account_takeovers) == (1, 1)
    assert data["takeovers"] == [{"account": "carol", "tenant": "shop", "successes": 1}]
    assert dict(summary.takeovers) == {"carol": 1}
    assert [line["account"] for line in lines if line["taken_over"]] == ["carol"]
    assert "account takeovers: 1 account (1 attacker sign-in let through): carol 1" in (
        summary.render()
    )
