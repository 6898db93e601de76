"""Each rule of issue 4, success semantics, escalation and observe mode, through Engine."""

from __future__ import annotations

from typing import Any

from pipeline.contracts.models import Decision, datetime_to_ms
from pipeline.core.attempt import Attempt
from pipeline.core.decisions import Verdict
from pipeline.core.engine import Engine
from pipeline.core.keys import format_key
from pipeline.core.policy import Policy, policy_from_toml
from pipeline.core.rollup import TenantRollup
from tests.unit.test_core_support import (
    ACCOUNT,
    MIN,
    SEC,
    SOURCE,
    T0,
    alerts,
    att,
    decisions,
    policy,
    tombstones,
)

AS_KEY = f"account_source|default|{ACCOUNT}|{SOURCE}|-"
ACCT_KEY = f"account|default|{ACCOUNT}|-|-"
DEV = "d" * 32
DEV2 = "e" * 32
SESSION = "5" * 32


def window_rules(**defaults: Any) -> Policy:
    """The policy with seed 002's lock, seed 004's mfa curve and the verification of
    unfamiliar sign-ins out of the way, so each window rule is seen alone (those have
    their own tests: test_core_lockout.py, test_core_verify.py)."""
    return policy(
        version="default-1",
        lockout={"threshold": 1_000_000},
        mfa_curve={"enabled": False},
        **{"verify": {"mode": "off"}, **defaults},
    )


RULE8_15MIN = {
    "window_ms": 15 * 60_000,
    "baseline_windows": 8,
    "factor": 5.0,
    "min_accounts": 100,
    "min_sources": 10,
    "min_history_windows": 0,
}
"""Rule 8 as it was before issue 24 shortened its window: the tests below pin its
arithmetic on 15-minute windows."""


def step(engine: Engine, a: Attempt) -> Verdict:
    verdict = engine.step_batch([a])[0]
    assert verdict is not None
    return verdict


def only_decision(engine: Engine) -> Decision:
    ds = decisions(engine.out)
    assert len(ds) == 1, ds
    return ds[0]


def account_entry(engine: Engine, rule: str, key: tuple[object, ...]):  # type: ignore[no-untyped-def]
    return engine.accounts.tenants["default"].counters[rule].get(key)  # type: ignore[arg-type]


# -- rule 1: account_source -------------------------------------------------------------


def test_account_source_does_not_trip_at_four() -> None:
    """Four untrusted failures from one source in 15 minutes issue nothing."""
    engine = Engine(window_rules())
    engine.step_batch([att(i * MIN) for i in range(4)])
    assert engine.out.decisions == []


def test_account_source_trips_at_exactly_five() -> None:
    """The fifth failure issues one exact account_source block for 15 minutes."""
    engine = Engine(window_rules())
    verdicts = engine.step_batch([att(i * MIN) for i in range(5)])
    assert all(v is not None and v.allowed for v in verdicts)  # checked before counting
    d = only_decision(engine)
    assert d.key == AS_KEY
    assert (d.scope, d.rule, d.applies_to, d.action) == (
        "account_source",
        "account_source",
        "untrusted",
        "block",
    )
    assert (d.tenant, d.account_digest, d.source, d.device_id) == ("default", ACCOUNT, SOURCE, None)
    assert (d.count, d.threshold, d.window_ms) == (5, 5, 15 * MIN)
    assert datetime_to_ms(d.issued_at) == T0 + 4 * MIN
    assert datetime_to_ms(d.expires_at) == T0 + 19 * MIN
    assert d.policy_version == "default-1"


def test_account_source_failures_outside_the_window_do_not_add_up() -> None:
    """Five failures spread over more than 16 minutes never trip."""
    engine = Engine(window_rules())
    engine.step_batch([att(i * 4 * MIN + i) for i in range(5)])  # 0..16 min + a little
    assert engine.out.decisions == []


