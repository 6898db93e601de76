"""The adaptive attackers of issue 44 (group ``adaptive``): determinism, valid wire events, and
each attack's rate, exits and valid share; own-account sign-ins and the people labelled."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from functools import cache

import orjson

from pipeline.contracts.codec import decode_attempt
from pipeline.sim.adaptive import CAFE_ADDRESS
from pipeline.sim.scenarios import (
    ADAPTIVE_SCENARIOS,
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
def run(seed: int = 7, hours: int = 1) -> tuple[SimEvent, ...]:
    return tuple(generate(SimConfig(ADAPTIVE_SCENARIOS, RATE, hours * HOUR_MS, seed, T0)))


def of(scenario: str, cohort: str | None = None, seed: int = 7) -> list[SimEvent]:
    return [
        e for e in run(seed) if e.label.scenario == scenario and cohort in (None, e.label.cohort)
    ]


def reason(e: SimEvent) -> str:
    return str(e.wire.get("failure_reason") or e.wire["outcome"])


def per_s(events: list[SimEvent]) -> float:
    return len(events) * 1000 / (events[-1].occurred_ms - events[0].occurred_ms)


def valid_share(events: list[SimEvent]) -> float:
    return sum(reason(e) == "success" for e in events) / len(events)


def by_ip(events: list[SimEvent]) -> dict[str, list[SimEvent]]:
    out: dict[str, list[SimEvent]] = defaultdict(list)
    for e in events:
        out[e.wire["peer_ip"]].append(e)
    return out


def test_adaptive_group_names_nine_scenarios_outside_mixed_and_holdout() -> None:
    """'adaptive' selects eight attacks and signs_in_again, none in 'mixed' or 'holdout'."""
    assert parse_scenarios("adaptive") == ADAPTIVE_SCENARIOS
    assert ADAPTIVE_SCENARIOS == (
        "static_exits",
        "known_exits",
        "known_exits_fast",
        "campaign_long",
        "paced_under_floors",
        "junk_waves",
        "captcha_cafe",
        "retry_after_hit",
        "signs_in_again",
    )
    assert set(ADAPTIVE_SCENARIOS).isdisjoint((*MIXED_SCENARIOS, *HOLDOUT_SCENARIOS))
    assert parse_scenarios("baseline,adaptive") == ("baseline", *ADAPTIVE_SCENARIOS)


def test_same_seed_gives_identical_events_and_truth_another_seed_others() -> None:
    """Two runs with seed 7 give the same ids, events and labels; seed 8 differs."""
    again = tuple(generate(SimConfig(ADAPTIVE_SCENARIOS, RATE, HOUR_MS, 7, T0)))
    assert [(e.event_id, orjson.dumps(e.wire), e.truth_row()) for e in again] == [
        (e.event_id, orjson.dumps(e.wire), e.truth_row()) for e in run()
    ]
    assert [e.wire for e in run(8)][:500] != [e.wire for e in run()][:500]


def test_every_event_decodes_as_a_login_attempt_and_is_labelled() -> None:
    """22,837 events in an hour, in order and in range; each decodes, is labelled, none refused."""
    events = run()
    assert len(events) == 22_837
    assert [e.occurred_ms for e in events] == sorted(e.occurred_ms for e in events)
    assert events[0].occurred_ms >= T0 and events[-1].occurred_ms < T0 + HOUR_MS
    for e in events:
        wire = decode_attempt(orjson.dumps(e.wire))
        assert wire.failure_reason != "refused"
        assert (wire.outcome == "failure") == (wire.failure_reason is not None)
        assert e.label.role in {"attacker", "legit"} and e.label.actor and e.label.cohort
    assert {e.label.scenario for e in events} == set(ADAPTIVE_SCENARIOS)


def test_attackers_own_accounts_are_their_own_and_their_hits_are_real_accounts() -> None:
    """Own-account sign-ins are cohort attacker_own_account, one account per attacker that no
    one else uses; every other attacker success is a real account of the population."""
    attackers = [e for e in run() if e.label.role == "attacker"]
    own = defaultdict(set)
    for e in attackers:
        if e.label.cohort == "attacker_own_account":
            assert reason(e) == "success" and not REAL_ACCOUNT.fullmatch(e.wire["account"])
            own[e.label.scenario].add(e.wire["account"])
        elif reason(e) == "success":
            assert e.label.cohort == "attacker" and REAL_ACCOUNT.fullmatch(e.wire["account"])
    assert {s: len(a) for s, a in own.items()} == {
        "known_exits": 1,
        "known_exits_fast": 1,
        "campaign_long": 1,
        "junk_waves": 1,
    }
    mine = set().union(*own.values())
    assert len(mine) == 4
    assert not [e for e in run() if e.wire["account"] in mine and e.label.role != "attacker"]


def test_static_exits_three_addresses_the_whole_hour_at_half_an_attempt_a_second() -> None:
    """1,800 guesses from 3 exits (600 each) over the whole hour, 0.5/s; 45 valid (2.5 %)."""
    events = of("static_exits")
    assert len(events) == 1800 and abs(per_s(events) - 0.5) < 0.001
    assert sorted(len(v) for v in by_ip(events).values()) == [600, 600, 600]
    assert events[-1].occurred_ms - events[0].occurred_ms > 59 * MINUTE_MS
    assert Counter(reason(e) for e in events)["success"] == 45 and valid_share(events) == 0.025


def test_known_exits_make_each_of_ten_exits_known_before_guessing() -> None:
    """10 exits, each first an own-account sign-in, then guesses over 48 min: 1,584 at 0.55/s
    (40 valid) and 8,640 at 3/s for the fast one (216 valid)."""
    for name, guesses, rate, valid in (
        ("known_exits", 1584, 0.55, 40),
        ("known_exits_fast", 8640, 3.0, 216),
    ):
        exits = by_ip(of(name))
        assert len(exits) == 10
        for events in exits.values():
            assert [e.label.cohort for e in events].count("attacker_own_account") == 1
            assert events[0].label.cohort == "attacker_own_account"
        stuffing = of(name, "attacker")
        assert len(stuffing) == guesses and abs(per_s(stuffing) - rate) < 0.01
        assert 6 * MINUTE_MS <= stuffing[0].occurred_ms - T0 < 6 * MINUTE_MS + 1_000
        assert stuffing[-1].occurred_ms - T0 < 54 * MINUTE_MS
        assert Counter(reason(e) for e in stuffing)["success"] == valid
        assert 0.02 <= valid_share(stuffing) <= 0.03


def test_campaign_long_lasts_the_run_from_20_proxies_with_its_own_account_between() -> None:
    """1,800 guesses (0.5/s) over the whole run from 20 proxies, 45 valid; each proxy signs in
    to its own account before its first guess and after every 5 (360 own sign-ins); a 4 h run
    makes a 4 h campaign."""
    guesses = of("campaign_long", "attacker")
    assert len(guesses) == 1800 and abs(per_s(guesses) - 0.5) < 0.001
    assert Counter(reason(e) for e in guesses)["success"] == 45
    exits = by_ip(of("campaign_long"))
    assert len(exits) == 20
    for events in exits.values():
        cohorts = [e.label.cohort for e in events]
        assert cohorts[0] == "attacker_own_account"
        assert cohorts.count("attacker_own_account") == 18 and cohorts.count("attacker") == 90
    config = SimConfig(("campaign_long",), RATE, 4 * HOUR_MS, 7, T0)
    long = [e for e in generate(config) if e.label.cohort == "attacker"]
    assert len(long) == 7200 and long[-1].occurred_ms - long[0].occurred_ms > 239 * MINUTE_MS


def test_paced_under_floors_uses_each_exit_once_under_every_floor() -> None:
    """152 guesses over the hour, each from its own exit, 4 valid; every 10 minutes between
    0.02 and 0.07 a second."""
    events = of("paced_under_floors")
    assert len(events) == 152 == len(by_ip(events))
    assert Counter(reason(e) for e in events)["success"] == 4
    tens = Counter((e.occurred_ms - T0) // (10 * MINUTE_MS) for e in events)
    assert sorted(tens.items()) == [(0, 36), (1, 32), (2, 32), (3, 19), (4, 13), (5, 20)]
    assert all(0.02 * 600 <= n <= 0.07 * 600 for n in tens.values())


def test_junk_waves_fail_for_made_up_names_from_ten_known_exits_for_30_minutes() -> None:
    """4,500 failures for identifiers that do not exist, 2.5/s for 30 minutes, from 10 exits
    each made known before by one own-account sign-in; no valid credential."""
    junk = of("junk_waves", "attacker")
    assert len(junk) == 4500 and abs(per_s(junk) - 2.5) < 0.01
    assert {reason(e) for e in junk} == {"unknown_account"}
    assert not any(REAL_ACCOUNT.fullmatch(e.wire["account"]) for e in junk)
    assert 29 * MINUTE_MS < junk[-1].occurred_ms - junk[0].occurred_ms <= 30 * MINUTE_MS
    own = of("junk_waves", "attacker_own_account")
    assert len(own) == 10 and {e.wire["peer_ip"] for e in own} == {e.wire["peer_ip"] for e in junk}
    assert max(e.occurred_ms for e in own) < junk[0].occurred_ms


def test_captcha_cafe_fails_five_captchas_among_the_cafes_legitimate_people() -> None:
    """Five failed CAPTCHAs at the café; 6 regulars on trusted laptops before and after, 6
    newcomers on new browsers after (one typo first), all legit at the café's address."""
    captchas = [e for e in of("captcha_cafe") if e.label.role == "attacker"]
    assert len(captchas) == 5
    for e in captchas:
        assert e.wire["flow"] == "challenge" and e.wire["challenge"] == "captcha"
        assert reason(e) == "other" and e.wire["peer_ip"] == CAFE_ADDRESS
    people = [e for e in of("captcha_cafe") if e.label.role != "attacker"]
    assert {e.label.role for e in people} == {"legit"}
    assert {e.wire["peer_ip"] for e in people} == {CAFE_ADDRESS}
    regulars = of("captcha_cafe", "cafe_regular")
    assert len(regulars) == 12 and all(e.wire["device_trusted"] for e in regulars)
    assert sum(e.occurred_ms < captchas[0].occurred_ms for e in regulars) == 6
    newcomers = of("captcha_cafe", "cafe_newcomer")
    assert Counter((e.wire["flow"], reason(e)) for e in newcomers) == {
        ("login", "success"): 6,
        ("mfa", "success"): 6,
        ("login", "bad_password"): 1,
    }
    assert min(e.occurred_ms for e in newcomers) > captchas[0].occurred_ms
    assert len({e.label.actor for e in newcomers}) == 6


