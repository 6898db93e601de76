"""Scenarios of issue 4 in the core alone, with the gateway's refusals honoured: a refused
attempt is reported back as failure_reason "refused" (the password was never checked)."""

from __future__ import annotations

import random

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.attempt import Attempt
from pipeline.core.decision_keys import keys_for
from pipeline.core.decisions import Verdict
from pipeline.core.engine import Engine
from tests.unit.test_core_support import ACCOUNT, HOUR, MIN, SEC, T0, alerts, att, decisions, policy


def _gateway(engine: Engine, a: Attempt) -> Verdict:
    """Check first (like the edge), then report the outcome the service would see."""
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
    result = engine.step_batch([a])[0]
    assert result is not None and result.allowed == verdict.allowed
    return verdict


def test_stranger_never_locks_out_the_owners_trusted_device() -> None:
    """10,000 stranger failures from rotating sources never refuse the owner's device."""
    engine = Engine()
    owner_device = "0" * 32
    owner_verdicts: list[bool] = []
    stranger_refused = 0
    for i in range(10_000):
        t = i * 5 * SEC  # ~14 hours of guessing
        stranger = att(t, source=f"203.0.113.{i % 10}")
        stranger_refused += not _gateway(engine, stranger).allowed
        if i % 36 == 0:  # the owner logs in every 3 minutes from their own browser
            owner = att(t + 1, source="192.0.2.10", device=owner_device, trusted=True, success=True)
            owner_verdicts.append(_gateway(engine, owner).allowed)
    assert len(owner_verdicts) == 278 and all(owner_verdicts)
    # Seed 002's lock: 5 guesses, then 900/1,800/3,600 s locks (the owner's sign-ins on
    # their trusted device do not hand the stranger fresh guesses).
    assert stranger_refused == 10_000 - 25
    assert {d.scope for d in decisions(engine.out)} == {"lock"}


def test_three_hundred_colleagues_behind_one_nat_are_never_refused() -> None:
    """300 colleagues behind one NAT, a working day of logins with typos: nobody refused."""
    rng = random.Random(300)
    nat = "198.51.100.1"
    users = [(f"{i:032x}", f"{i:031x}d", rng.random() < 0.5) for i in range(300)]
    events: list[tuple[int, int]] = []  # (time, user)
    for u in range(300):
        t = rng.randrange(10 * MIN)
        while t < 8 * HOUR:
            events.append((t, u))
            t += int(rng.expovariate(1 / (20 * MIN)))  # about 3 logins an hour
    events.sort()
    engine = Engine()
    refused = 0
    attempts = 0
    for t, u in events:
        account, device, trusted = users[u]
        flow = "uia" if rng.random() < 0.1 else "login"
        session = device if flow == "uia" else None
        typos = 0
        while rng.random() < 0.07 and typos < 3:  # a typo, retried a few seconds later
            a = att(
                t + typos * 7 * SEC,
                account,
                nat,
                device=device,
                trusted=trusted,
                session=session,
                flow=flow,
            )
            refused += not _gateway(engine, a).allowed
            typos += 1
            attempts += 1
        ok = att(
            t + typos * 7 * SEC,
            account,
            nat,
            device=device,
            trusted=trusted,
            session=session,
            flow=flow,
            success=True,
        )
        refused += not _gateway(engine, ok).allowed
        attempts += 1
    assert attempts > 7_000
    assert refused == 0
    assert [d for d in decisions(engine.out) if d.action == "block"] == []
    assert alerts(engine.out, "spray_source") == []


def test_botnet_of_1000_addresses_is_stopped_by_the_ceiling() -> None:
    """1,000 addresses x 3 guesses at one account in 10 minutes: the consecutive lock lets
    exactly 5 through (and with it out of the way, the ceiling exactly 50)."""
    engine = Engine()
    accepted = 0
    for j in range(3000):
        guess = att(j * 200, source=f"10.{j % 1000 // 250}.{j % 250}.1")
        accepted += _gateway(engine, guess).allowed
    assert accepted == 5
    (lock,) = decisions(engine.out)
    assert (lock.scope, lock.rule, lock.account_digest, lock.count) == (
        "lock",
        "lockout",
        ACCOUNT,
        5,
    )
    engine = Engine(policy(lockout={"threshold": 1_000_000}))
    accepted = 0
    for j in range(3000):
        guess = att(j * 200, source=f"10.{j % 1000 // 250}.{j % 250}.1")
        accepted += _gateway(engine, guess).allowed
    assert accepted == 50
    (ceiling,) = decisions(engine.out)
    assert (ceiling.scope, ceiling.account_digest, ceiling.count) == ("account", ACCOUNT, 50)
    assert len(alerts(engine.out, "account_under_attack")) == 1


def test_one_address_spraying_5000_accounts_raises_spray_source() -> None:
    """10 accounts a second from one address: spray_source at the 200th, once."""
    engine = Engine()
    for i in range(5000):
        _gateway(engine, att(i * 100, account=f"{i:032x}", source="203.0.113.66"))
    (alert,) = alerts(engine.out, "spray_source")
    assert (alert.source, alert.count) == ("203.0.113.66", 200)
    assert datetime_to_ms(alert.window_end) == T0 + 199 * 100


def test_unknown_accounts_count_exactly_like_real_ones() -> None:
    """unknown_account failures trip account_source and the lock at 5, like bad_password."""
    engine = Engine()
    engine.step_batch([att(i, reason="unknown_account") for i in range(5)])
    real = Engine()
    real.step_batch([att(i) for i in range(5)])
    assert [d.key for d in decisions(engine.out)] == [d.key for d in decisions(real.out)]
    assert [d.scope for d in decisions(engine.out)] == ["account_source", "lock"]