def test_account_source_refuses_only_that_pair() -> None:
    """The block refuses that (account, source) only, never the owner's trusted device."""
    engine = Engine(window_rules())
    engine.step_batch([att(i * SEC) for i in range(5)])
    refused = step(engine, att(10 * SEC))
    assert (refused.allowed, refused.retry_after_ms) == (False, 15 * MIN - 6 * SEC)
    assert refused.matched_key == ("account_source", "default", ACCOUNT, SOURCE, None)
    assert step(engine, att(11 * SEC, source="203.0.113.1")).allowed
    assert step(engine, att(12 * SEC, account="b" * 32)).allowed
    assert step(engine, att(13 * SEC, device=DEV, trusted=True)).allowed


def test_block_expires_at_expires_at() -> None:
    """The block refuses until expires_at and no longer; its tombstone follows within 1 s."""
    engine = Engine(window_rules())
    engine.step_batch([att(i) for i in range(5)])  # trips at +4 ms, expires at 15 min + 4 ms
    last = step(engine, att(15 * MIN + 3))
    assert (last.allowed, last.retry_after_ms) == (False, 1)
    assert step(engine, att(15 * MIN + 4, account="b" * 32)).allowed
    assert tombstones(engine.out) == []  # expiry is swept once per watermark second
    engine.step_batch([att(15 * MIN + SEC, account="b" * 32)])
    assert tombstones(engine.out) == [AS_KEY]


def test_refused_failures_are_not_counted() -> None:
    """failure_reason "refused" (the service applied our block) counts nowhere."""
    engine = Engine(window_rules())
    engine.step_batch([att(i * SEC, reason="refused") for i in range(60)])
    assert engine.out.decisions == []
    assert engine.accounts.metrics.counted == 0


# -- rule 2: the ceiling ----------------------------------------------------------------


def _from_many_sources(n: int, t0: int = 0) -> list[Attempt]:
    return [
        att(t0 + i * SEC, source=f"203.0.113.{i % 250}" if i < 250 else f"198.18.0.{i % 250}")
        for i in range(n)
    ]


def test_ceiling_does_not_trip_at_49() -> None:
    """49 failures from 49 sources issue nothing."""
    engine = Engine(window_rules())
    engine.step_batch(_from_many_sources(49))
    assert engine.out.decisions == []
    assert engine.out.alerts == []


def test_ceiling_trips_at_50_from_many_sources() -> None:
    """The 50th failure from 50 sources issues an account block and account_under_attack."""
    engine = Engine(window_rules())
    engine.step_batch(_from_many_sources(50))
    d = only_decision(engine)
    assert d.key == ACCT_KEY
    assert (d.scope, d.applies_to, d.count, d.threshold, d.source) == (
        "account",
        "untrusted",
        50,
        50,
        None,
    )
    assert datetime_to_ms(d.expires_at) - datetime_to_ms(d.issued_at) == 15 * MIN
    (alert,) = alerts(engine.out, "account_under_attack")
    assert (alert.account_digest, alert.source, alert.count) == (ACCOUNT, None, 50)
    assert datetime_to_ms(alert.window_end) == T0 + 49 * SEC
    assert datetime_to_ms(alert.window_start) == T0 + 49 * SEC - 15 * MIN


def test_ceiling_refuses_untrusted_everywhere_but_never_a_trusted_device() -> None:
    """After the ceiling trips, a new source is refused; the owner's trusted device is not."""
    engine = Engine(window_rules())
    engine.step_batch(_from_many_sources(50))
    fresh = step(engine, att(MIN, source="192.0.2.200"))
    assert not fresh.allowed
    assert fresh.matched_key == ("account", "default", ACCOUNT, None, None)
    owner = step(engine, att(MIN + 1, source="192.0.2.200", device=DEV, trusted=True, success=True))
    assert owner.allowed and owner.applied == "allowed"
    untrusted_cookie = step(engine, att(MIN + 2, source="192.0.2.200", device=DEV, trusted=False))
    assert not untrusted_cookie.allowed


def test_success_never_clears_the_ceiling() -> None:
    """49 failures, an owner success, then one more failure still trips the ceiling."""
    engine = Engine(window_rules())
    engine.step_batch(_from_many_sources(49))
    engine.step_batch([att(50 * SEC, source="192.0.2.1", success=True)])
    engine.step_batch([att(51 * SEC, source="192.0.2.2")])
    assert only_decision(engine).key == ACCT_KEY


