"""``pipeline.sim.waves``: wave spans against attack spans, and how soon each wave was met."""

from __future__ import annotations

from pipeline.core.attempt import Attempt
from pipeline.core.policy import DEFAULT_POLICY, policy_from_toml
from pipeline.sim.truth import TruthEvent
from pipeline.sim.waves import (
    answers,
    attack_spans,
    during,
    merge,
    near_attacks,
    near_margins_ms,
)
from tests.unit.test_core_support import att

SEC = 1000
T0 = att(0).occurred_ms  # the support module's epoch


def event(
    i: int, t_ms: int, role: str, scenario: str, cohort: str, flow: str = "login"
) -> TruthEvent:
    attempt: Attempt = att(t_ms, flow=flow)
    return TruthEvent(i, f"e{i}", scenario, role, "actor", cohort, "plain", attempt)


def test_merge_joins_overlapping_and_touching_spans_per_tenant() -> None:
    """[0,10) and [10,20) touch and merge; [30,40) stays apart."""
    assert merge({"t": [(30, 40), (10, 20), (0, 10)]}) == {"t": [(0, 20), (30, 40)]}


def test_attack_spans_cover_each_attackers_password_attempts_only() -> None:
    """An attack runs from its first to its last password attempt; a code guesser's mfa
    attempts and legitimate traffic start no span."""
    events = [
        event(0, 0, "legit", "baseline", "ordinary"),
        event(1, 5 * SEC, "attacker", "stuffing", "attacker"),
        event(2, 9 * SEC, "attacker", "stuffing", "attacker"),
        event(3, 50 * SEC, "attacker", "codes", "attacker_first_factor", flow="mfa"),
    ]
    spans = attack_spans(events)
    tenant = events[1].attempt.tenant
    assert spans == {tenant: [(T0 + 5 * SEC, T0 + 9 * SEC + 1)]}
    assert (during(spans, tenant, T0 + 9 * SEC), during(spans, tenant, T0 + 50 * SEC)) == (
        True,
        False,
    )


def test_answers_give_seconds_to_the_first_wave_in_force_or_none() -> None:
    """A wave issued 4 s after the attack's first attempt answers it in 4.0 s; an attack
    already under a wave is answered in 0; one no wave met is None."""
    events = [
        event(0, 10 * SEC, "attacker", "a", "attacker"),
        event(1, 30 * SEC, "attacker", "a", "attacker"),
        event(2, 20 * SEC, "attacker", "b", "attacker"),
        event(3, 100 * SEC, "attacker", "c", "attacker"),
    ]
    tenant = events[0].attempt.tenant
    waves = {tenant: [(T0 + 14 * SEC, T0 + 60 * SEC)]}
    got = {w["attack"]: w["challenged_after_s"] for w in answers(events, waves)}
    assert got == {"a": 4.0, "b": 0.0, "c": None}


def test_near_attacks_widen_each_span_by_the_lead_in_and_the_tail_and_merge() -> None:
    """Under rule 8 alone each attack span widens by 70 s before and 120 s after; widened
    spans that overlap merge, the others stay apart."""
    rule8 = policy_from_toml("[defaults.strangers]\nenabled = false\n")
    assert near_margins_ms(rule8, "t") == (70 * SEC, 120 * SEC)
    apart = {"t": [(100 * SEC, 110 * SEC), (400 * SEC, 410 * SEC)]}
    assert near_attacks(apart, rule8) == {"t": [(30 * SEC, 230 * SEC), (330 * SEC, 530 * SEC)]}
    close = {"t": [(100 * SEC, 110 * SEC), (250 * SEC, 260 * SEC)]}
    assert near_attacks(close, rule8) == {"t": [(30 * SEC, 380 * SEC)]}


def test_the_strangers_tier_reaches_its_lead_in_before_and_its_settling_after() -> None:
    """With the strangers tier (the default) an attack's span widens by its 5-minute lead-in
    and a window (310 s) before, and by redeem_ms, twice active_ms, a window and the hold
    (490 s) after: its wave comes redeem_ms late and holds as long."""
    assert near_margins_ms(DEFAULT_POLICY, "t") == (310 * SEC, 490 * SEC)
    apart = {"t": [(1000 * SEC, 1010 * SEC), (2000 * SEC, 2010 * SEC)]}
    assert near_attacks(apart) == {"t": [(690 * SEC, 1500 * SEC), (1690 * SEC, 2500 * SEC)]}


def test_near_margins_follow_the_tenants_wave_and_detector_settings() -> None:
    """A tenant with a 2-minute lead-in, 5-minute hold and 20-second windows summed over 3
    reaches 140 s before an attack and 360 s after by rule 8, 320 s and 740 s with the
    strangers tier (its lead-in; its settling and hold); other tenants keep the defaults."""
    tenant_t = """
[tenants.t.wave]
lead_in_ms = 120000
hold_ms = 300000
[tenants.t.tenant_spray]
window_ms = 20000
slow_windows = 3
"""
    policy = policy_from_toml(tenant_t)
    assert near_margins_ms(policy, "t") == (320 * SEC, 740 * SEC)
    assert near_margins_ms(policy, "other") == (310 * SEC, 490 * SEC)
    assert near_attacks({"t": [(1000 * SEC, 1010 * SEC)]}, policy) == {
        "t": [(680 * SEC, 1750 * SEC)]
    }
    quiet = policy_from_toml("[defaults.strangers]\nenabled = false\n" + tenant_t)
    assert near_margins_ms(quiet, "t") == (140 * SEC, 360 * SEC)
