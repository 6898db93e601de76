"""The mixed scenario through the core Engine under DEFAULT_POLICY (no broker)."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.policy import DEFAULT_POLICY
from pipeline.settings import load_settings
from pipeline.sim.outputs import run_engine
from pipeline.sim.replay import replay
from pipeline.sim.scenarios import MIXED_SCENARIOS, SLOW_ATTACKS, SimConfig
from pipeline.sim.scoring import score
from pipeline.sim.simulate import SimulateOptions, dry_run
from pipeline.sim.truth import load_truth
from pipeline.wiring import build_normaliser

START_MS = 1_790_000_123_000  # not on a window boundary: the run straddles one


def test_default_policy_catches_every_attack_and_refuses_nobody_legitimate(tmp_path: Path) -> None:
    """Mixed run (10 events/s, 10 min): each attack stopped or detected by the rule meant for it,
    zero legitimate attempts refused, no stray block, and the decision-stream replay agrees with
    the Engine's own verdict on every event."""
    config = SimConfig(MIXED_SCENARIOS, 10.0, 600_000, 3, START_MS)
    summary = dry_run(
        SimulateOptions(config, 0, tmp_path / "truth.jsonl", tmp_path / "events.jsonl")
    )
    events = load_truth(tmp_path / "truth.jsonl", build_normaliser(load_settings()))
    assert len(events) == summary.events
    outputs = run_engine(events, DEFAULT_POLICY)
    assert outputs.verdicts is not None
    assert [v.allowed for v in replay(events, outputs.decisions)] == [
        v is None or v.allowed for v in outputs.verdicts
    ]
    card = score(events, outputs)
    statuses = {a.attack: a.status for a in card.attacks}
    assert statuses == {
        "brute_force": "stopped",
        "distributed_brute_force": "stopped",
        "lockout_dos": "stopped",
        "uia_bruteforce": "stopped",
        # Rule 8's wave challenge answers both (issue 24): all 4,200 of the stuffing's
        # attempts meet its CAPTCHA (a known place buys nothing under [verify]: it was a
        # step-up after a correct password there, and 400 wrong passwords went through
        # unchallenged), and each right password a step-up after it, no takeover.
        "spray": "stopped",
        # Paced under every per-window threshold, but rule 8 counts only unfamiliar
        # failures and each account once per quiet spell: the paced-wave sum fires, and
        # 939 of its 3,000 attempts meet the wave's challenge.
        "low_and_slow_spray": "slowed",
        "credential_stuffing": "stopped",
    }
    by_name = {a.attack: a for a in card.attacks}
    stuffing = by_name["credential_stuffing"]
    assert (stuffing.successes_allowed, stuffing.first_block_rule, stuffing.challenged) == (
        0,
        None,
        4200,
    )
    # No source is blocked for spray or stuffing: the seed 002 lock refuses accounts whose
    # consecutive run a spray filled.
    assert set(by_name["low_and_slow_spray"].blocks) == {"lockout"}
    assert by_name["spray"].blocks == {}
    alerts = {a.attack: set(a.alerts) for a in card.attacks}
    assert "spray_source" in alerts["spray"]
    assert "stuffing_tenant" in alerts["low_and_slow_spray"]
    assert {"credential_stuffing", "stuffing_tenant"} <= alerts["credential_stuffing"]
    assert "account_under_attack" in alerts["distributed_brute_force"]
    blocks = {a.attack: set(a.blocks) for a in card.attacks}
    assert blocks["lockout_dos"] == {"account_source", "account", "lockout"}
    assert blocks["uia_bruteforce"] == {"uia"}
    assert card.legit_refused_total == 0
    assert sum(card.legit_attempts.values()) > 5000
    assert card.legit_attempts["owner_trusted_device"] == 26
    assert card.unmatched_blocks == []


def test_patient_attackers_over_a_day_get_the_seed_002_allowance(tmp_path: Path) -> None:
    """24 h of the slow attackers and lockout_dos through the core: 34 and 35 guesses let
    through per account per day (5, then 900/1,800/3,600 s locks), no takeover, the
    owner's trusted device never refused, the untrusted owner's refusals by design."""
    config = SimConfig(
        ("low_and_slow_bruteforce", "low_and_slow_bruteforce_rotating", "lockout_dos"),
        1.0,
        86_400_000,
        1,
        START_MS,
    )
    dry_run(SimulateOptions(config, 0, tmp_path / "truth.jsonl", tmp_path / "events.jsonl"))
    events = load_truth(tmp_path / "truth.jsonl", build_normaliser(load_settings()))
    card = score(events, run_engine(events, DEFAULT_POLICY))
    figures = {
        a.attack: (a.attempts, a.guesses_per_account_24h, a.account_takeovers) for a in card.attacks
    }
    assert figures == {
        "low_and_slow_bruteforce": (360, 34, 0),
        "low_and_slow_bruteforce_rotating": (4320, 35, 0),
        "lockout_dos": (800, 8, 0),
    }
    assert {a.attack: a.status for a in card.attacks} == dict.fromkeys(figures, "stopped")
    assert card.legit_refused_total == 0
    assert card.legit_attempts["owner_trusted_device"] == 11
    assert card.legit_by_design == {"owner_without_trusted_device": 9}