# -- rule 3: device ---------------------------------------------------------------------


def test_device_rule_refuses_that_device_only() -> None:
    """Ten trusted-device failures block that device; other devices and untrusted pass."""
    engine = Engine(window_rules())
    engine.step_batch([att(i * SEC, device=DEV, trusted=True) for i in range(9)])
    assert engine.out.decisions == []
    engine.step_batch([att(9 * SEC, device=DEV, trusted=True)])
    d = only_decision(engine)
    assert d.key == f"device|default|{ACCOUNT}|-|{DEV}"
    assert (d.scope, d.applies_to, d.count, d.threshold, d.device_id) == (
        "device",
        "device",
        10,
        10,
        DEV,
    )
    assert not step(engine, att(10 * SEC, device=DEV, trusted=True)).allowed
    assert step(engine, att(11 * SEC, device=DEV2, trusted=True)).allowed
    assert step(engine, att(12 * SEC)).allowed


def test_trusted_failures_never_feed_rules_1_2_or_spray() -> None:
    """Trusted-device failures leave account_source, the ceiling and the source stage alone."""
    engine = Engine(window_rules())
    # 300 accounts x 9 trusted failures each, all from one source.
    engine.step_batch(
        att(i, account=f"{i:032x}", device=DEV, trusted=True) for i in range(300) for _ in range(9)
    )
    assert engine.out.decisions == []
    assert engine.out.alerts == []
    tables = engine.accounts.tenants["default"]
    assert len(tables.counters["account_source"]) == 0
    assert all(e.ring.total == 0 for _, e in tables.counters["account"].items())
    assert engine.sources.entries() == 0


# -- rule 4: uia, and mfa ---------------------------------------------------------------


def test_uia_trips_at_five_per_session() -> None:
    """Five uia failures in one session block re-auth there only."""
    engine = Engine(window_rules())
    engine.step_batch([att(i * SEC, flow="uia", session=SESSION) for i in range(5)])
    d = only_decision(engine)
    assert d.key == f"uia|default|{ACCOUNT}|-|{SESSION}"
    assert (d.scope, d.applies_to, d.count, d.threshold) == ("uia", "uia", 5, 5)
    assert not step(engine, att(6 * SEC, flow="uia", session=SESSION)).allowed
    assert step(engine, att(7 * SEC, flow="uia", session="6" * 32)).allowed
    assert step(engine, att(8 * SEC)).allowed  # login is not refused by a uia block


def test_login_failures_never_touch_uia() -> None:
    """Login failures (enough to trip the ceiling) never refuse a uia re-check."""
    engine = Engine(window_rules())
    engine.step_batch(_from_many_sources(60))
    assert step(engine, att(MIN, flow="uia", session=SESSION, success=True)).allowed
    assert len(engine.accounts.tenants["default"].counters["uia"]) == 0


def test_uia_never_feeds_the_ceiling() -> None:
    """60 uia failures over 60 sessions issue 0 account decisions."""
    engine = Engine(window_rules())
    engine.step_batch(att(i * SEC, flow="uia", session=f"{i:032x}") for i in range(60))
    assert engine.out.decisions == []
    entry = account_entry(engine, "account", ("account", "default", ACCOUNT, None, None))
    assert entry is not None and entry.ring.total == 0 and entry.streak == 60


def test_uia_without_session_falls_back_to_device_then_source() -> None:
    """uia keys use the session, else the device, else the source."""
    engine = Engine(window_rules())
    engine.step_batch([att(i, flow="uia", device=DEV) for i in range(5)])
    engine.step_batch([att(10 + i, flow="uia") for i in range(5)])
    keys = [d.key for d in decisions(engine.out)]
    assert keys == [f"uia|default|{ACCOUNT}|-|{DEV}", f"uia|default|{ACCOUNT}|{SOURCE}|-"]


