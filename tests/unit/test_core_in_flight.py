"""Guesses in flight are guesses (issue 25): a failure the gateway let through while the
lock's decision was on its way is counted by seed 002's run and the lifetime bound; one
it reported ``refused`` never is."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.attempt import Attempt
from pipeline.core.engine import Engine
from pipeline.core.lockout import lock_ms
from pipeline.core.policy import DEFAULT_POLICY, Policy
from tests.unit.test_core_support import ACCOUNT, SEC, T0, att, decisions, policy

LOCK = DEFAULT_POLICY.defaults.lockout
LOCK_KEY = ("lock", "default", ACCOUNT, None, None)


def locks(engine: Engine) -> list[tuple[str, int, int, int]]:
    """(rule, count, issued ms after T0, length s) of every lock decision so far."""
    return [
        (
            d.rule,
            d.count,
            datetime_to_ms(d.issued_at) - T0,
            (datetime_to_ms(d.expires_at) - datetime_to_ms(d.issued_at)) // SEC,
        )
        for d in decisions(engine.out)
        if d.scope == "lock"
    ]


def count(engine: Engine) -> int:
    streak = engine.accounts.tenants["default"].streaks.get(LOCK_KEY)
    assert streak is not None
    return streak.count


def test_the_default_in_flight_allowance_is_two_seconds() -> None:
    """lockout.in_flight_ms defaults to 2,000 ms (docs/policy.md, Latency)."""
    assert LOCK.in_flight_ms == 2000


def test_guesses_let_through_in_flight_count_and_lengthen_the_lock() -> None:
    """5 failures lock for 900 s; 5 more within the lock's first 2 s (the gateway did not
    know yet) make 10, and the 10th re-issues the lock for 1,800 s from its own time."""
    engine = Engine()
    engine.step_batch([att(i * SEC, source=f"203.0.113.{i}") for i in range(5)])
    engine.step_batch([att(4 * SEC + 100 * (i + 1)) for i in range(5)])
    assert count(engine) == 10
    assert locks(engine) == [("lockout", 5, 4 * SEC, 900), ("lockout", 10, 4500, 1800)]


def test_refused_reports_are_never_counted_even_in_flight() -> None:
    """A failure reported refused inside the in-flight allowance leaves the run at 5."""
    engine = Engine()
    engine.step_batch([att(i * SEC) for i in range(5)])
    engine.step_batch([att(4 * SEC + 10 * (i + 1), reason="refused") for i in range(20)])
    assert (count(engine), len(locks(engine))) == (5, 1)


def test_unreported_failures_after_the_allowance_are_taken_as_refused() -> None:
    """Inside the lock but 2 s or more after it came into force: not counted (a gateway
    that refuses without reporting, like the simulator's unenforced stream)."""
    engine = Engine()
    engine.step_batch([att(i * SEC) for i in range(5)])
    engine.step_batch([att(6 * SEC), att(7 * SEC), att(100 * SEC)])
    assert (count(engine), locks(engine)) == (5, [("lockout", 5, 4 * SEC, 900)])


def test_in_flight_guesses_reach_the_lifetime_bound() -> None:
    """With lifetime.threshold 7, the 6th and 7th failures in flight hold the account
    until a success (rule lifetime_bound, issued at the 7th)."""
    engine = Engine(policy(lifetime={"threshold": 7}))
    engine.step_batch([att(i * SEC) for i in range(5)])
    engine.step_batch([att(4 * SEC + 300), att(4 * SEC + 600)])
    assert count(engine) == 7
    assert [(r, n, t) for r, n, t, _ in locks(engine)] == [
        ("lockout", 5, 4 * SEC),
        ("lifetime_bound", 7, 4600),
    ]


def test_in_flight_zero_keeps_the_old_reading() -> None:
    """lockout.in_flight_ms = 0: every unreported failure inside the lock is ignored."""
    engine = Engine(policy(lockout={"in_flight_ms": 0}))
    engine.step_batch([att(i * SEC) for i in range(5)])
    engine.step_batch([att(4 * SEC + 1), att(4 * SEC + 2)])
    assert count(engine) == 5


UNBOUNDED = policy(lockout={"in_flight_max": 1_000_000})
"""The seed's reading: every failure let through in flight is counted."""


def through_a_slow_gateway(
    gaps: list[int], latency_ms: int, pol: Policy = UNBOUNDED
) -> tuple[Engine, list[Attempt], int]:
    """Attempts at the given gaps against a gateway that applies each lock decision
    ``latency_ms`` after it was issued and reports what it refuses as ``refused``.
    Returns the engine, the events as published, and the failures let through."""
    engine = Engine(pol)
    t = 0
    published: list[Attempt] = []
    through = 0
    for i, gap in enumerate(gaps):
        t += gap
        now = T0 + t
        known = [
            d
            for d in decisions(engine.out)
            if d.scope == "lock" and datetime_to_ms(d.issued_at) + latency_ms <= now
        ]
        newest = max(known, key=lambda d: datetime_to_ms(d.issued_at), default=None)
        refused = newest is not None and now < datetime_to_ms(newest.expires_at)
        a = att(t, source=f"203.0.113.{i % 13}", reason="refused" if refused else "bad_password")
        through += not refused
        published.append(a)
        engine.step_batch([a])
    return engine, published, through


PACINGS = st.lists(
    st.integers(1, 3 * SEC) | st.sampled_from([900 * SEC, 1800 * SEC, 3600 * SEC]),
    min_size=1,
    max_size=120,
)
LATENCIES = st.integers(0, LOCK.in_flight_ms)


@settings(max_examples=80, deadline=None)
@given(PACINGS, LATENCIES)
def test_every_guess_let_through_is_counted_at_any_latency(gaps: list[int], latency: int) -> None:
    """Seed 002 counts every failure that passed the lock check (with ``in_flight_max``
    unbounded): at any decision latency up to in_flight_ms the run is exactly the failures
    the gateway let through, each lock holds at least the curve's length for its count,
    and a replay of the published events gives the same decisions."""
    engine, published, through = through_a_slow_gateway(gaps, latency)
    if through == 0:
        return
    assert count(engine) == through
    for rule, n, _, seconds in locks(engine)[-1:]:
        assert rule == "lifetime_bound" or seconds * SEC == lock_ms(
            n, LOCK.threshold, LOCK.base_ms, LOCK.step, LOCK.cap_ms
        )
    replay = Engine(UNBOUNDED)
    replay.step_batch(published)
    assert locks(replay) == locks(engine)


@settings(max_examples=60, deadline=None)
@given(PACINGS, LATENCIES)
def test_the_default_counts_at_most_in_flight_max_per_lock(gaps: list[int], latency: int) -> None:
    """With the default in_flight_max (10) the run never exceeds the failures let
    through, each lock counts at most 10 in flight, and a replay gives the same
    decisions."""
    engine, published, through = through_a_slow_gateway(gaps, latency, DEFAULT_POLICY)
    if through == 0:
        return
    streak = engine.accounts.tenants["default"].streaks.get(LOCK_KEY)
    assert streak is not None and streak.count <= through
    assert streak.in_flight <= LOCK.in_flight_max == 10
    replay = Engine()
    replay.step_batch(published)
    assert locks(replay) == locks(engine)