def test_stuffing_stopped_at_demo_pace_without_refusing_nat_typos_stale_app_or_ipv6(
    tmp_path: Path,
) -> None:
    """At the demo's pace (attacks of fixed size over an hour), credential stuffing is stopped
    with 0 takeovers and a first response within 50 of its attempts, the spray next to it is
    challenged but never blocked, and no NAT colleague, typo-maker, stale app or IPv6 rotator
    is refused."""
    config = SimConfig(("baseline", "spray", "credential_stuffing"), 5.0, 3_600_000, 1, START_MS)
    dry_run(SimulateOptions(config, 0, tmp_path / "truth.jsonl", tmp_path / "events.jsonl"))
    events = load_truth(tmp_path / "truth.jsonl", build_normaliser(load_settings()))
    card = score(events, run_engine(events, DEFAULT_POLICY))
    by_name = {a.attack: a for a in card.attacks}
    stuffing, spray = by_name["credential_stuffing"], by_name["spray"]
    assert (stuffing.status, stuffing.successes_allowed) == ("stopped", 0)
    assert stuffing.allowed_before_response <= 50
    # Challenged, all 4,200: the wave's CAPTCHA from rule 8's first firing, and before it
    # [verify]'s step-up for every right password (a wrong one before the wave is let
    # through to the lock's count: none here, the wave came first).
    assert (stuffing.refused, stuffing.challenged) == (4200, 4200)
    # Spray is never blocked by its own rule (seed 001): rule 8's wave challenges it
    # (issue 24); the seed 002 lock may refuse where spray and an owner's typos share an
    # account's consecutive run.
    assert (spray.status, spray.challenged) == ("stopped", 5945)
    assert set(spray.blocks) <= {"lockout"}
    assert "spray_source" in spray.alerts
    assert set(card.legit_attempts) >= {"nat_office", "ordinary", "ipv6_rotating", "stale_app"}
    assert card.legit_refused_total == 0


def test_the_demo_scenario_stops_stuffing_within_50_attempts(tmp_path: Path) -> None:
    """The demo's traffic (seed 1: a day of the patient attackers, an hour of ordinary
    history, then the mixed hour at 25 logins/s, as ``authpipe demo`` plays it) through
    the core: stuffing stopped with 0 takeovers, answered by ``stuffing_tenant`` 3.918 s
    after its first attempt with none of them through, spray and low-and-slow spray
    alerted, 0 legitimate attempts refused, 341 of 7,976 legitimate untrusted attempts
    during waves challenged (4.3 %) and none while no attack ran but [verify]'s step-ups
    of unfamiliar sign-ins."""
    day_ms, hour_ms = 86_400_000, 3_600_000
    truth = tmp_path / "truth.jsonl"
    parts = []
    for name, config in (
        ("patient", SimConfig(SLOW_ATTACKS, 1.0, day_ms, 1, START_MS - hour_ms - day_ms - 30_000)),
        ("mixed", SimConfig(MIXED_SCENARIOS, 25.0, hour_ms, 1, START_MS, hour_ms)),
    ):
        part = tmp_path / f"truth-{name}.jsonl"
        dry_run(SimulateOptions(config, 0, part, tmp_path / f"events-{name}.jsonl"))
        parts.append(part.read_bytes())
    truth.write_bytes(b"".join(parts))
    events = load_truth(truth, build_normaliser(load_settings()))
    card = score(events, run_engine(events, DEFAULT_POLICY))
    by_name = {a.attack: a for a in card.attacks}
    stuffing = by_name["credential_stuffing"]
    assert (stuffing.status, stuffing.account_takeovers, stuffing.response_by) == (
        "stopped",
        0,
        "alert:stuffing_tenant",
    )
    assert (stuffing.allowed_before_response, stuffing.response_ms - stuffing.start_ms) == (
        0,
        3_918,
    )
    assert "spray_source" in by_name["spray"].alerts
    # The small tenant's slow spray is seen by rule 8's paced sum (six 10 s windows) and the
    # strangers tier (its exits nobody signs in from), and refused by seed 002's lock,
    # never by a source block.
    slow = by_name["low_and_slow_spray"]
    assert (dict(slow.alerts), set(slow.blocks)) == (
        {"spray_tenant": 1, "strangers_tenant": 4},
        {"lockout"},
    )
    assert card.takeovers == 0
    assert card.legit_refused_total == 0
    # The hour of history makes people's places familiar: cold, 2,725 were challenged.
    # 341, not 299: a known place (some other account signed in there) no longer turns
    # the wave's CAPTCHA into a step-up after a correct password (issue 44: one account's
    # success there proves nothing about another's), so its mistyped passwords meet it.
    assert (card.legit_untrusted_in_wave, card.legit_challenged_in_wave) == (7976, 341)
    assert (card.legit_challenged_outside_attacks, card.legit_challenged_away_from_attacks) == (
        0,
        0,
    )
    # 233, not 322: a session signed in at an unfamiliar place and client was verified at
    # its sign-in ([verify]), so the wave's lead-in has nothing left to review there.
    assert (card.legit_stepped_up_after_sign_in, card.legit_stepped_up_away_from_attacks) == (
        233,
        0,
    )