def test_mfa_bucket_per_device() -> None:
    """Five mfa failures from one device block mfa there; a success resets it."""
    engine = Engine(window_rules())
    mfa = {"flow": "mfa", "device": DEV, "reason": "bad_second_factor"}
    engine.step_batch([att(i, **mfa) for i in range(4)])  # type: ignore[arg-type]
    engine.step_batch([att(5, flow="mfa", device=DEV, success=True)])
    engine.step_batch([att(10 + i, **mfa) for i in range(4)])  # type: ignore[arg-type]
    assert engine.out.decisions == []
    engine.step_batch([att(20, **mfa)])  # type: ignore[arg-type]
    d = only_decision(engine)
    assert (d.key, d.scope, d.applies_to) == (f"mfa|default|{ACCOUNT}|-|{DEV}", "mfa", "mfa")
    assert not step(engine, att(21, **mfa)).allowed  # type: ignore[arg-type]
    assert step(engine, att(22)).allowed  # a password login is not an mfa attempt


# -- rule 5: spray and credential stuffing ----------------------------------------------


def _spray(n: int, t0: int = 0, source: str = SOURCE) -> list[Attempt]:
    return [att(t0 + i * 100, account=f"{i:032x}", source=source) for i in range(n)]


def test_spray_source_alert_at_200_distinct_accounts() -> None:
    """199 distinct accounts raise nothing; the 200th raises one spray_source alert."""
    engine = Engine(window_rules())
    engine.step_batch(_spray(199))
    assert alerts(engine.out, "spray_source") == []
    engine.step_batch([att(19_900, account="f" * 32)])
    (alert,) = alerts(engine.out, "spray_source")
    assert (alert.source, alert.count, alert.distinct_accounts, alert.account_digest) == (
        SOURCE,
        200,
        200,
        None,
    )
    assert datetime_to_ms(alert.window_end) == T0 + 19_900


def test_spray_source_once_per_window() -> None:
    """1,000 accounts in one window raise one alert; the next window raises another."""
    engine = Engine(window_rules())
    engine.step_batch(_spray(1000))  # 100 s
    assert len(alerts(engine.out, "spray_source")) == 1
    engine.step_batch(att(16 * MIN + i * 100, account=f"{10_000 + i:032x}") for i in range(200))
    assert len(alerts(engine.out, "spray_source")) == 2


def test_spray_repeat_failures_of_one_account_count_once() -> None:
    """Failures against the same 199 accounts again and again never reach 200 distinct."""
    engine = Engine(window_rules(account_source={"threshold": 1000}, account={"threshold": 1000}))
    engine.step_batch(att(i * 10, account=f"{i % 199:032x}") for i in range(2000))
    assert alerts(engine.out, "spray_source") == []


def test_spray_allowlisted_cidr_is_exempt() -> None:
    """A source inside the allowlist never raises spray_source."""
    engine = Engine(window_rules(allowlist=["198.51.100.0/24"]))
    engine.step_batch(_spray(500))
    assert alerts(engine.out, "spray_source") == []
    assert engine.sources.entries() == 0


def test_spray_observe_mode_never_blocks() -> None:
    """In observe mode (the default) the spraying source is never refused."""
    engine = Engine(window_rules())
    verdicts = engine.step_batch(_spray(1000))
    assert all(v is not None and v.allowed for v in verdicts)
    (d,) = [d for d in decisions(engine.out) if d.scope == "source"]
    assert (d.action, d.applies_to, d.key) == ("observe", "all", f"source|default|-|{SOURCE}|-")
    assert verdicts[-1] is not None and verdicts[-1].applied == "observe"


