"""The wave's slow tier (``StrangersConfig``): strangers' failures nobody then signs in from."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise

import pytest

from pipeline.contracts.codec import encode
from pipeline.contracts.models import Decision, datetime_to_ms
from pipeline.core.attempt import Attempt
from pipeline.core.decision_keys import keys_for
from pipeline.core.engine import Engine
from pipeline.core.errors import PolicyError
from pipeline.core.policy import DEFAULT_POLICY, Policy, policy_from_toml
from tests.unit.test_core_support import MIN, SEC, T0, att

HISTORY_MS = 61 * MIN  # past min_history_ms (20 min) of the tenant
PACE_MS = 4 * SEC  # 0.25 attempts a second: a sixth of rule 8's paced sum
WINDOW_MS = 10 * SEC
REDEEM_MS = 5 * MIN
QUICK_MS = 10 * SEC
SETTLED_ONLY = policy_from_toml("[defaults.strangers]\nquick_min_sources = 0\n")
"""The settled check alone (the quick check off)."""


def _history() -> list[Attempt]:
    """An hour of people mistyping once at a new place and signing in there 20 s later."""
    out = []
    for i in range(HISTORY_MS // (30 * SEC)):
        account, home, t = f"{i:030x}pp", f"198.51.{i // 250}.{i % 250}", i * 30 * SEC
        out += [att(t, account, home), att(t + 20 * SEC, account, home, success=True)]
    return out


def _stuffer(count: int, reason: str = "bad_password", start_ms: int = HISTORY_MS) -> list[Attempt]:
    """A proxy pool used once per exit, one attempt every 4 s, each a new account."""
    return [
        att(start_ms + i * PACE_MS, f"{i:030x}ss", f"240.0.{i // 250}.{i % 250}", reason=reason)
        for i in range(count)
    ]


def _run(attempts: list[Attempt], policy: Policy = DEFAULT_POLICY) -> Engine:
    engine = Engine(policy)
    engine.run(sorted(attempts, key=lambda a: (a.occurred_ms, a.event_id)))
    return engine


def _waves(engine: Engine) -> list[Decision]:
    return [d for _, d in engine.out.decisions if d is not None and d.scope == "tenant"]


def _first_firing() -> tuple[int, int]:
    """Where the default tier first fires on ``_stuffer``: the settled window holding its
    40th exit (every exit before it unredeemed), and how many exits that window closes."""
    windows = [(T0 + HISTORY_MS + i * PACE_MS) // WINDOW_MS for i in range(40)]
    window = windows[-1]
    return window, sum(
        1 for i in range(60) if (T0 + HISTORY_MS + i * PACE_MS) // WINDOW_MS <= window
    )


def test_a_paced_stuffer_under_rule_8_is_challenged_once_its_exits_settle() -> None:
    """0.25 attempts/s from exits used once (under rule 8's 40 a minute): when the window
    holding the 40th unredeemed exit has waited redeem_ms, the tier alerts strangers_tenant
    and challenges the tenant's untrusted strangers for the hold; its lead-in reaches back
    5 minutes before that window's end (the settled check alone)."""
    engine = _run([*_history(), *_stuffer(200)], SETTLED_ONLY)
    window, count = _first_firing()
    alerts = [a for a in engine.out.alerts if a.type == "strangers_tenant"]
    assert [(a.count, datetime_to_ms(a.window_end)) for a in alerts] == [
        (count, (window + 1) * WINDOW_MS)
    ]
    assert not [a for a in engine.out.alerts if a.type == "spray_tenant"]
    first = _waves(engine)[0]
    issued = (window + 1) * WINDOW_MS + REDEEM_MS
    assert (first.rule, first.action, first.challenge) == (
        "strangers_tenant",
        "challenge",
        "captcha",
    )
    assert (datetime_to_ms(first.issued_at), datetime_to_ms(first.expires_at)) == (
        issued,
        issued + MIN,
    )
    assert first.window_ms == issued - ((window + 1) * WINDOW_MS - 5 * MIN)
    # It holds while exits keep coming at the floor's pace: one wave, no gap.
    spans = [(datetime_to_ms(d.issued_at), datetime_to_ms(d.expires_at)) for d in _waves(engine)]
    assert all(later[0] <= earlier[1] for earlier, later in pairwise(spans))
    # The next stranger meets a captcha; the owner's trusted laptop does not.
    stranger = att(issued - T0 + SEC, "f" * 32, "240.9.9.9")
    owner = att(issued - T0 + SEC, "e" * 32, "240.9.9.9", device="laptop", trusted=True)
    index = engine.accounts.index
    assert index.check(keys_for(stranger), stranger.occurred_ms).challenge == "captcha"
    assert index.check(keys_for(owner), owner.occurred_ms).challenge is None


def test_the_wave_ends_about_redeem_ms_after_the_last_exit_and_never_before_min_history() -> None:
    """The wave's last record is issued within redeem_ms + active_ms (and a window) of the
    stuffer's last attempt; the same stuffer with no history behind it (its last window
    settles 18 min in, before min_history_ms) raises nothing."""
    engine = _run([*_history(), *_stuffer(200)])
    last_attempt = T0 + HISTORY_MS + 199 * PACE_MS
    last_issued = max(datetime_to_ms(d.issued_at) for d in _waves(engine))
    assert last_attempt < last_issued <= last_attempt + REDEEM_MS + MIN + WINDOW_MS
    cold = _run(_stuffer(200, start_ms=0))
    assert _waves(cold) == []
    assert [a for a in cold.out.alerts if a.type == "strangers_tenant"] == []


def test_the_quick_check_answers_a_paced_stuffer_within_a_minute() -> None:
    """The same stuffer: quick_ms (10 s) after the window holding its 10th exit ends, the
    last minute of windows as they stand then holds 10 unredeemed exits (the floor; the
    people before it all signed in within 20 s): strangers_tenant is alerted and the
    wave challenge issued, under a minute after the first exit, its lead-in 5 minutes
    before that window's end; the settled check alone answers 5 minutes later."""
    engine = _run([*_history(), *_stuffer(200)])
    start = T0 + HISTORY_MS
    window = (start + 9 * PACE_MS) // WINDOW_MS
    closed = sum(1 for i in range(60) if (start + i * PACE_MS) // WINDOW_MS <= window)
    alerts = [a for a in engine.out.alerts if a.type == "strangers_tenant"]
    assert [(a.count, datetime_to_ms(a.window_end)) for a in alerts] == [
        (closed, (window + 1) * WINDOW_MS)
    ]
    first = _waves(engine)[0]
    issued = (window + 1) * WINDOW_MS + QUICK_MS
    assert (first.rule, first.action) == ("strangers_tenant", "challenge")
    assert datetime_to_ms(first.issued_at) == issued
    assert issued - start <= MIN
    assert first.window_ms == issued - ((window + 1) * WINDOW_MS - 5 * MIN)
    settled = _waves(_run([*_history(), *_stuffer(200)], SETTLED_ONLY))[0]
    assert datetime_to_ms(settled.issued_at) - issued >= REDEEM_MS
    # One wave from the quick check on: no gap while the exits keep the pace.
    spans = [(datetime_to_ms(d.issued_at), datetime_to_ms(d.expires_at)) for d in _waves(engine)]
    assert all(later[0] <= earlier[1] for earlier, later in pairwise(spans))


def test_one_alert_per_wave_whichever_check_fires_it() -> None:
    """A stuffer pausing 40 s after every 30 exits: the quick check's minute drops under
    its floor in each pause and fires again after it, while the wave's record (held a
    minute) is still in force: one alert. A second stuffer 30 minutes later is a new
    wave: a second alert."""
    paused = [
        a._replace(occurred_ms=a.occurred_ms + (i // 30) * 40 * SEC)
        for i, a in enumerate(_stuffer(90))
    ]
    second = [
        a._replace(event_id=a.event_id + "-2", account=a.account[:-2] + "s2")
        for a in _stuffer(45, start_ms=HISTORY_MS + 30 * MIN)
    ]
    engine = _run([*_history(), *paused, *second])
    issued = [datetime_to_ms(d.issued_at) for d in _waves(engine)]
    quick = [t for t in issued if (t - QUICK_MS) % WINDOW_MS == 0 and t < T0 + HISTORY_MS + 8 * MIN]
    assert any(later - earlier > WINDOW_MS for earlier, later in pairwise(quick)), "a pause"
    alerts = [a for a in engine.out.alerts if a.type == "strangers_tenant"]
    assert [datetime_to_ms(a.window_end) - (T0 + HISTORY_MS) < 30 * MIN for a in alerts] == [
        True,
        False,
    ]


def test_the_quick_check_stays_over_a_tenants_own_slow_sign_ins() -> None:
    """A tenant whose people fail at a new place 12 times a minute and sign in 70 s later:
    every quick-check minute holds 12-13 of them unredeemed, over the floor (10), but the
    baseline (the 0.99 quantile of the minute sums, the latest ones still unredeemed)
    is as high, so they raise nothing, quick or settled."""
    slow = []
    for i in range(2 * HISTORY_MS // (5 * SEC)):
        account, home, t = f"{i:030x}bp", f"198.52.{i // 250}.{i % 250}", i * 5 * SEC
        slow += [att(t, account, home), att(t + 70 * SEC, account, home, success=True)]
    engine = _run(slow)
    assert [a for a in engine.out.alerts if a.type == "strangers_tenant"] == []
    assert _waves(engine) == []


def test_people_who_fail_at_a_new_place_then_sign_in_there_raise_nothing() -> None:
    """600 people in 40 minutes (0.25 a second, like the stuffer): each tries one or two
    identifiers that do not exist, or a wrong password five times then a mailbox reset
    4 minutes later, then signs in from the same place: no alert, no wave."""
    people = []
    for i in range(600):
        t, home = HISTORY_MS + i * PACE_MS, f"203.0.{i // 250}.{i % 250}"
        account = f"{i:030x}rr"
        if i % 3:
            people += [
                att(t, f"{i:030x}u1", home, reason="unknown_account"),
                att(t + 8 * SEC, f"{i:030x}u2", home, reason="unknown_account"),
                att(t + 20 * SEC, account, home, success=True),
            ]
        else:
            people += [att(t + k * 15 * SEC, account, home) for k in range(5)]
            people.append(att(t + 4 * MIN, account, home, success=True, flow="reset"))
    engine = _run([*_history(), *people])
    assert _waves(engine) == []
    assert [a for a in engine.out.alerts if a.type == "strangers_tenant"] == []


def test_one_account_failing_from_a_thousand_addresses_counts_once_per_recount() -> None:
    """A guesser rotating 1,000 addresses on one account (the lock's job, seed 002): the
    account counts once per tenant_spray.recount_ms, so the tier never fires."""
    guesses = [
        att(HISTORY_MS + i * 3 * SEC, "d" * 32, f"240.1.{i // 250}.{i % 250}") for i in range(1000)
    ]
    engine = _run([*_history(), *guesses])
    assert [a for a in engine.out.alerts if a.type == "strangers_tenant"] == []


def test_an_attackers_own_account_redeems_no_exit_beyond_its_quota() -> None:
    """After each stuffing failure the attacker fails, then signs in, on its own account
    from the same exit (issue 24's 'redemption'): only the account whose failure made the
    exit pending redeems it, and the own account makes 20 exits familiar a day; the
    settled check fires at the window holding the 60th exit (40 unredeemed past the 20
    made known), the quick one at the window holding the 30th (10 past the 20)."""
    own = "0" * 31 + "o"
    stuffer = _stuffer(200)
    tricks = []
    for a in stuffer:
        tricks += [
            a._replace(event_id=a.event_id + "-f", account=own, occurred_ms=a.occurred_ms + 500),
            a._replace(
                event_id=a.event_id + "-s",
                account=own,
                occurred_ms=a.occurred_ms + 1000,
                success=True,
                failure_reason=None,
            ),
        ]
    windows = [(T0 + HISTORY_MS + i * PACE_MS) // WINDOW_MS for i in range(60)]
    for policy, exits in ((SETTLED_ONLY, 60), (DEFAULT_POLICY, 30)):
        engine = _run([*_history(), *stuffer, *tricks], policy)
        alerts = [a for a in engine.out.alerts if a.type == "strangers_tenant"]
        assert [datetime_to_ms(a.window_end) for a in alerts] == [
            (windows[exits - 1] + 1) * WINDOW_MS
        ]


def test_it_is_existence_blind_and_has_an_observe_mode_and_an_off_switch() -> None:
    """The same exits on absent identifiers give byte-identical wave records; observe mode
    publishes them as observe; enabled = false raises nothing."""
    real = _run([*_history(), *_stuffer(200)])
    absent = _run([*_history(), *_stuffer(200, reason="unknown_account")])
    assert [d.model_dump_json() for d in _waves(real)] == [
        d.model_dump_json() for d in _waves(absent)
    ]
    observe = _run(
        [*_history(), *_stuffer(200)], policy_from_toml('[defaults.wave]\nmode = "observe"\n')
    )
    with pytest.raises(PolicyError, match=r"strangers\.quick_ms must be"):
        policy_from_toml("[defaults.strangers]\nquick_ms = 300001\n")
    assert {d.action for d in _waves(observe)} == {"observe"}
    off = _run(
        [*_history(), *_stuffer(200)], policy_from_toml("[defaults.strangers]\nenabled = false\n")
    )
    assert _waves(off) == []
    assert [a for a in off.out.alerts if a.type == "strangers_tenant"] == []


def test_rule_8_firing_inside_the_tiers_wave_keeps_the_tiers_lead_in() -> None:
    """A burst that fires rule 8 while the slow tier's wave is in force publishes on the
    same tenant key: its record reaches back to the tier's lead-in (5 minutes), not only
    its own minute, so the sessions the tier's lead-in covers are still reviewed."""
    first = _waves(_run([*_history(), *_stuffer(200)]))[0]
    tier_since = datetime_to_ms(first.issued_at) - first.window_ms
    burst_ms = datetime_to_ms(first.issued_at) - T0 + 20 * SEC
    burst = [
        att(burst_ms + i * 50, f"{i:030x}bb", f"240.7.{i // 250}.{i % 250}") for i in range(80)
    ]
    engine = _run([*_history(), *_stuffer(200), *burst])
    spray = [d for d in _waves(engine) if d.rule == "spray_tenant"]
    assert spray, "the burst fires rule 8"
    assert {datetime_to_ms(d.issued_at) - d.window_ms for d in spray} == {tier_since}
    # Without the tier's wave in force, rule 8 reaches back its own minute only.
    alone = _run([*_history(), *burst])
    (own,) = {
        datetime_to_ms(d.issued_at) - d.window_ms for d in _waves(alone) if d.rule == "spray_tenant"
    }
    assert own > tier_since


def test_the_lead_in_union_is_the_same_when_the_rollups_tick_jumps() -> None:
    """The stream's rollup advances as marks come, so its tick may jump seconds and both
    tiers then issue in one evaluation; the engine's advances with every event. A burst
    fires rule 8 one second before the tier's first record is issued: the stream's twin
    (batches of 100 events) publishes the same wave records as the engine, lead-ins
    included (rule 8's own minute, then the tier's 5 minutes)."""
    import orjson

    from pipeline.contracts.codec import decode_attempt
    from pipeline.settings import Settings
    from pipeline.stream.ingest import Record
    from pipeline.stream.memory import MemoryPipeline
    from pipeline.wiring import build_normaliser

    tier = _waves(_run([*_history(), *_stuffer(200)]))[0]
    settle_ms = datetime_to_ms(tier.issued_at) - T0  # a stuffer attempt falls on it
    burst = [
        att(settle_ms - 2 * SEC + i * 10, f"{i:030x}bb", f"240.7.{i // 250}.{i % 250}")
        for i in range(80)
    ]
    attempts = sorted([*_history(), *_stuffer(200), *burst], key=lambda a: a.occurred_ms)

    def body(a: Attempt) -> bytes:
        at = datetime.fromtimestamp(a.occurred_ms / 1000, UTC).isoformat()
        event = {"event_id": a.event_id, "occurred_at": at, "service": "web"}
        event |= {"account": a.account, "peer_ip": a.source}
        event |= {"outcome": "success"} if a.success else {"outcome": "failure"}
        return orjson.dumps(event | ({} if a.success else {"failure_reason": a.failure_reason}))

    recs = [
        Record("auth.login-attempts", i % 8, i // 8, None, body(a)) for i, a in enumerate(attempts)
    ]
    now_ms = attempts[-1].occurred_ms + MIN
    normaliser = build_normaliser(Settings(), DEFAULT_POLICY)
    engine = Engine(DEFAULT_POLICY)
    engine.run(normaliser.normalise(decode_attempt(r.value)) for r in recs)
    twin = MemoryPipeline(Settings(), DEFAULT_POLICY)
    for start in range(0, len(recs), 100):
        twin.feed(recs[start : start + 100], now_ms)
    twin.finish()
    waves = _waves(engine)
    spray = next(d for d in waves if d.rule == "spray_tenant")
    assert datetime_to_ms(spray.issued_at) == T0 + settle_ms - SEC
    assert datetime_to_ms(spray.issued_at) - spray.window_ms == T0 + settle_ms - MIN  # its own
    twin_waves = [v for _, v in twin.out.decisions if v is not None and b'"scope":"tenant"' in v]
    # The stream settles the tier's windows as its marks pass them; the engine's finish
    # settles the rest at once (windows that settle after the last event).
    last_ms = attempts[-1].occurred_ms
    settled = [encode(d) for d in waves if datetime_to_ms(d.issued_at) <= last_ms]
    assert len(settled) == 126  # the quick check issues from 50 s after the first exit
    assert twin_waves[: len(settled)] == settled
