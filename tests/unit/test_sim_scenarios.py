"""Scenario generators: determinism per seed, valid wire events, and each scenario's shape."""

from __future__ import annotations

import ipaddress
import itertools
from collections import Counter, defaultdict
from functools import cache

import orjson
import pytest

from pipeline.contracts.codec import decode_attempt
from pipeline.sim.scenarios import (
    ATTACKS,
    MIXED_SCENARIOS,
    ScenarioError,
    SimConfig,
    SimEvent,
    generate,
    parse_scenarios,
)

T0 = 1_789_999_200_000  # on a 15-minute boundary
RATE = 5.0
DURATION_MS = 600_000


def config(scenarios: tuple[str, ...], seed: int = 7) -> SimConfig:
    return SimConfig(scenarios, RATE, DURATION_MS, seed, T0)


@cache
def mixed(seed: int = 7) -> tuple[SimEvent, ...]:
    return tuple(generate(config(MIXED_SCENARIOS, seed)))


def of(scenario: str, role: str = "attacker") -> list[SimEvent]:
    return [e for e in mixed() if e.label.scenario == scenario and e.label.role == role]


def test_same_seed_gives_identical_events_and_labels() -> None:
    """Two runs with one seed give byte-identical events, ids and labels."""
    first = [(e.event_id, orjson.dumps(e.wire), e.label) for e in generate(config(MIXED_SCENARIOS))]
    second = [
        (e.event_id, orjson.dumps(e.wire), e.label) for e in generate(config(MIXED_SCENARIOS))
    ]
    assert first == second
    assert len(first) == len(mixed())


def test_another_seed_gives_other_events() -> None:
    """Seeds 7 and 8 differ in their events."""
    assert [e.wire for e in mixed(7)][:200] != [e.wire for e in mixed(8)][:200]


def test_events_are_valid_in_order_in_range_and_never_refused() -> None:
    """Every event decodes as login_attempt v1, times are ordered within the run, ids are unique,
    and nothing is 'refused' (the simulator models no enforcement)."""
    events = mixed()
    times = [e.occurred_ms for e in events]
    assert times == sorted(times)
    assert times[0] >= T0 and times[-1] < T0 + DURATION_MS
    assert len({e.event_id for e in events}) == len(events)
    for e in events:
        wire = decode_attempt(orjson.dumps(e.wire))
        assert wire.failure_reason != "refused"
        assert (wire.outcome == "failure") == (wire.failure_reason is not None)


def test_truth_row_carries_labels_and_the_event() -> None:
    """A truth row holds the labels, tenant, account and the wire event itself."""
    e = of("brute_force")[0]
    row = e.truth_row()
    assert row == {
        "event_id": e.event_id,
        "scenario": "brute_force",
        "role": "attacker",
        "actor": "attacker:brute_force",
        "cohort": "attacker",
        "tenant": "default",
        "account": "victim.brute_force@example.com",
        "event": e.wire,
    }


def test_parse_scenarios() -> None:
    """'mixed' is every scenario; lists keep canonical order; unknown names are refused."""
    assert parse_scenarios("mixed") == MIXED_SCENARIOS
    assert parse_scenarios("spray, baseline") == ("baseline", "spray")
    with pytest.raises(ScenarioError, match="unknown scenario nope"):
        parse_scenarios("spray,nope")


def test_single_scenario_runs_alone() -> None:
    """A run of one attack holds exactly that attack's events, as in the mixed run."""
    alone = list(generate(config(("lockout_dos",))))
    assert [e.wire | {"event_id": ""} for e in alone] == [
        e.wire | {"event_id": ""} for e in mixed() if e.label.scenario == "lockout_dos"
    ]


def test_brute_force_shape() -> None:
    """One address, one account, 240 bad passwords."""
    events = of("brute_force")
    assert len(events) == 240
    assert {e.wire["peer_ip"] for e in events} == {"203.0.113.7"}
    assert {e.wire["account"] for e in events} == {"victim.brute_force@example.com"}
    assert {e.wire["failure_reason"] for e in events} == {"bad_password"}


def test_distributed_brute_force_shape() -> None:
    """1,200 addresses, one account, one to three tries each; the owner signs in 6 times, trusted."""
    events = of("distributed_brute_force")
    per_ip = Counter(e.wire["peer_ip"] for e in events)
    assert len(per_ip) == 1200
    assert set(per_ip.values()) == {1, 2, 3}
    assert {e.wire["account"] for e in events} == {"victim.distributed_brute_force@example.com"}
    owner = of("distributed_brute_force", "owner")
    assert len(owner) == 6
    assert all(e.wire["device_trusted"] and e.wire["outcome"] == "success" for e in owner)


def test_spray_shape() -> None:
    """One address, 3,000 accounts (300 unknown) tried exactly twice each."""
    events = of("spray")
    assert {e.wire["peer_ip"] for e in events} == {"203.0.113.50"}
    per_account = Counter(e.wire["account"] for e in events)
    assert len(per_account) == 3000 and set(per_account.values()) == {2}
    unknown = {e.wire["account"] for e in events if e.wire["failure_reason"] == "unknown_account"}
    assert len(unknown) == 300