def test_retry_after_hit_signs_in_again_20_s_after_each_valid_hit() -> None:
    """3,600 guesses at 2/s, each from its own exit, 90 valid (2.5 %); each hit is retried on
    the same account from the same exit exactly 20 s later."""
    events = of("retry_after_hit")
    exits = by_ip(events)
    assert len(events) == 3690 and len(exits) == 3600
    for tried in exits.values():
        if reason(tried[0]) == "success":
            assert len(tried) == 2 and tried[1].wire["account"] == tried[0].wire["account"]
            assert tried[1].occurred_ms - tried[0].occurred_ms == 20_000
            assert reason(tried[1]) == "success"
        else:
            assert len(tried) == 1
    assert Counter(reason(e) for e in events)["success"] == 180


def test_signs_in_again_from_the_same_browser_minutes_later() -> None:
    """60 people, legit: a sign-in and its second factor from a new browser, then again from
    the same browser and address 2 to 10 minutes later."""
    events = of("signs_in_again")
    assert {(e.label.role, e.label.cohort) for e in events} == {("legit", "signs_in_again")}
    people: dict[str, list[SimEvent]] = defaultdict(list)
    for e in events:
        people[e.label.actor].append(e)
    assert len(people) == 60
    for mine in people.values():
        sign_ins = [e for e in mine if e.wire["flow"] == "login" and reason(e) == "success"]
        assert len(sign_ins) == 2 and not any(e.wire["device_trusted"] for e in mine)
        first, again = sign_ins
        assert first.wire["device_id"] == again.wire["device_id"]
        assert first.wire["peer_ip"] == again.wire["peer_ip"]
        assert 2 * MINUTE_MS <= again.occurred_ms - first.occurred_ms < 11 * MINUTE_MS
        assert [e.wire["flow"] for e in mine].count("mfa") == 2
