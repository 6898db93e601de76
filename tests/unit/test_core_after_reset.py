"""A new password's stale clients (``FamiliarConfig.after_reset_ms``): after a reset or a
recovery success, the account's failures are left out of the wave's counts (rule 8 and
the strangers tier), and every other count goes on."""

from __future__ import annotations

from pipeline.core.attempt import Attempt
from pipeline.core.decision_keys import reset_key
from pipeline.core.engine import Engine
from pipeline.core.policy import DEFAULT_POLICY, Policy, policy_from_toml
from tests.unit.test_core_strangers import HISTORY_MS, _history, _run, _waves
from tests.unit.test_core_support import MIN, SEC, TENANT, att

APPS = 60
OFF = policy_from_toml("[defaults.familiar]\nafter_reset_ms = 0\n")


def _stale_apps(flow: str = "reset", retry_ms: int = 60 * SEC) -> list[Attempt]:
    """60 people reset their password, one every 5 s; each phone's mail app then retries
    the old one from a new carrier address every minute, six times (the simulator's
    ``stale_app``)."""
    out = []
    for i in range(APPS):
        account, t = f"{i:030x}aa", HISTORY_MS + i * 5 * SEC
        out.append(att(t, account, f"198.51.200.{i}", success=True, flow=flow))
        out += [
            att(
                t + 30 * SEC + k * retry_ms,
                account,
                f"100.64.{i}.{k}",
                device=f"app-{i}",
                flow="token",
            )
            for k in range(6)
        ]
    return out


def _strangers(attempts: list[Attempt], policy: Policy = DEFAULT_POLICY) -> int:
    """The strangers' sources the tier counted and no sign-in redeemed (every window;
    before ``finish``, which forgets them)."""
    engine = Engine(policy)
    engine.step_batch(sorted(attempts, key=lambda a: (a.occurred_ms, a.event_id)))
    tier = engine.rollup.tier
    return sum(sum(w.values()) for w in tier.strangers.values()) - sum(
        sum(w.values()) for w in tier.redeemed.values()
    )


def _locks(engine: Engine) -> set[str]:
    return {
        d.account_digest or ""
        for _, d in engine.out.decisions
        if d is not None and d.rule == "lockout" and d.action == "block"
    }


def _run_apps(policy: Policy, flow: str = "reset") -> Engine:
    return _run([*_history(), *_stale_apps(flow)], policy)


def test_a_new_passwords_stale_clients_are_no_strangers_and_raise_no_wave() -> None:
    """60 stale mail apps after their owners' resets: no stranger counted, no wave, no
    alert; with after_reset_ms = 0 each app is a stranger's source (60, counted once per
    account) and the tier challenges the tenant."""
    assert _strangers([*_history(), *_stale_apps()]) == 0
    engine = _run_apps(DEFAULT_POLICY)
    assert _waves(engine) == []
    assert [a for a in engine.out.alerts if a.type in ("strangers_tenant", "spray_tenant")] == []
    assert _strangers([*_history(), *_stale_apps()], OFF) == APPS
    assert {d.rule for d in _waves(_run_apps(OFF))} == {"strangers_tenant"}


def test_a_recovery_success_counts_as_a_new_password() -> None:
    """A recovery secret's success (flow recovery) leaves the stale app out as a reset does."""
    assert _strangers([*_history(), *_stale_apps("recovery")]) == 0


def test_the_lock_still_counts_a_stale_apps_failures() -> None:
    """The wave's counts leave the app out, the lock does not (seed 002): the same accounts
    are locked with and without after_reset_ms."""
    on, off = _locks(_run_apps(DEFAULT_POLICY)), _locks(_run_apps(OFF))
    assert on == off
    assert len(on) == APPS


def test_failures_after_after_reset_ms_count_again() -> None:
    """With after_reset_ms = 2 minutes, an app retrying every 3 minutes is left out for its
    first retry only; its next one is a stranger's source again, and the ones after it
    repeat the account within recount_ms (one per account)."""
    policy = policy_from_toml("[defaults.familiar]\nafter_reset_ms = 120000\n")
    assert _strangers([*_history(), *_stale_apps(retry_ms=3 * MIN)], policy) == APPS


def test_a_new_passwords_entry_is_kept_as_long_as_a_familiar_entry_then_expires() -> None:
    """The reset entry lives familiar.memory_ms from the reset, not forever (it used to
    take StreakState's default, so only the table's cap ever removed it)."""
    engine = Engine(DEFAULT_POLICY)
    reset = att(HISTORY_MS, "ab" * 15, "198.51.200.1", success=True, flow="reset")
    engine.step_batch([reset])
    reset_at = reset.occurred_ms
    rules = engine.accounts.tenant(TENANT)
    key = reset_key(TENANT, "ab" * 15)
    memory_ms = DEFAULT_POLICY.defaults.familiar.memory_ms
    assert rules.familiar.mapping[key].keep_until_ms == reset_at + memory_ms
    assert rules.familiar.expire(reset_at + memory_ms - 1) == []
    assert key in rules.familiar.expire(reset_at + memory_ms)