def test_low_and_slow_spray_stays_under_every_per_source_threshold() -> None:
    """150 addresses in tenant acme; each at most 20 attempts on 20 accounts; each account tried
    at most twice (under account_source 5, spray 200, stuffing 50, the ceiling 50)."""
    events = of("low_and_slow_spray")
    assert {e.wire["tenant"] for e in events} == {"acme"}
    per_source: dict[str, list[str]] = defaultdict(list)
    for e in events:
        per_source[e.wire["peer_ip"]].append(e.wire["account"])
    assert len(per_source) == 150
    assert max(len(v) for v in per_source.values()) == 20
    assert max(len(set(v)) for v in per_source.values()) == 20
    per_account = Counter(e.wire["account"] for e in events)
    assert len(per_account) == 1500 and set(per_account.values()) == {2}


def test_credential_stuffing_shape() -> None:
    """60 addresses, 4,200 attempts, mostly unknown accounts, a few valid reused pairs."""
    events = of("credential_stuffing")
    assert len(events) == 4200
    assert len({e.wire["peer_ip"] for e in events}) == 60
    reasons = Counter(e.wire.get("failure_reason", "success") for e in events)
    assert 0.85 < reasons["unknown_account"] / 4200 < 0.91
    assert 0 < reasons["success"] < 30


def test_lockout_dos_shape() -> None:
    """A stranger fails 400 times against each of two owners: one signs in 10 times from a
    trusted device (one typo), the other 10 times from an untrusted browser."""
    attacker = of("lockout_dos")
    by_account = Counter(e.wire["account"] for e in attacker)
    assert sorted(by_account.values()) == [400, 400]
    assert {e.wire["peer_ip"] for e in attacker} == {"203.0.113.66", "203.0.113.67"}
    owner = [e for e in of("lockout_dos", "owner") if e.label.cohort == "owner_trusted_device"]
    assert Counter(e.wire["outcome"] for e in owner) == {"success": 10, "failure": 1}
    assert all(e.wire["device_trusted"] for e in owner)
    untrusted = [
        e for e in of("lockout_dos", "owner") if e.label.cohort == "owner_without_trusted_device"
    ]
    assert len(untrusted) == 10 and not any(e.wire.get("device_trusted") for e in untrusted)
    assert {e.wire["account"] for e in owner + untrusted} == set(by_account)


def test_low_and_slow_bruteforce_shapes() -> None:
    """One address every 4 minutes; 13 rotating addresses every 20 s; one account each."""
    single = list(generate(SimConfig(("low_and_slow_bruteforce",), RATE, 24 * 3_600_000, 7, T0)))
    assert len(single) == 360 and {e.wire["peer_ip"] for e in single} == {"203.0.113.24"}
    assert {e.occurred_ms - prev.occurred_ms for prev, e in itertools.pairwise(single)} == {240_000}
    rotating = list(
        generate(SimConfig(("low_and_slow_bruteforce_rotating",), RATE, 24 * 3_600_000, 7, T0))
    )
    assert len(rotating) == 4320 and len({e.wire["peer_ip"] for e in rotating}) == 13
    assert len({e.wire["account"] for e in rotating}) == 1
    assert {e.wire["account"] for e in rotating}.isdisjoint({e.wire["account"] for e in single})


def test_uia_bruteforce_shape() -> None:
    """A thief guesses 60 times via uia in one stolen session; the owner's uia use another."""
    thief = of("uia_bruteforce")
    assert len(thief) == 60
    assert {e.wire["flow"] for e in thief} == {"uia"}
    assert len({e.wire["session_id"] for e in thief}) == 1
    owner_sessions = {e.wire.get("session_id") for e in of("uia_bruteforce", "owner")} - {None}
    assert len(owner_sessions) == 1 and owner_sessions.isdisjoint({thief[0].wire["session_id"]})


def test_baseline_shape() -> None:
    """Main-tenant rate near the asked one; the office behind one NAT; IPv6 households keep a
    /64; typos, resets, mfa and uia occur; a user fails at most three times between successes."""
    legit = of("baseline", "legit")
    main = [e for e in legit if e.label.actor.startswith("user:")]
    assert 0.85 * RATE < len(main) / (DURATION_MS / 1000) < 1.15 * RATE
    office = [e for e in legit if e.label.cohort == "nat_office"]
    assert office and {e.wire["peer_ip"] for e in office} == {"192.0.2.10"}
    v6: dict[str, set[str]] = defaultdict(set)
    for e in legit:
        if ":" in e.wire["peer_ip"] and e.wire.get("device_id", "").endswith("-0"):
            v6[e.label.actor].add(e.wire["peer_ip"])
    rotated = [ips for ips in v6.values() if len(ips) > 1]
    assert rotated
    for ips in rotated:
        assert len({ipaddress.IPv6Network(f"{ip}/64", strict=False) for ip in ips}) == 1
    flows = Counter((e.wire["flow"], e.wire["outcome"]) for e in legit)
    for seen in [
        ("login", "failure"),
        ("recovery", "success"),
        ("mfa", "success"),
        ("uia", "success"),
    ]:
        assert flows[seen] > 0, seen
    streak: Counter[str] = Counter()
    for e in legit:
        if e.wire["flow"] == "login" and e.wire.get("failure_reason") == "bad_password":
            streak[e.label.actor] += 1
            assert streak[e.label.actor] <= 3
        elif e.wire["outcome"] == "success":
            streak[e.label.actor] = 0
    assert {e.wire["tenant"] for e in legit} == {"default", "acme"}
    assert set(ATTACKS) == {e.label.scenario for e in mixed() if e.label.role == "attacker"}
