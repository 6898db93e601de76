"""Seed 002's consecutive lock, seed 004's mfa curve, the enforced lifetime bound, the
owner's notice and the uia device bucket, through the core Engine."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.account import AccountShard
from pipeline.core.attempt import Attempt
from pipeline.core.decision_keys import keys_for
from pipeline.core.decisions import Verdict
from pipeline.core.engine import Engine
from pipeline.core.lockout import lock_ms, wait_ms
from pipeline.core.outbox import Outbox
from pipeline.core.policy import DEFAULT_POLICY
from pipeline.core.policy_rules import DAY_MS
from tests.unit.test_core_support import ACCOUNT, HOUR, MIN, SEC, T0, alerts, att, decisions, policy

LOCK_KEY = f"lock|default|{ACCOUNT}|-|-"
DEV = "d" * 32
OTHER = "b" * 32
LOCK = DEFAULT_POLICY.defaults.lockout


def gateway(engine: Engine, a: Attempt) -> Verdict:
    """Check first (like the edge); a refused failure is reported as ``refused``."""
    verdict = engine.accounts.index.check(keys_for(a), a.occurred_ms)
    if not verdict.allowed and not a.success:
        a = att(
            a.occurred_ms - T0,
            a.account,
            a.source,
            reason="refused",
            device=a.device,
            trusted=a.trusted,
            session=a.session,
            flow=a.flow,
        )
    engine.step_batch([a])
    return verdict


def seed_002(n: int) -> int:
    return lock_ms(n, LOCK.threshold, LOCK.base_ms, LOCK.step, LOCK.cap_ms)


def test_seed_002_curve_is_pinned() -> None:
    """The default lock is 0 at 4, 900 s at 5-9, 1,800 s at 10-14, 3,600 s from 15 on."""
    expected = {4: 0, 5: 900, 9: 900, 10: 1800, 14: 1800, 15: 3600, 20: 3600, 500: 3600}
    assert {n: seed_002(n) // SEC for n in expected} == expected
    assert [seed_002(n) for n in range(5)] == [0] * 5
    assert seed_002(10**9) == 3600 * SEC
    assert (LOCK.threshold, LOCK.base_ms, LOCK.step, LOCK.cap_ms) == (5, 900 * SEC, 5, 3600 * SEC)
    assert round(LOCK.threshold * HOUR / LOCK.cap_ms) == 5  # "5 attempts an hour, not per deploy"


def test_seed_004_curve_is_pinned() -> None:
    """The mfa wait after the n-th failure: 1, 2, 4, 8 ... s, an hour at most."""
    curve = DEFAULT_POLICY.defaults.mfa_curve
    waits = [wait_ms(n, curve.factor_ms, curve.cap_ms) // SEC for n in range(0, 15)]
    assert waits == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3600, 3600]
    assert wait_ms(10**6, curve.factor_ms, curve.cap_ms) == HOUR


@given(st.integers(1, 10**6), st.integers(1, 10**6))
def test_lock_curve_is_monotone_and_capped(n: int, k: int) -> None:
    """More consecutive failures never lock for less, and never past the cap."""
    a, b = sorted((n, k))
    assert seed_002(a) <= seed_002(b) <= LOCK.cap_ms


def test_engine_locks_on_the_curve() -> None:
    """Each counted failure from the 5th locks for the curve's length from its own time."""
    engine = Engine()
    t = 0
    durations = []
    for n in range(1, 17):
        gateway(engine, att(t, source=f"203.0.113.{n}"))
        lock = [d for d in decisions(engine.out) if d.key == LOCK_KEY]
        if n >= 5:
            d = lock[-1]
            assert (d.scope, d.rule, d.applies_to, d.count, d.threshold, d.window_ms) == (
                "lock",
                "lockout",
                "untrusted",
                n,
                5,
                0,
            )
            durations.append((datetime_to_ms(d.expires_at) - datetime_to_ms(d.issued_at)) // SEC)
            t = datetime_to_ms(d.expires_at) - T0
        else:
            t += SEC
    assert durations == [900] * 5 + [1800] * 5 + [3600] * 2


def test_attempts_during_the_lock_are_refused_and_not_counted() -> None:
    """While locked every source is refused; refused attempts leave the count alone."""
    engine = Engine()
    for i in range(5):
        gateway(engine, att(i * SEC, source=f"203.0.113.{i}"))
    refused = [gateway(engine, att(10 * SEC + i, source="198.51.100.99")) for i in range(50)]
    assert not any(v.allowed for v in refused)
    assert refused[0].retry_after_ms == 900 * SEC - 6 * SEC
    streak = engine.accounts.tenants["default"].streaks.get(
        ("lock", "default", ACCOUNT, None, None)
    )
    assert streak is not None and streak.count == 5
    # Unreported refusals (a lagging gateway) are not counted by the lock either.
    engine.step_batch([att(20 * SEC + i) for i in range(10)])
    assert streak.count == 5


def test_trusted_device_is_never_refused_and_does_not_reset_the_stranger() -> None:
    """The owner's trusted device passes the lock; its success leaves the stranger locked."""
    engine = Engine()
    for i in range(5):
        gateway(engine, att(i * SEC))
    owner = gateway(engine, att(10 * SEC, device=DEV, trusted=True, success=True))
    assert owner.allowed
    assert not gateway(engine, att(11 * SEC)).allowed
    # With trusted_success_clears the owner's success lifts the lock (seed 002's reading).
    engine = Engine(policy(lockout={"trusted_success_clears": True}))
    for i in range(5):
        gateway(engine, att(i * SEC))
    gateway(engine, att(10 * SEC, device=DEV, trusted=True, success=True))
    assert gateway(engine, att(11 * SEC)).allowed


def test_untrusted_success_clears_the_run() -> None:
    """Four failures, a success, four failures: never locked."""
    engine = Engine()
    for i in range(4):
        gateway(engine, att(i * SEC))
    gateway(engine, att(5 * SEC, success=True))
    for i in range(4):
        gateway(engine, att((10 + i) * SEC))
    assert [d for d in decisions(engine.out) if d.scope == "lock"] == []


def test_token_and_recovery_count_against_the_same_lock() -> None:
    """login, token and recovery failures add up; uia and mfa do not."""
    engine = Engine()
    for i, flow in enumerate(["login", "token", "recovery", "mfa", "uia", "token", "login"]):
        gateway(engine, att(i * SEC, flow=flow, device=DEV if flow == "mfa" else None))
    (lock,) = [d for d in decisions(engine.out) if d.scope == "lock"]
    assert (lock.count, datetime_to_ms(lock.issued_at)) == (5, T0 + 6 * SEC)


def test_unknown_accounts_lock_exactly_like_real_ones() -> None:
    """unknown_account failures lock at 5 with the same lengths: no existence oracle."""
    real, unknown = Engine(), Engine()
    for i in range(5):
        gateway(real, att(i * SEC))
        gateway(unknown, att(i * SEC, reason="unknown_account"))
    assert [(d.key, d.expires_at) for d in decisions(real.out)] == [
        (d.key, d.expires_at) for d in decisions(unknown.out)
    ]


def test_no_decay_99_failures_25_hours_quiet_then_one_reaches_the_bound() -> None:
    """99 counted failures, 25 h quiet, 1 failure: the lifetime bound refuses until a success."""
    engine = Engine()
    t = 0
    for _ in range(99):
        assert gateway(engine, att(t)).allowed
        t += HOUR  # the longest lock is an hour: every guess is counted
    t += 25 * HOUR
    assert gateway(engine, att(t)).allowed
    bound = decisions(engine.out)[-1]
    assert (bound.scope, bound.rule, bound.count, bound.threshold) == (
        "lock",
        "lifetime_bound",
        100,
        100,
    )
    # Held until a success, published for lifetime.publish_ms (a day) at a time.
    assert datetime_to_ms(bound.expires_at) == T0 + t + DAY_MS
    (alert,) = alerts(engine.out, "lifetime_bound")
    assert alert.count == 100
    # The shard's other traffic (a sign-in every 6 h) moves its event time: the hold is
    # published again every 12 h, and the 101st consecutive untrusted guess is refused,
    # from any source, days later.
    for k in range(1, 4 * 30):
        engine.step_batch([att(t + k * 6 * HOUR, OTHER, success=True)])
    assert not gateway(engine, att(t + 30 * 24 * HOUR, source="192.0.2.200")).allowed
    # The owner's trusted device is not, and its success ends the bound.
    assert gateway(engine, att(t + 31 * 24 * HOUR, device=DEV, trusted=True, success=True)).allowed
    assert gateway(engine, att(t + 31 * 24 * HOUR + SEC)).allowed


def test_the_bound_never_lets_a_101st_consecutive_guess_through() -> None:
    """A year of guessing from rotating sources as fast as allowed: 100 guesses, then none
    (the shard sees another account sign in every hour, so the hold, published for a day
    at a time, is renewed every 12 h)."""
    engine = Engine()
    allowed = 0
    for i in range(365 * 24 * 4):
        allowed += gateway(engine, att(i * 15 * MIN, source=f"203.0.113.{i % 13}")).allowed
        if i % 4 == 3:
            engine.step_batch([att(i * 15 * MIN + 1, OTHER, success=True)])
    assert allowed == 100


def test_mfa_curve_per_device_and_reset_by_success() -> None:
    """After the n-th failure the device waits 2**(n-1) s; a success starts over; no decay."""
    engine = Engine()
    t = 0
    waits = []
    for _ in range(6):
        assert gateway(engine, att(t, flow="mfa", device=DEV)).allowed
        d = decisions(engine.out)[-1]
        assert (d.key, d.rule, d.scope, d.applies_to) == (
            f"mfa|default|{ACCOUNT}|-|{DEV}",
            "mfa_curve",
            "mfa",
            "mfa",
        )
        waits.append((datetime_to_ms(d.expires_at) - T0 - t) // SEC)
        assert not gateway(engine, att(t + 1, flow="mfa", device=DEV)).allowed
        t = datetime_to_ms(d.expires_at) - T0
    assert waits == [1, 2, 4, 8, 16, 32]
    # No decay: a year later the seventh failure waits 64 s.
    t += 365 * 24 * HOUR
    gateway(engine, att(t, flow="mfa", device=DEV))
    assert datetime_to_ms(decisions(engine.out)[-1].expires_at) == T0 + t + 64 * SEC
    gateway(engine, att(t + 2 * HOUR, flow="mfa", device=DEV, success=True))
    gateway(engine, att(t + 3 * HOUR, flow="mfa", device=DEV))
    assert datetime_to_ms(decisions(engine.out)[-1].expires_at) == T0 + t + 3 * HOUR + SEC


def test_uia_counts_per_device_across_new_sessions() -> None:
    """A new session id per re-auth guess from one device: the 6th is refused (seed 000)."""
    engine = Engine()
    verdicts = [
        gateway(engine, att(i * SEC, flow="uia", device=DEV, trusted=True, session=f"{i:032x}"))
        for i in range(6)
    ]
    assert [v.allowed for v in verdicts] == [True] * 5 + [False]
    assert verdicts[-1].matched_key == ("uia", "default", ACCOUNT, None, DEV)
    # A success in a session resets the device's bucket too.
    gateway(
        engine, att(20 * SEC, flow="uia", device=DEV, trusted=True, session="f" * 32, success=True)
    )
    assert gateway(
        engine, att(21 * SEC, flow="uia", device=DEV, trusted=True, session="e" * 32)
    ).allowed


def test_notice_once_per_window_without_plain_identifiers() -> None:
    """Lock trips within 24 h give one notice; the next window gives another."""
    engine = Engine()
    t = 0
    for _ in range(20):  # 20 counted failures over about 9 h: locks trip 16 times
        gateway(engine, att(t, account=ACCOUNT))
        t += HOUR // 2
    (notice,) = engine.out.notices
    assert (notice.tenant, notice.account_digest, notice.reason) == (
        "default",
        ACCOUNT,
        "consecutive_lock",
    )
    assert datetime_to_ms(notice.window_end) - datetime_to_ms(notice.window_start) == 24 * HOUR
    assert datetime_to_ms(notice.expires_at) == datetime_to_ms(notice.window_start) + 900 * SEC
    assert set(notice.model_dump()) == {
        "notice_id",
        "tenant",
        "account_digest",
        "reason",
        "expires_at",
        "window_start",
        "window_end",
        "policy_version",
    }
    gateway(engine, att(t + 24 * HOUR, account=ACCOUNT))
    assert [n.reason for n in engine.out.notices] == ["consecutive_lock"] * 2


def test_observe_mode_lock_and_curve_publish_observe_and_never_refuse() -> None:
    """lockout, lifetime and mfa_curve in observe mode: 'observe' decisions, no refusal, no notice."""
    observe = {"mode": "observe"}
    engine = Engine(
        policy(
            lockout=observe,
            lifetime=observe,
            mfa_curve=observe,
            account_source=observe,
            account=observe,
            mfa=observe,
        )
    )
    verdicts = [gateway(engine, att(i * SEC)) for i in range(120)]
    verdicts += [gateway(engine, att(i * SEC, flow="mfa", device=DEV)) for i in range(10)]
    assert all(v.allowed for v in verdicts)
    rules = {(d.rule, d.action) for d in decisions(engine.out) if d.scope in ("lock", "mfa")}
    assert rules == {
        ("lockout", "observe"),
        ("lifetime_bound", "observe"),
        ("mfa_curve", "observe"),
    }
    assert engine.out.notices == []


def test_lock_survives_a_changelog_round_trip() -> None:
    """The streak and its lock are written to the changelog and restored by a new shard."""
    shard = AccountShard()
    out = Outbox()
    for i in range(7):
        shard.step(att(i * SEC, source=f"203.0.113.{i}"), T0 + i * SEC, out, seq=i)
    records = shard.take_dirty()
    assert any(key[0] == "streaks" for key, _ in records)
    fresh = AccountShard()
    for key, value in records:
        fresh.restore(key, value)
    fresh.finish_restore(Outbox())
    verdict = fresh.index.check(keys_for(att(10 * SEC, source="192.0.2.1")), T0 + 10 * SEC)
    assert (verdict.allowed, verdict.matched_key) == (
        False,
        ("lock", "default", ACCOUNT, None, None),
    )
    streak = fresh.tenants["default"].streaks.get(("lock", "default", ACCOUNT, None, None))
    # The 6th (1 s into the lock: in flight) counts; the 7th (2 s in) was refused unreported.
    assert streak is not None and (streak.count, streak.seq) == (6, 5)
    assert streak.held_since_ms == T0 + 4 * SEC


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 2 * HOUR), min_size=1, max_size=300))
def test_any_pacing_gets_at_most_the_seed_002_allowance(gaps: list[int]) -> None:
    """Whatever the pacing, guesses through in any span stay within the curve's allowance:
    at most 5 + (span / 900 s) + 1, and never more than the lifetime bound."""
    engine = Engine()
    t = 0
    allowed = 0
    for i, gap in enumerate(gaps):
        t += gap
        allowed += gateway(engine, att(t, source=f"203.0.113.{i % 13}")).allowed
    assert allowed <= min(100, 5 + t // (900 * SEC) + 1)


def test_a_late_failure_still_counts_in_its_run() -> None:
    """Failures older than the windows' reach (the shard's watermark ran ahead on another
    account) are late for rules 1-4 but still counted by the lock: 5 of them lock it."""
    engine = Engine()
    gateway(engine, att(10 * HOUR, account="b" * 32))  # another account moves the watermark
    for i in range(5):
        gateway(engine, att(i * MIN))  # hours behind: late for every window
    assert engine.accounts.metrics.late == 5
    (lock,) = [d for d in decisions(engine.out) if d.scope == "lock"]
    assert (lock.count, datetime_to_ms(lock.issued_at)) == (5, T0 + 4 * MIN)