def test_spray_enforce_mode_issues_a_source_captcha() -> None:
    """In enforce mode the 200th account issues a CAPTCHA challenge on the source (issue
    44): its unfamiliar untrusted password attempts meet a CAPTCHA, nobody is refused, a
    trusted device and an account familiar there are not challenged, nor a second factor."""
    engine = Engine(window_rules(source={"mode": "enforce"}))
    engine.step(att(0, account="6" * 32, success=True), T0)  # familiar at the source
    verdicts = engine.step_batch(_spray(201))
    (d,) = [d for d in decisions(engine.out) if d.scope == "source"]
    assert (d.action, d.challenge, d.count, d.threshold, d.device_id, d.account_digest) == (
        "challenge",
        "captcha",
        200,
        200,
        None,
        None,
    )
    assert datetime_to_ms(d.expires_at) - datetime_to_ms(d.issued_at) == 15 * MIN
    assert verdicts[199] is not None and verdicts[199].challenge is None
    assert verdicts[200] is not None and (verdicts[200].allowed, verdicts[200].challenge) == (
        True,
        "captcha",
    )
    trusted = step(engine, att(30_000, account="9" * 32, device=DEV, trusted=True, success=True))
    assert (trusted.allowed, trusted.challenge) == (True, None)
    familiar = step(engine, att(30_000, account="6" * 32, success=True))
    assert (familiar.allowed, familiar.challenge) == (True, None)
    stranger = step(engine, att(30_000, account="8" * 32, success=True))
    assert (stranger.allowed, stranger.challenge) == (True, "captcha")
    code = step(engine, att(30_000, account="8" * 32, flow="mfa", success=True))
    assert (code.allowed, code.challenge) == (True, None)
    assert step(engine, att(30_001, source="192.0.2.1")).challenge is None


def test_credential_stuffing_at_50_attempts_80_percent_unknown() -> None:
    """40 unknown_account + 10 bad_password failures raise credential_stuffing at the 50th."""
    engine = Engine(window_rules())
    mix = ["unknown_account"] * 40 + ["bad_password"] * 9
    engine.step_batch(att(i * 10, account=f"{i:032x}", reason=r) for i, r in enumerate(mix))
    assert alerts(engine.out, "credential_stuffing") == []
    engine.step_batch([att(600, account="f" * 32)])
    (alert,) = alerts(engine.out, "credential_stuffing")
    assert (alert.source, alert.count, alert.distinct_accounts) == (SOURCE, 50, 50)


def test_credential_stuffing_needs_the_ratio() -> None:
    """39 of 50 unknown (78 %) raise nothing; neither do 49 all-unknown failures."""
    engine = Engine(window_rules())
    mix = ["unknown_account"] * 39 + ["bad_password"] * 11
    engine.step_batch(att(i * 10, account=f"{i:032x}", reason=r) for i, r in enumerate(mix))
    engine.step_batch(
        att(i * 10, account=f"{i:032x}", source="192.0.2.9", reason="unknown_account")
        for i in range(49)
    )
    assert alerts(engine.out, "credential_stuffing") == []


def test_credential_stuffing_once_per_window() -> None:
    """500 unknown-account failures raise one credential_stuffing alert."""
    engine = Engine(window_rules())
    engine.step_batch(
        att(i * 10, account=f"{i:032x}", reason="unknown_account") for i in range(500)
    )
    assert len(alerts(engine.out, "credential_stuffing")) == 1


# -- rule 7: the lifetime bound ---------------------------------------------------------


def test_lifetime_bound_at_100_once_and_reset_by_success() -> None:
    """100 consecutive failures raise lifetime_bound once; a success re-arms it."""
    engine = Engine(window_rules())
    sources = [f"203.0.113.{i % 200}" for i in range(250)]
    engine.step_batch(att(i * MIN, source=sources[i]) for i in range(99))
    assert alerts(engine.out, "lifetime_bound") == []
    engine.step_batch(att((99 + i) * MIN, source=sources[99 + i]) for i in range(51))
    (alert,) = alerts(engine.out, "lifetime_bound")
    assert (alert.count, alert.account_digest) == (100, ACCOUNT)
    assert datetime_to_ms(alert.window_end) == T0 + 99 * MIN
    engine.step_batch([att(200 * MIN, success=True, device=DEV, trusted=True)])
    engine.step_batch(att((201 + i) * MIN, source=sources[i]) for i in range(100))
    assert len(alerts(engine.out, "lifetime_bound")) == 2


# -- rule 8: tenant-wide spray ----------------------------------------------------------


