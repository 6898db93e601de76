"""The scorecard counts what verified a valid credential (issue 44 item 8): one that met
only a CAPTCHA is a takeover for an attacker who buys CAPTCHA solving; one answered by a
step-up is no session, but confirms the password; and people challenged, per person."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.policy import Policy, policy_from_mapping
from pipeline.sim.card_text import render
from pipeline.sim.outputs import run_engine
from pipeline.sim.scoring import score
from tests.unit.test_report_takeovers import stream
from tests.unit.test_sim_scorecard import SEC, T0, load, row, wave_policy


def _verifying(base: Policy) -> Policy:
    document = base.model_dump()
    document["defaults"]["verify"]["mode"] = "enforce"
    return policy_from_mapping({"policy_version": "hand-3", "defaults": document["defaults"]})


def test_a_captcha_alone_is_a_takeover_for_an_attacker_who_buys_solving(tmp_path: Path) -> None:
    """Without verification (and no lead-in): carol's credential signs in before the wave
    (a takeover), dave's meets the wave's CAPTCHA only: 1 takeover if bots fail CAPTCHAs,
    2 if they buy them; nothing confirmed by a step-up."""
    events = load(tmp_path, stream())
    policy = wave_policy(0)
    (stuffing,) = score(events, run_engine(events, policy), policy).attacks
    assert (
        stuffing.account_takeovers,
        stuffing.valid_captcha_only,
        stuffing.valid_confirmed_by_step_up,
        stuffing.takeovers_if_captcha_bought,
    ) == (1, 1, 0, 2)


def test_with_verification_every_valid_credential_meets_a_step_up(tmp_path: Path) -> None:
    """[verify] enforce: carol's and dave's right passwords both meet a step-up (dave's after
    the CAPTCHA): 0 takeovers either way, 2 confirmed by the step-up; erin, who signed in
    during the history from elsewhere, signs in from a new address: the one person
    challenged, and the one known person challenged."""
    history = row(30, T0 - 10 * SEC, "erin", "198.18.0.31", ok=True, scenario="history")
    events = load(
        tmp_path, [{**history, "event": {**history["event"], "tenant": "shop"}}, *stream()]
    )
    policy = _verifying(wave_policy(0))
    card = score(events, run_engine(events, policy), policy)
    (stuffing,) = card.attacks
    assert (
        stuffing.account_takeovers,
        stuffing.valid_captcha_only,
        stuffing.valid_confirmed_by_step_up,
        stuffing.takeovers_if_captcha_bought,
    ) == (0, 0, 2, 0)
    assert (card.legit_people, card.legit_people_challenged) == (1, 1)
    assert (card.legit_known_people, card.legit_known_people_challenged) == (1, 1)
    text = render(card)
    assert "legitimate people challenged at least once: 1 of 1 (100.0 %)" in text
    assert "accounts taken over if CAPTCHAs are bought: stuffing 0/2/0" in text
