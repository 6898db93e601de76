"""Locks that always end (issue 46, item 1): an entry holding a decision is never silently
evicted, a success or a reset lifts the lock whether or not its entry survives, a hold is
published for a bounded time and renewed, and one burst counts at most ``in_flight_max``
failures in flight."""

from __future__ import annotations

import pytest

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.account import AccountShard
from pipeline.core.attempt import Attempt
from pipeline.core.decision_keys import keys_for
from pipeline.core.engine import Engine
from pipeline.core.keys import format_key
from pipeline.core.lockout import FOREVER_MS
from pipeline.core.outbox import Outbox
from pipeline.core.policy_rules import DAY_MS
from tests.unit.test_core_support import (
    ACCOUNT,
    HOUR,
    SEC,
    T0,
    att,
    decisions,
    policy,
    tombstones,
)

LOCK_KEY = ("lock", "default", ACCOUNT, None, None)
MFA_KEY = ("mfa", "default", ACCOUNT, None, None)
OTHER = "b" * 32


def held(engine: Engine, t: int, flow: str = "login") -> bool:
    """Whether the gateway refuses an untrusted failure of ACCOUNT at T0 + t."""
    return not engine.accounts.index.check(keys_for(att(t, flow=flow)), T0 + t).allowed


def lifetime(engine: Engine, threshold: int = 6) -> int:
    """Put ACCOUNT under the lifetime bound (``threshold`` 6): 5 failures lock it, the
    6th after the lock ends holds it. Returns the time of the 6th."""
    engine.step_batch([att(i * SEC, source=f"203.0.113.{i}") for i in range(5)])
    t = 4 * SEC + HOUR
    engine.step_batch([att(t)])
    assert held(engine, t + SEC)
    return t


def lifted_after(engine: Engine, mark: int) -> list[str]:
    """The keys tombstoned since ``len(engine.out.decisions)`` was ``mark``."""
    return [key for key, value in engine.out.decisions[mark:] if value is None]


def flood(engine: Engine, t: int, n: int) -> None:
    """``n`` failures on made-up names (each a new streak entry)."""
    engine.step_batch([att(t + i, account=f"{i:032x}") for i in range(n)])


def test_the_cap_passes_over_a_held_entry_and_a_reset_lifts_it() -> None:
    """entry_cap 10: 30 made-up names later the lifetime hold's entry is still there,
    and the owner's mailbox reset lifts it (before: evicted, the reset lifted nothing
    and the new password was refused for a century)."""
    engine = Engine(policy(lifetime={"threshold": 6}, entry_cap=10))
    t = lifetime(engine)
    flood(engine, t + SEC, 30)
    assert LOCK_KEY in engine.accounts.tenants["default"].streaks
    mark = len(engine.out.decisions)
    engine.step_batch([att(t + 2 * SEC, flow="reset", success=True)])
    assert format_key(LOCK_KEY) in lifted_after(engine, mark)
    assert not held(engine, t + 3 * SEC)


@pytest.mark.parametrize(
    "ending",
    [
        att(0, flow="reset", success=True),
        att(0, device="d" * 32, trusted=True, success=True),
    ],
    ids=["mailbox reset", "trusted device's success"],
)
def test_the_hold_is_lifted_when_its_entry_is_gone(ending: Attempt) -> None:
    """The index still holds ``lock|t|a|-|-`` after its entry is gone: a reset, or a
    trusted device's success (which ends a hold until a success), lifts it."""
    engine = Engine(policy(lifetime={"threshold": 6}))
    t = lifetime(engine)
    engine.accounts.tenants["default"].streaks.pop(LOCK_KEY)
    mark = len(engine.out.decisions)
    engine.step_batch([ending._replace(occurred_ms=T0 + t + SEC)])
    assert lifted_after(engine, mark) == [format_key(LOCK_KEY)]
    assert not held(engine, t + 2 * SEC)


def test_a_table_full_of_holds_tombstones_what_it_evicts() -> None:
    """entry_cap 10 and 12 accounts locked: the cap evicts held entries (it cannot pick
    another) and each evicted lock is tombstoned, never left published."""
    engine = Engine(policy(entry_cap=10))
    engine.step_batch([att(i * 10 + k, account=f"{i:032x}") for i in range(12) for k in range(5)])
    streaks = engine.accounts.tenants["default"].streaks
    assert len(streaks) == 10
    gone = [
        f"lock|default|{i:032x}|-|-"
        for i in range(12)
        if ("lock", "default", f"{i:032x}", None, None) not in streaks
    ]
    assert len(gone) == 2
    assert sorted(tombstones(engine.out)) == sorted(gone)