def test_spray_tenant_far_above_baseline() -> None:
    """With a baseline of 30 accounts/window, 150 accounts from 20 sources fire, 149 not."""
    rollup = TenantRollup(window_rules(tenant_spray=RULE8_15MIN))
    for window in range(8):
        rollup.update("t", window, "a", 0, 30)
        rollup.update("t", window, "s", 0, 20)
    rollup.update("t", 8, "s", 0, 20)
    rollup.update("t", 8, "a", 0, 149)
    assert rollup.advance(8 * 15 * MIN + 1000) == []
    rollup.update("t", 8, "a", 0, 150)
    assert rollup.advance(8 * 15 * MIN + 1999) == []  # evaluated at second boundaries only
    (alert,) = rollup.advance(8 * 15 * MIN + 2000)
    assert (alert.type, alert.tenant, alert.count, alert.distinct_accounts) == (
        "spray_tenant",
        "t",
        150,
        150,
    )
    assert datetime_to_ms(alert.window_start) == 8 * 15 * MIN
    assert datetime_to_ms(alert.window_end) == 9 * 15 * MIN
    rollup.update("t", 8, "a", 1, 500)
    assert rollup.advance(8 * 15 * MIN + 3000) == []  # once per (tenant, window)


def test_spray_tenant_needs_min_sources_and_sums_parts() -> None:
    """Shares from several parts add up; fewer than 10 sources never fire."""
    rollup = TenantRollup(window_rules(tenant_spray=RULE8_15MIN))
    rollup.update("t", 0, "a", 0, 80)
    rollup.update("t", 0, "a", 1, 80)  # 160 accounts, 0 sources
    rollup.update("t", 0, "s", 0, 9)
    assert rollup.advance(1000) == []
    rollup.update("t", 0, "s", 0, 9)  # a replayed share changes nothing
    assert rollup.advance(2000) == []
    rollup.update("t", 0, "s", 1, 1)
    (alert,) = rollup.advance(3000)
    assert alert.count == 160


def test_spray_tenant_does_not_depend_on_the_order_of_one_seconds_shares() -> None:
    """The shares of one second, recorded in any order, give the same alert and count."""
    shares = [("a", 0, 60), ("s", 1, 6), ("a", 1, 70), ("s", 0, 5), ("a", 0, 90)]
    results = set()
    for order in (shares, shares[::-1], shares[2:] + shares[:2]):
        rollup = TenantRollup(window_rules(tenant_spray=RULE8_15MIN))
        for kind, part, share in order:
            rollup.update("t", 0, kind, part, share)
        (alert,) = rollup.advance(1000)
        results.add(alert.count)
    assert results == {160}


def test_spray_tenant_through_the_engine() -> None:
    """150 accounts failing from 15 sources in a fresh tenant raise spray_tenant at 100."""
    engine = Engine(window_rules(tenant_spray=RULE8_15MIN))
    engine.step_batch(
        att(i * 100, account=f"{i:032x}", source=f"203.0.113.{i % 15}") for i in range(150)
    )
    (alert,) = alerts(engine.out, "spray_tenant")
    assert (alert.count, alert.tenant) == (100, "default")


# -- success semantics ------------------------------------------------------------------


def test_success_clears_only_its_own_source_counter() -> None:
    """A success from S1 clears S1's counter; S2's and the ceiling's stay."""
    engine = Engine(window_rules())
    s2 = "203.0.113.2"
    engine.step_batch([att(i) for i in range(4)] + [att(10 + i, source=s2) for i in range(4)])
    engine.step_batch([att(20, success=True)])
    acct = account_entry(engine, "account", ("account", "default", ACCOUNT, None, None))
    assert acct is not None and acct.ring.total == 8
    engine.step_batch([att(30 + i) for i in range(4)])
    assert engine.out.decisions == []
    engine.step_batch([att(40, source=s2)])
    assert only_decision(engine).key == f"account_source|default|{ACCOUNT}|{s2}|-"


def test_success_lifts_its_active_decision_with_a_tombstone() -> None:
    """A success on a blocked (account, source) lifts the block: (key, None) is published."""
    engine = Engine(window_rules(account_source={"mode": "observe"}))
    engine.step_batch([att(i) for i in range(5)])
    assert only_decision(engine).action == "observe"
    engine.step_batch([att(10, success=True)])
    assert engine.out.decisions[-1] == (AS_KEY, None)
    assert engine.accounts.index.get(("account_source", "default", ACCOUNT, SOURCE, None)) is None
    assert engine.accounts.metrics.lifts == 1


