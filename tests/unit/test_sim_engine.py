"""The mixed scenario through the core Engine under DEFAULT_POLICY (no broker)."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.policy import DEFAULT_POLICY
from pipeline.settings import load_settings
from pipeline.sim.scenarios import SCENARIOS, SimConfig
from pipeline.sim.scorecard import load_truth, replay, run_engine, score
from pipeline.sim.simulate import SimulateOptions, dry_run
from pipeline.stream.app import build_normaliser

START_MS = 1_790_000_123_000  # not on a window boundary: the run straddles one


def test_default_policy_catches_every_attack_and_refuses_nobody_legitimate(tmp_path: Path) -> None:
    """Mixed run (10 events/s, 10 min): each attack stopped or detected by the rule meant for it,
    zero legitimate attempts refused, no stray block, and the decision-stream replay agrees with
    the Engine's own verdict on every event."""
    config = SimConfig(SCENARIOS, 10.0, 600_000, 3, START_MS)
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
        "brute_force": "stopped", "distributed_brute_force": "stopped", "lockout_dos": "stopped",
        "uia_bruteforce": "stopped", "spray": "detected", "low_and_slow_spray": "stopped",
        "credential_stuffing": "stopped",
    }  # fmt: skip
    by_name = {a.attack: a for a in card.attacks}
    stuffing = by_name["credential_stuffing"]
    assert (stuffing.successes_allowed, stuffing.first_block_rule) == (0, "stuffing")
    # Spray stays signal-only: only the stuffing rule refuses low-and-slow proxies whose
    # failures are all unknown accounts.
    assert set(by_name["low_and_slow_spray"].blocks) == {"stuffing"}
    assert by_name["spray"].blocks == {}
    alerts = {a.attack: set(a.alerts) for a in card.attacks}
    assert "spray_source" in alerts["spray"]
    assert "spray_tenant" in alerts["low_and_slow_spray"]
    assert {"credential_stuffing", "stuffing_tenant"} <= alerts["credential_stuffing"]
    assert "account_under_attack" in alerts["distributed_brute_force"]
    blocks = {a.attack: set(a.blocks) for a in card.attacks}
    assert blocks["lockout_dos"] == {"account_source", "account"}
    assert blocks["uia_bruteforce"] == {"uia"}
    assert card.legit_refused_total == 0
    assert sum(card.legit_attempts.values()) > 5000
    assert card.legit_attempts["owner_trusted_device"] == 26
    assert card.unmatched_blocks == []


def test_stuffing_stopped_at_demo_pace_without_refusing_nat_typos_stale_app_or_ipv6(tmp_path: Path) -> None:
    """At the demo's pace (attacks of fixed size over an hour), credential stuffing is stopped
    with 0 takeovers and a first response within 50 of its attempts, the spray next to it is
    alerted but never refused, and no NAT colleague, typo-maker, stale app or IPv6 rotator
    is refused."""
    config = SimConfig(("baseline", "spray", "credential_stuffing"), 5.0, 3_600_000, 1, START_MS)
    dry_run(SimulateOptions(config, 0, tmp_path / "truth.jsonl", tmp_path / "events.jsonl"))
    events = load_truth(tmp_path / "truth.jsonl", build_normaliser(load_settings()))
    card = score(events, run_engine(events, DEFAULT_POLICY))
    by_name = {a.attack: a for a in card.attacks}
    stuffing, spray = by_name["credential_stuffing"], by_name["spray"]
    assert (stuffing.status, stuffing.successes_allowed) == ("stopped", 0)
    assert stuffing.allowed_before_response <= 50
    assert stuffing.refused > 3900
    assert (spray.status, spray.refused, dict(spray.blocks)) == ("detected", 0, {})
    assert "spray_source" in spray.alerts
    assert set(card.legit_attempts) >= {"nat_office", "ordinary", "ipv6_rotating", "stale_app"}
    assert card.legit_refused_total == 0
