"""The held-out scenarios of issue 24 (group ``holdout``): determinism, valid wire events, and
each attack's and each cohort's shape."""

from __future__ import annotations

import ipaddress
import re
from collections import Counter, defaultdict
from functools import cache

import orjson

from pipeline.contracts.codec import decode_attempt
from pipeline.sim.scenarios import (
    HOLDOUT_SCENARIOS,
    MIXED_SCENARIOS,
    SimConfig,
    SimEvent,
    generate,
    parse_scenarios,
)

T0 = 1_789_999_200_000
HOUR_MS = 3_600_000
MINUTE_MS = 60_000
RATE = 5.0
REAL_ACCOUNT = re.compile(r"user\d{7}@example\.com")


@cache
def run(
    seed: int = 7, hours: int = 1, scenarios: tuple[str, ...] = HOLDOUT_SCENARIOS
) -> tuple[SimEvent, ...]:
    return tuple(generate(SimConfig(scenarios, RATE, hours * HOUR_MS, seed, T0)))


def of(scenario: str, role: str | None = None, cohort: str | None = None) -> list[SimEvent]:
    return [
        e
        for e in run()
        if e.label.scenario == scenario
        and role in (None, e.label.role)
        and cohort in (None, e.label.cohort)
    ]


def reason(e: SimEvent) -> str:
    return str(e.wire.get("failure_reason") or "success")


def source(ip: str) -> str:
    """The address, or its /64 for IPv6 (the pipeline's default grouping)."""
    if ":" in ip:
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False))
    return ip


def by_actor(events: list[SimEvent]) -> dict[str, list[SimEvent]]:
    out: dict[str, list[SimEvent]] = defaultdict(list)
    for e in events:
        out[e.label.actor].append(e)
    return out


def test_holdout_group_names_the_new_scenarios_and_mixed_is_unchanged() -> None:
    """'holdout' selects the 13 new scenarios, none of them in 'mixed'; groups combine with names."""
    assert parse_scenarios("holdout") == HOLDOUT_SCENARIOS
    assert len(HOLDOUT_SCENARIOS) == 13
    assert set(HOLDOUT_SCENARIOS).isdisjoint(parse_scenarios("mixed"))
    assert parse_scenarios("mixed") == MIXED_SCENARIOS
    assert parse_scenarios("library, baseline") == ("baseline", "library")
    assert parse_scenarios("baseline,holdout") == ("baseline", *HOLDOUT_SCENARIOS)


def test_same_seed_gives_identical_events_another_seed_others() -> None:
    """Two runs with seed 7 are byte-identical (ids, events, labels); seed 8 differs."""
    again = tuple(generate(SimConfig(HOLDOUT_SCENARIOS, RATE, HOUR_MS, 7, T0)))
    assert [(e.event_id, orjson.dumps(e.wire), e.label) for e in again] == [
        (e.event_id, orjson.dumps(e.wire), e.label) for e in run()
    ]
    assert [e.wire for e in run(8)][:500] != [e.wire for e in run()][:500]


def test_every_event_decodes_is_labelled_and_in_range() -> None:
    """41,028 events in an hour; each decodes as login_attempt, is labelled, none is refused."""
    events = run()
    assert len(events) == 41_028
    assert [e.occurred_ms for e in events] == sorted(e.occurred_ms for e in events)
    assert events[0].occurred_ms >= T0 and events[-1].occurred_ms < T0 + HOUR_MS
    for e in events:
        wire = decode_attempt(orjson.dumps(e.wire))
        assert wire.failure_reason != "refused"
        assert (wire.outcome == "failure") == (wire.failure_reason is not None)
        assert e.label.scenario in HOLDOUT_SCENARIOS and e.label.actor and e.label.cohort
        assert e.label.role in {"attacker", "owner", "legit"}
    assert {e.label.scenario for e in events} == set(HOLDOUT_SCENARIOS)


def test_stuffing_pool_once_never_reuses_an_address() -> None:
    """8,400 attempts over 20 min, each from its own address and /64 (2,940 IPv6); 210 valid
    (2.5 %), 1,260 real accounts with a wrong password (15 %), the rest unknown identifiers."""
    events = of("stuffing_pool_once")
    assert len(events) == 8400
    assert len({source(e.wire["peer_ip"]) for e in events}) == 8400
    assert sum(":" in e.wire["peer_ip"] for e in events) == 2940
    assert events[-1].occurred_ms - events[0].occurred_ms <= 20 * MINUTE_MS
    reasons = Counter(reason(e) for e in events)
    assert reasons == {"success": 210, "bad_password": 1260, "unknown_account": 6930}
    real = [e.wire["account"] for e in events if reason(e) != "unknown_account"]
    assert all(REAL_ACCOUNT.fullmatch(a) for a in real) and len(set(real)) == len(real)
    assert not any(
        REAL_ACCOUNT.fullmatch(e.wire["account"]) for e in events if reason(e) == "unknown_account"
    )
    uas = {e.wire["user_agent"] for e in events}
    assert len(uas) == 12 and all(ua.startswith("Mozilla/5.0") for ua in uas)