def test_success_from_another_source_lifts_nothing() -> None:
    """A success from another source neither lifts nor clears the blocked pair."""
    engine = Engine(window_rules())
    engine.step_batch([att(i) for i in range(5)])
    engine.step_batch([att(10, source="192.0.2.1", success=True)])
    assert tombstones(engine.out) == []
    assert not step(engine, att(20)).allowed


def test_success_resets_device_uia_and_mfa_counters() -> None:
    """Own successes reset device, uia and mfa counters (9 + success + 9 never trips)."""
    engine = Engine(window_rules())
    for kw in (
        {"device": DEV, "trusted": True},
        {"flow": "uia", "session": SESSION},
        {"flow": "mfa", "device": DEV2},
    ):
        limit = 9 if "trusted" in kw else 4
        engine.step_batch([att(i, **kw) for i in range(limit)])  # type: ignore[arg-type]
        engine.step_batch([att(100, success=True, **kw)])  # type: ignore[arg-type]
        engine.step_batch([att(200 + i, **kw) for i in range(limit)])  # type: ignore[arg-type]
    assert engine.out.decisions == []


def test_trusted_success_does_not_clear_the_ceiling() -> None:
    """The owner's trusted success leaves the ceiling's count alone."""
    engine = Engine(window_rules())
    engine.step_batch(_from_many_sources(30))
    engine.step_batch([att(MIN, device=DEV, trusted=True, success=True)])
    acct = account_entry(engine, "account", ("account", "default", ACCOUNT, None, None))
    assert acct is not None and acct.ring.total == 30 and acct.streak == 0


# -- rule 6: escalation -----------------------------------------------------------------


