"""The device bound (issue 46, items 3 and 4): forged "trusted" devices escalate on rule 6's
backoff and feed a lifetime bound of their own; the owner's stale trusted clients after a
new password never refuse the owner's trusted laptop, and a reset lifts the bound."""

from __future__ import annotations

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.attempt import Attempt
from pipeline.core.decision_keys import keys_for
from pipeline.core.decisions import Verdict
from pipeline.core.engine import Engine
from pipeline.core.policy import DEFAULT_POLICY, Policy
from pipeline.core.policy_rules import DAY_MS
from tests.unit.test_core_support import HOUR, MIN, SEC, T0, att, decisions, policy

BOUND_KEY = "device|default|" + "a" * 32 + "|-|-"
LAPTOP = "1" * 32


def gateway(engine: Engine, attempts: list[Attempt]) -> list[Verdict]:
    """Each attempt checked before it is applied; a refused one is reported ``refused``."""
    verdicts = []
    for a in attempts:
        verdict = engine.accounts.index.check(keys_for(a), a.occurred_ms)
        if not verdict.allowed:
            a = a._replace(success=False, failure_reason="refused")
        engine.step_batch([a])
        verdicts.append(verdict)
    return verdicts


def forged(start: int, n: int, gap: int) -> list[Attempt]:
    """``n`` failures ``gap`` apart, each with a fresh device id marked trusted."""
    return [att(start + i * gap, device=f"{start + i:032x}", trusted=True) for i in range(n)]


def bounds(engine: Engine) -> list[tuple[int, int]]:
    """(issued minutes after T0, length in minutes) of every device_bound decision."""
    return [
        (
            (datetime_to_ms(d.issued_at) - T0) // MIN,
            (datetime_to_ms(d.expires_at) - datetime_to_ms(d.issued_at)) // MIN,
        )
        for d in decisions(engine.out)
        if d.rule == "device_bound"
    ]


def test_forged_trusted_devices_escalate_and_meet_the_lifetime_bound() -> None:
    """A fresh trusted device id every 20 s for 24 h: the bound's holds grow 15, 30, 60 min
    (rule 6's backoff), and the 100th device let through holds the trusted devices like
    the lifetime bound (published for a day): 100 guesses in 24 h (before: 522)."""
    engine = Engine(DEFAULT_POLICY)
    verdicts = gateway(engine, forged(0, 24 * 180, 20 * SEC))
    assert sum(v.allowed for v in verdicts) == 100
    lengths = [minutes for _, minutes in bounds(engine)]
    assert lengths[:4] == [15, 30, 60, 60]
    assert lengths[-1] == DAY_MS // MIN
    assert set(lengths[2:-1]) == {60}


def test_a_device_bound_past_the_lifetime_threshold_holds_until_a_reset() -> None:
    """lifetime.threshold 8: the 8th forged device holds the trusted devices (published
    for a day); the owner's mailbox reset lifts it and the laptop signs in."""
    engine = Engine(policy(lifetime={"threshold": 8}))
    gateway(engine, forged(0, 6, SEC))
    gateway(engine, forged(16 * MIN, 2, SEC))
    assert bounds(engine)[-1] == (16, DAY_MS // MIN)
    assert not gateway(engine, [att(2 * HOUR, device=LAPTOP, trusted=True, success=True)])[
        0
    ].allowed
    gateway(engine, [att(3 * HOUR, flow="reset", success=True)])
    assert BOUND_KEY in [key for key, value in engine.out.decisions if value is None]
    assert gateway(engine, [att(3 * HOUR + SEC, device=LAPTOP, trusted=True, success=True)])[
        0
    ].allowed


def owner_after_reset(pol: Policy) -> list[Verdict]:
    """The owner resets the password; six stale trusted clients fail once each; then
    the owner's trusted laptop signs in with the new password."""
    engine = Engine(pol)
    stale = [att(MIN + i * SEC, device=f"{i:031x}s", trusted=True) for i in range(6)]
    return gateway(
        engine,
        [
            att(0, flow="reset", success=True),
            *stale,
            att(2 * MIN, device=LAPTOP, trusted=True, success=True),
        ],
    )


def test_stale_trusted_clients_after_a_reset_never_refuse_the_owners_laptop() -> None:
    """Six stale trusted clients failing once each after the owner's reset do not trip
    the device bound (their owner's old clients, familiar.after_reset_ms): the laptop is
    allowed (before: refused for 15 minutes)."""
    assert all(v.allowed for v in owner_after_reset(DEFAULT_POLICY))


def test_a_reset_lifts_the_device_bound() -> None:
    """Six stale clients trip the bound with familiar.after_reset_ms = 0; the owner's next
    reset lifts it (before: it held its 15 minutes) and the laptop signs in."""
    engine = Engine(policy(familiar={"after_reset_ms": 0}))
    gateway(engine, [att(MIN + i * SEC, device=f"{i:031x}s", trusted=True) for i in range(6)])
    assert bounds(engine) == [(1, 15)]
    verdicts = gateway(
        engine,
        [
            att(3 * MIN, flow="reset", success=True),
            att(3 * MIN + SEC, device=LAPTOP, trusted=True, success=True),
        ],
    )
    assert BOUND_KEY in [key for key, value in engine.out.decisions if value is None]
    assert [v.allowed for v in verdicts] == [True, True]


def test_the_owners_trusted_sign_ins_do_not_restart_the_forgers_bound() -> None:
    """A fresh trusted id every 20 s for 2 h while the owner's laptop signs in every
    3 min: the owner's sign-ins clear neither the bound's count nor its level, so the
    holds still grow 15, 30, 60, 60 min and 24 forged guesses get through (when each
    sign-in cleared the bound: 67, under seven 15-minute holds)."""
    engine = Engine(DEFAULT_POLICY)
    guesses = forged(0, 360, 20 * SEC)
    owner = [
        att(i * 3 * MIN + 7 * SEC, device=LAPTOP, trusted=True, success=True) for i in range(40)
    ]
    timeline = sorted([*guesses, *owner], key=lambda a: a.occurred_ms)
    verdicts = dict(zip([a.event_id for a in timeline], gateway(engine, timeline), strict=True))
    assert sum(verdicts[a.event_id].allowed for a in guesses) == 24
    assert [minutes for _, minutes in bounds(engine)] == [15, 30, 60, 60]