def test_stuffing_pool_twice_tries_each_address_exactly_twice() -> None:
    """4,200 addresses, two attempts each, seconds apart; 210 valid pairs."""
    events = of("stuffing_pool_twice")
    per_ip = by_actor(events)
    assert len(per_ip) == 4200 and {len(v) for v in per_ip.values()} == {2}
    assert all(1_500 <= b.occurred_ms - a.occurred_ms < 6_000 for a, b in per_ip.values())
    assert Counter(reason(e) for e in events)["success"] == 210


def test_spray_pool_shape() -> None:
    """300 addresses, 1,500 harvested accounts (225 unknown), two passwords; 30 accounts have a
    sprayed password and are not tried after their success; no address tries an account twice."""
    events = of("spray_pool")
    assert len({e.wire["peer_ip"] for e in events}) == 300
    assert len({e.wire["account"] for e in events}) == 1500
    assert len({e.wire["account"] for e in events if reason(e) == "unknown_account"}) == 225
    won = [e for e in events if reason(e) == "success"]
    assert len(won) == 30 and len({e.wire["account"] for e in won}) == 30
    for e in won:
        assert not [
            x
            for x in events
            if x.wire["account"] == e.wire["account"] and x.occurred_ms > e.occurred_ms
        ]
    pairs = Counter((e.wire["peer_ip"], e.wire["account"]) for e in events)
    assert set(pairs.values()) == {1}
    assert len(events) == 2985


def test_stuffing_own_account_signs_in_to_its_own_account_from_every_exit() -> None:
    """300 exits, each 9 guesses, one failure then 3 successes on one own account, that
    failure before the exit's first own success; the guesses hold 68 valid pairs."""
    events = of("stuffing_own_account")
    own = [e for e in events if e.label.cohort == "attacker_own_account"]
    assert len({e.wire["account"] for e in own}) == 1
    per_exit = by_actor(events)
    assert len(per_exit) == 300
    for tries in per_exit.values():
        kinds = [(e.label.cohort, reason(e)) for e in tries]
        assert Counter(kinds)[("attacker_own_account", "success")] == 3
        assert Counter(kinds)[("attacker_own_account", "bad_password")] == 1
        assert sum(c == "attacker" for c, _ in kinds) == 9
        assert kinds.index(("attacker_own_account", "bad_password")) < kinds.index(
            ("attacker_own_account", "success")
        )
    guesses = [e for e in events if e.label.cohort == "attacker"]
    assert Counter(reason(e) for e in guesses)["success"] == 68


def test_second_wave_follows_the_first_by_more_than_an_hour_in_three_hours() -> None:
    """In 3 h: the first wave within minutes 10-30, the spray within 100-130 and the second wave
    within 110-130 (8,400 attempts each wave); in 1 h the same plan, a third as long."""
    events = [e for e in run(hours=3, scenarios=("second_wave",))]
    minutes = defaultdict(list)
    for e in events:
        minutes[e.label.cohort].append((e.occurred_ms - T0) / MINUTE_MS)
    assert min(minutes["first_wave"]) >= 10 and max(minutes["first_wave"]) < 30.2
    assert min(minutes["spray_wave"]) >= 100 and max(minutes["spray_wave"]) < 130
    assert min(minutes["second_wave"]) >= 110 and max(minutes["second_wave"]) < 130.2
    assert min(minutes["spray_wave"]) - max(minutes["first_wave"]) > 60
    assert len(minutes["first_wave"]) == len(minutes["second_wave"]) == 8400
    short = Counter(e.label.cohort for e in of("second_wave"))
    assert short == {"first_wave": 2800, "spray_wave": 2985, "second_wave": 2800}
    spray = [(e.occurred_ms - T0) / MINUTE_MS for e in of("second_wave", cohort="spray_wave")]
    assert min(spray) >= 33.3 and max(spray) < 43.4