def test_the_hold_is_published_for_a_day_and_renewed() -> None:
    """The lifetime hold is published for lifetime.publish_ms (24 h, not a century); once
    12 h have passed in the shard's event time it is published again for 24 h, and it
    still refuses 3 days later."""
    engine = Engine(policy(lifetime={"threshold": 6}))
    t = lifetime(engine)
    (bound,) = [d for d in decisions(engine.out) if d.rule == "lifetime_bound"]
    assert datetime_to_ms(bound.expires_at) - datetime_to_ms(bound.issued_at) == DAY_MS
    for hour in range(1, 73):  # the shard's other traffic: a sign-in an hour
        engine.step_batch([att(t + hour * HOUR, account=OTHER, success=True)])
    bounds = [d for d in decisions(engine.out) if d.rule == "lifetime_bound"]
    assert [datetime_to_ms(d.issued_at) - T0 - t for d in bounds] == [
        0,
        12 * HOUR,
        24 * HOUR,
        36 * HOUR,
        48 * HOUR,
        60 * HOUR,
        72 * HOUR,
    ]
    assert all(datetime_to_ms(d.expires_at) - datetime_to_ms(d.issued_at) == DAY_MS for d in bounds)
    assert held(engine, t + 72 * HOUR + SEC)
    streak = engine.accounts.tenants["default"].streaks.get(LOCK_KEY)
    assert streak is not None and streak.hold_until_ms == FOREVER_MS


def test_a_shard_that_sees_only_refused_attempts_still_renews_the_hold() -> None:
    """The held account's own attempts, reported refused by the gateway, are all the shard
    sees for three days: the hold is renewed every 12 h all the same and never lapses."""
    engine = Engine(policy(lifetime={"threshold": 6}))
    t = lifetime(engine)
    for hour in range(1, 73):
        engine.step_batch([att(t + hour * HOUR, reason="refused")])
    bounds = [d for d in decisions(engine.out) if d.rule == "lifetime_bound"]
    assert [datetime_to_ms(d.issued_at) - T0 - t for d in bounds] == [
        h * HOUR for h in (0, 12, 24, 36, 48, 60, 72)
    ]
    assert held(engine, t + 72 * HOUR + SEC)


def test_a_hold_is_renewed_by_another_tenants_traffic_and_the_check_is_gated() -> None:
    """The held account's tenant sees nothing more; the shard's other tenant's sign-ins
    renew the hold every 12 h all the same, and between renewals no tenant is looked at
    (the shard's earliest due time gates the work per attempt)."""
    engine = Engine(policy(lifetime={"threshold": 6}))
    t = lifetime(engine)
    shard = engine.accounts
    assert shard.renew_due_ms == T0 + t + 12 * HOUR
    for hour in range(1, 37):
        engine.step_batch([att(t + hour * HOUR, account=OTHER, success=True, tenant="acme")])
    bounds = [d for d in decisions(engine.out) if d.rule == "lifetime_bound"]
    assert [datetime_to_ms(d.issued_at) - T0 - t for d in bounds] == [
        h * HOUR for h in (0, 12, 24, 36)
    ]
    assert shard.renew_due_ms == T0 + t + 48 * HOUR


def test_one_burst_counts_at_most_in_flight_max() -> None:
    """100 wrong passwords inside 0.1 s: 5 lock, 10 more are counted in flight (the
    curve's 15th: an hour), the other 85 are taken as refused; no lifetime bound (before:
    all 100 counted and a hold until 2126)."""
    engine = Engine()
    engine.step_batch([att(i, source=f"203.0.113.{i % 200}") for i in range(100)])
    streak = engine.accounts.tenants["default"].streaks.get(LOCK_KEY)
    assert streak is not None and (streak.count, streak.in_flight) == (15, 10)
    assert [(d.rule, d.count) for d in decisions(engine.out) if d.scope == "lock"] == [
        ("lockout", 5),
        ("lockout", 10),
        ("lockout", 15),
    ]


def test_the_mfa_bound_is_lifted_by_a_reset_when_its_entry_is_gone() -> None:
    """mfa_bound (threshold 3): published for a day, and a reset lifts it with no entry."""
    engine = Engine(policy(mfa_account={"threshold": 3}))
    engine.step_batch(
        [att(i * SEC, flow="mfa", reason="bad_second_factor", device=f"{i:032x}") for i in range(3)]
    )
    (bound,) = [d for d in decisions(engine.out) if d.rule == "mfa_bound"]
    assert datetime_to_ms(bound.expires_at) - datetime_to_ms(bound.issued_at) == DAY_MS
    engine.accounts.tenants["default"].streaks.pop(MFA_KEY)
    mark = len(engine.out.decisions)
    engine.step_batch([att(10 * SEC, flow="reset", success=True)])
    assert format_key(MFA_KEY) in lifted_after(engine, mark)


def test_a_century_hold_from_an_older_version_is_republished_bounded() -> None:
    """A restored streak record of 8 fields holding the lifetime bound for a century is
    published again for 24 h at the first event after the restore (and holds on)."""
    century = T0 + 36_500 * DAY_MS
    shard = AccountShard(policy(lifetime={"threshold": 6}))
    record = [100, century, "old-id", "lifetime_bound", 0, FOREVER_MS, 99, T0]
    shard.restore(["streaks", *LOCK_KEY], record)
    shard.finish_restore(Outbox())
    out = Outbox()
    shard.step(att(HOUR, account=OTHER, success=True), T0 + HOUR, out)
    (renewed,) = [d for _, d in out.decisions if d is not None and d.rule == "lifetime_bound"]
    assert datetime_to_ms(renewed.expires_at) == T0 + HOUR + DAY_MS
    streak = shard.tenants["default"].streaks.get(LOCK_KEY)
    assert streak is not None and streak.hold_until_ms == century
