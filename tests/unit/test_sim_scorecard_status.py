"""The scorecard says what happened: a status per attack and an honest closing line."""

from __future__ import annotations

from collections import Counter

from pipeline.sim.card import AttackScore, Scorecard
from pipeline.sim.card_text import render


def attack(
    name: str,
    *,
    refused: int = 0,
    allowed: int = 0,
    before: int = 0,
    ato: int = 0,
    alerted: bool = False,
) -> AttackScore:
    score = AttackScore(
        attack=name,
        tenant="default",
        attempts=refused + allowed,
        start_ms=0,
        end_ms=1000,
        refused=refused,
        allowed=allowed,
        allowed_before_response=before,
        successes_allowed=ato,
    )
    if refused or alerted:
        score.first_alert_ms, score.first_alert_type = 10, "spray_source"
    return score


def card(*attacks: AttackScore, legit_refused: int = 0) -> Scorecard:
    return Scorecard(
        origin="engine",
        policy_version="v",
        events=100,
        attacks=list(attacks),
        legit_attempts=Counter(ordinary=50),
        legit_refused=Counter(ordinary=legit_refused),
        legit_examples=[],
        alerts_by_type=Counter(),
        unmatched_alerts=[],
        blocks=0,
        observes=0,
        tombstones=0,
        unmatched_blocks=[],
    )


def test_status_per_attack_stopped_slowed_detected_only_missed() -> None:
    """Refused with <= 10 % through after the response is stopped; more through, or a takeover,
    is slowed; an alert with nothing refused is detected only; nothing at all is missed."""
    assert attack("a", refused=90, allowed=15, before=5).status == "stopped"  # 10 of 100 after
    assert attack("b", refused=90, allowed=16, before=5).status == "slowed"  # 11 of 101 after
    assert attack("c", refused=500, allowed=5, before=5, ato=1).status == "slowed"
    assert attack("d", allowed=300, alerted=True).status == "detected_only"
    assert attack("e", allowed=300).status == "missed"


def test_closing_line_never_says_all_caught_when_takeovers_or_zero_refusals() -> None:
    """Mixed outcomes are counted, takeovers named with their attack, attacker attempts allowed
    and legitimate refusals given; every attack stopped gives the short form."""
    mixed = card(
        attack("brute_force", refused=90, allowed=5, before=5),
        attack("credential_stuffing", refused=100, allowed=400, before=50, ato=13),
        attack("spray", allowed=3000, alerted=True),
        attack("quiet", allowed=10),
    )
    assert mixed.closing_line() == (
        "1 of 4 attacks stopped (1 stopped, 1 slowed, 1 detected only, 1 missed); "
        "13 ACCOUNT TAKEOVERS (credential_stuffing 13); 3,415 attacker attempts allowed; "
        "0 legitimate attempts refused"
    )
    text = render(mixed)
    assert "all attacks caught" not in text
    assert text.splitlines()[-1] == mixed.closing_line()
    row = next(line for line in text.splitlines() if line.startswith("credential_stuffing"))
    assert row.endswith("13  slowed  <- ACCOUNTS TAKEN OVER")
    assert mixed.as_json()["status_counts"] == {
        "stopped": 1,
        "slowed": 1,
        "detected_only": 1,
        "missed": 1,
    }
    assert mixed.as_json()["account_takeovers"] == 13
    good = card(attack("brute_force", refused=90, allowed=5, before=5), legit_refused=2)
    assert good.closing_line() == (
        "1 of 1 attacks stopped, no account taken over; 5 attacker attempts allowed; "
        "2 legitimate attempts refused"
    )