def test_mfa_code_guessing_uses_a_fresh_cookie_per_guess() -> None:
    """3 accounts, 378 guesses each in 42 min (540 per account-hour), each a sign-in with the
    right password then a wrong code, both with a cookie never used again; no code succeeds;
    each owner signs in 4 times from a trusted laptop."""
    events = of("mfa_code_guessing", "attacker")
    codes = [e for e in events if e.wire["flow"] == "mfa"]
    assert Counter(e.wire["account"] for e in codes) == {
        f"victim.mfa_code_guessing.{k}@example.com": 378 for k in range(3)
    }
    assert {reason(e) for e in codes} == {"bad_second_factor"}
    cookies = Counter(e.wire["device_id"] for e in events)
    assert len(cookies) == 3 * 378 and set(cookies.values()) == {2}
    first = [e for e in events if e.wire["flow"] == "login"]
    assert {reason(e) for e in first} == {"success"}
    assert {e.label.cohort for e in first} == {"attacker_first_factor"}
    assert not any(e.wire["device_trusted"] for e in events)
    owners = of("mfa_code_guessing", "owner")
    assert len(owners) == 12 and all(e.wire["device_trusted"] for e in owners)


def test_identifier_tryers_try_two_or_three_absent_identifiers_then_the_right_one() -> None:
    """240 people; each fails two or three times on identifiers no one signs in with, then
    succeeds with the right one; those who reset fail once, reset, then sign in."""
    people = by_actor(of("identifier_tryers"))
    assert len(people) == 240
    signed_in = {e.wire["account"] for e in run() if reason(e) == "success"}
    resets = 0
    for events in people.values():
        login = [e for e in events if e.wire["service"] == "web-login"]
        unknown = [e for e in login if reason(e) == "unknown_account"]
        assert len(unknown) in (2, 3) and login[: len(unknown)] == unknown
        assert not {e.wire["account"] for e in unknown} & signed_in
        rest = [(e.wire["flow"], reason(e)) for e in login[len(unknown) :]]
        if ("reset", "success") in rest:
            resets += 1
            assert rest[:3] == [
                ("login", "bad_password"),
                ("reset", "success"),
                ("login", "success"),
            ]
        else:
            assert rest[0] == ("login", "success")
    assert resets == 54


def test_stale_usernames_fill_an_old_identifier_then_the_right_one() -> None:
    """150 people: one or two unknown_account, then a success; 60 sign in on their own trusted
    laptop, whose cookie the stale attempt carried untrusted."""
    people = by_actor(of("stale_usernames"))
    assert len(people) == 150
    trusted = 0
    for events in people.values():
        kinds = [reason(e) for e in events if e.wire["flow"] == "login"]
        assert kinds in (["unknown_account", "success"], ["unknown_account"] * 2 + ["success"])
        assert not events[0].wire["device_trusted"]
        if events[-1].wire["device_trusted"]:
            trusted += 1
            assert events[0].wire["device_id"] == events[-1].wire["device_id"]
    assert trusted == 60


def test_library_patrons_share_one_address_and_one_types_two_wrong_identifiers() -> None:
    """60 patrons, one address, no trusted browser; one patron fails twice on unknown identifiers."""
    events = of("library")
    assert {e.wire["peer_ip"] for e in events} == {"192.0.2.30"}
    assert len(by_actor(events)) == 60
    assert not any(e.wire["device_trusted"] for e in events)
    unknown = [e for e in events if reason(e) == "unknown_account"]
    assert len(unknown) == 2 and len({e.label.actor for e in unknown}) == 1


def test_forgot_password_people_fail_five_times_then_reset_then_sign_in() -> None:
    """90 people: five bad_password, a reset success, a login success with the new password."""
    people = by_actor(of("forgot_password"))
    assert len(people) == 90
    for events in people.values():
        steps = [(e.wire["flow"], reason(e)) for e in events if e.wire["flow"] != "mfa"]
        assert steps == [("login", "bad_password")] * 5 + [
            ("reset", "success"),
            ("login", "success"),
        ]


def test_office_colleagues_on_trusted_laptops_and_a_guest_behind_one_address() -> None:
    """50 colleagues sign in from trusted laptops behind 192.0.2.20; at minute 12 a guest on that
    address, untrusted, types two identifiers that do not exist."""
    colleagues = of("office_guest_wifi", cohort="office_colleague")
    assert len(by_actor(colleagues)) == 50
    assert all(e.wire["device_trusted"] for e in colleagues)
    guest = of("office_guest_wifi", cohort="guest_visitor")
    assert [reason(e) for e in guest] == ["unknown_account"] * 2
    assert {e.wire["peer_ip"] for e in colleagues + guest} == {"192.0.2.20"}
    assert guest[0].occurred_ms == T0 + 12 * MINUTE_MS and not guest[0].wire["device_trusted"]