def _trip_durations(engine: Engine, trips: int, t: int) -> tuple[list[int], int]:
    """Fail once a second until each trip; jump to the block's expiry; return durations."""
    durations: list[int] = []
    for _ in range(trips):
        engine.out.clear()
        while not decisions(engine.out):
            engine.step_batch([att(t)])
            t += SEC
        d = decisions(engine.out)[-1]
        assert d.key == AS_KEY
        issued, expires = datetime_to_ms(d.issued_at), datetime_to_ms(d.expires_at)
        durations.append((expires - issued) // MIN)
        t = expires - T0
    return durations, t


def test_escalation_15_30_60_60() -> None:
    """Consecutive trips of one key block for 15, 30, 60 and 60 minutes."""
    durations, _ = _trip_durations(Engine(window_rules()), 4, 0)
    assert durations == [15, 30, 60, 60]


def test_success_resets_escalation() -> None:
    """A success on the same key resets escalation: the next trip blocks 15 minutes again."""
    engine = Engine(window_rules())
    durations, t = _trip_durations(engine, 3, 0)
    assert durations == [15, 30, 60]
    engine.step_batch([att(t, success=True)])
    again, _ = _trip_durations(engine, 2, t + SEC)
    assert again == [15, 30]


def test_escalation_forgotten_after_streak_memory() -> None:
    """Past streak_memory_ms without failures, the level starts over at 15 minutes."""
    engine = Engine(window_rules(streak_memory_ms=2 * 3_600_000))
    durations, t = _trip_durations(engine, 2, 0)
    assert durations == [15, 30]
    later, _ = _trip_durations(engine, 1, t + 3 * 3_600_000)
    assert later == [15]


# -- observe mode -----------------------------------------------------------------------


def test_observe_mode_every_rule_publishes_observe_and_never_refuses() -> None:
    """With every rule in observe mode, decisions say 'observe' and the check allows."""
    observe = {"mode": "observe"}
    engine = Engine(
        window_rules(
            account_source=observe,
            account=observe,
            device=observe,
            uia=observe,
            mfa=observe,
            source=observe,
        )
    )
    traffic = (
        _from_many_sources(60)
        + [att(MIN + 300 + i) for i in range(5)]
        + [att(MIN + i, device=DEV, trusted=True) for i in range(12)]
        + [att(MIN + 100 + i, flow="uia", session=SESSION) for i in range(6)]
        + [att(MIN + 200 + i, flow="mfa", device=DEV2) for i in range(6)]
        + _spray(210, t0=2 * MIN, source="192.0.2.50")
    )
    verdicts = engine.step_batch(traffic)
    assert all(v is not None and v.allowed for v in verdicts)
    scopes = {d.scope for d in decisions(engine.out)}
    assert scopes == {"account_source", "account", "device", "uia", "mfa", "source"}
    assert {d.action for d in decisions(engine.out)} == {"observe"}
    for probe in (
        att(3 * MIN, source="203.0.113.0"),
        att(3 * MIN, device=DEV, trusted=True),
        att(3 * MIN, flow="uia", session=SESSION),
        att(3 * MIN, flow="mfa", device=DEV2),
        att(3 * MIN, account="9" * 32, source="192.0.2.50"),
    ):
        verdict = step(engine, probe)
        assert (verdict.allowed, verdict.retry_after_ms, verdict.applied) == (True, 0, "observe")


# -- duplicates and lateness ------------------------------------------------------------


def test_duplicate_event_ids_count_once() -> None:
    """A redelivered event_id is not counted again and gets no verdict."""
    engine = Engine(window_rules())
    verdicts = engine.step_batch([att(i, event_id=f"dup-{i % 3}") for i in range(12)])
    assert [v is None for v in verdicts] == [False] * 3 + [True] * 9
    assert engine.accounts.metrics.duplicates == 9
    assert engine.accounts.metrics.counted == 3


def test_late_events_beyond_the_span_are_not_counted() -> None:
    """Events older than the watermark minus the longest span are not counted."""
    engine = Engine(window_rules())
    engine.step_batch([att(60 * MIN, account="b" * 32)])
    engine.step_batch([att(i) for i in range(10)])
    assert engine.out.decisions == []
    assert engine.accounts.metrics.late == 10


def test_format_key_of_issued_decisions_matches_the_wire_key() -> None:
    """Every decision's key field is format_key of its index key."""
    engine = Engine(window_rules())
    engine.step_batch(_from_many_sources(50))
    keys = {format_key(k) for k, _ in engine.accounts.index.items()}
    assert keys == {d.key for d in decisions(engine.out)}


def test_spray_tenant_waits_for_history_when_asked() -> None:
    """With min_history_windows = 1 a tenant's first window never fires (its 100 accounts
    are far above min_accounts); its second, far above the first, can."""
    policy = policy_from_toml("[defaults.tenant_spray]\nmin_history_windows = 1\n")
    rollup = TenantRollup(policy)
    rollup.update("t", 5, "s", 0, 20)
    rollup.update("t", 5, "a", 0, 100)
    assert rollup.advance(5 * 15 * MIN + 1000) == []  # cold start: no earlier window seen
    rollup.update("t", 6, "s", 0, 20)
    rollup.update("t", 6, "a", 0, 500)
    (alert,) = rollup.advance(6 * 15 * MIN + 1000)
    assert (alert.count, alert.tenant) == (500, "t")


def test_spray_tenant_paced_sum_clears_twice_the_median_not_twice_a_low_quantile() -> None:
    """A busy tenant's windows hold 4-8 accounts each (median 6, 0.1 quantile 4): six of
    them at 8 (48: the floor is 40 and 2 x 6 x 4 is 48) are ordinary and do not fire;
    six at 12 (72 = 2 x 6 x 6) do, once."""
    rollup = TenantRollup(window_rules())
    for window in range(60):
        rollup.update("t", window, "a", 0, 4 + 2 * (window % 3))  # 4, 6, 8, ...
        rollup.update("t", window, "s", 0, 20)
    assert rollup.advance(61 * 10_000) == []
    for window in range(60, 66):
        rollup.update("t", window, "a", 0, 8)
        rollup.update("t", window, "s", 0, 20)
        assert rollup.advance((window + 1) * 10_000 + 1000) == []
    for window in range(66, 72):
        rollup.update("t", window, "a", 0, 12)
        rollup.update("t", window, "s", 0, 20)
        alerts = rollup.advance((window + 1) * 10_000 + 1000)
        assert [a.count for a in alerts] == ([72] if window == 71 else []), window
