"""Verifying the unfamiliar sign-in (``[verify]``, issue 44): a right password at a place and
with a client the account has not signed in from meets a possession check, whatever the
attacker's pace, duration, exits or own accounts; familiarity comes only from the
account's own completed sign-ins; a ``step_up`` outcome counts nowhere."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.decision_keys import keys_for, verify_key
from pipeline.core.decisions import ALLOWED, Active, DecisionIndex
from pipeline.core.engine import Engine
from pipeline.core.policy import Policy
from pipeline.core.policy_waves import VerifyConfig
from pipeline.sim.gateway import reported
from tests.unit.test_core_support import HOUR, SEC, T0, TENANT, att, decisions, policy

OWNER, VICTIM, ABSENT = "a" * 32, "b" * 32, "c" * 32
HOME, EXIT = "198.51.100.7", "203.0.113.9"
LAPTOP = "d" * 32
ENFORCE = policy(verify={"mode": "enforce"})


def _check(engine: Engine, t: int, account: str, source: str, **kw: object):  # type: ignore[no-untyped-def]
    return engine.accounts.index.check(keys_for(att(t, account, source, **kw)), T0 + t)  # type: ignore[arg-type]


def test_verification_is_policy_per_tenant_and_publishes_nothing() -> None:
    """[verify] is read from the policy by every checker alike: the defaults' enforce asks
    a step-up of an unfamiliar right password, a tenant set to off asks nothing, and no
    decision is published for it (the edge reads the same policy file)."""
    pol = policy(verify={"mode": "enforce"})
    pol = pol.model_copy(
        update={
            "tenants": {
                "acme": pol.defaults.model_copy(update={"verify": VerifyConfig(mode="off")})
            }
        }
    )
    engine = Engine(pol)
    engine.step(att(0, success=True), T0)
    engine.step(att(0, success=True, tenant="acme"), T0)
    assert [(d.rule, d.scope) for d in decisions(engine.out) if d.scope != "familiar"] == []
    verify = _check(engine, SEC, VICTIM, EXIT)
    off = engine.accounts.index.check(keys_for(att(SEC, VICTIM, EXIT, tenant="acme")), T0 + SEC)
    assert (verify.challenge, verify.step_up) == ("step_up", True)
    assert (off.challenge, off.step_up) == (None, False)


def test_an_unfamiliar_right_password_meets_a_step_up_a_familiar_one_does_not() -> None:
    """New place and client: step_up. After the account's completed sign-in there, the
    pair (and its cookie) is familiar: nothing is asked. A trusted device is never asked."""
    engine = Engine(ENFORCE)
    engine.step(att(0, OWNER, HOME, reason=None), T0)  # first attempt of the tenant
    first = _check(engine, SEC, OWNER, HOME, device=LAPTOP)
    assert (first.allowed, first.challenge, first.step_up) == (True, "step_up", True)
    engine.step(att(SEC, OWNER, HOME, success=True, device=LAPTOP), T0 + SEC)
    assert _check(engine, 2 * SEC, OWNER, HOME).step_up is False  # the place
    assert _check(engine, 2 * SEC, OWNER, EXIT, device=LAPTOP).step_up is False  # the cookie
    elsewhere = _check(engine, 2 * SEC, OWNER, EXIT)
    assert (elsewhere.challenge, elsewhere.step_up) == ("step_up", True)
    trusted = _check(engine, 2 * SEC, OWNER, EXIT, device="e" * 32, trusted=True)
    assert (trusted.challenge, trusted.step_up) == (None, False)


def test_an_attackers_own_account_makes_its_exit_familiar_for_nobody_else() -> None:
    """The attacker signs in to its own account from its exit: the victim's right password
    from the same exit still meets a step-up, and during a wave a CAPTCHA first (a known
    place no longer turns the wave's CAPTCHA into a step-up)."""
    engine = Engine(ENFORCE)
    engine.step(att(0, OWNER, EXIT, success=True), T0)
    engine.step(att(SEC, OWNER, EXIT, success=True), T0 + SEC)
    verdict = _check(engine, 2 * SEC, VICTIM, EXIT)
    assert (verdict.challenge, verdict.step_up) == ("step_up", True)
    wave = Active("wave-1", "challenge", T0 + HOUR, "spray_tenant", "captcha")
    engine.accounts.index.put(("tenant", TENANT, None, None, None), wave)
    verdict = _check(engine, 11 * SEC, VICTIM, EXIT)
    assert (verdict.challenge, verdict.step_up) == ("captcha", True)


def test_a_step_up_outcome_counts_nowhere_and_ends_no_lock_run() -> None:
    """A right password answered by a step-up makes nothing familiar, counts in no rule
    and does not end the consecutive run: four failures, a step-up, one failure lock the
    account (seed 002); with a completed sign-in in its place they do not."""
    for middle, locked in ((dict(reason="step_up"), True), (dict(success=True), False)):
        engine = Engine(ENFORCE)
        for i in range(4):
            engine.step(att(i * SEC, VICTIM, EXIT), T0 + i * SEC)
        engine.step(att(5 * SEC, VICTIM, HOME, **middle), T0 + 5 * SEC)
        stepped = _check(engine, 6 * SEC, VICTIM, HOME)
        assert stepped.step_up is locked  # no familiar place from a step-up alone
        engine.step(att(6 * SEC, VICTIM, EXIT), T0 + 6 * SEC)
        lock = engine.accounts.index.get(("lock", TENANT, VICTIM, None, None))
        assert (lock is not None) is locked


def test_observe_mode_asks_nothing_and_marks_the_attempt_observed() -> None:
    """mode = "observe": the record is an observe; the verdict asks nothing and names it."""
    engine = Engine(policy(verify={"mode": "observe"}))
    engine.step(att(0), T0)
    verdict = _check(engine, SEC, VICTIM, EXIT)
    assert (verdict.allowed, verdict.challenge, verdict.step_up, verdict.applied) == (
        True,
        None,
        False,
        "observe",
    )
    assert verdict.observed_key == verify_key(TENANT)


def test_the_answer_before_the_password_is_the_same_for_absent_accounts() -> None:
    """No oracle: an absent account and a real one get the same verdict at the same place."""
    engine = Engine(ENFORCE)
    engine.step(att(0, VICTIM, HOME, success=True), T0)
    engine.step(att(SEC, ABSENT, EXIT, reason="unknown_account"), T0 + SEC)
    engine.step(att(SEC, VICTIM, EXIT), T0 + SEC)
    assert _check(engine, 2 * SEC, VICTIM, EXIT) == _check(engine, 2 * SEC, ABSENT, EXIT)


@settings(max_examples=60, deadline=None)
@given(
    gaps_ms=st.lists(st.integers(20, 50 * SEC), min_size=1, max_size=60),
    exits=st.integers(1, 100_000),
    own_every=st.integers(0, 5),
    valid_every=st.integers(1, 10),
    stretch=st.sampled_from([1, 60, 1440]),
)
def test_no_valid_credential_becomes_a_session_unverified_whatever_the_attacker_does(
    gaps_ms: list[int], exits: int, own_every: int, valid_every: int, stretch: int
) -> None:
    """A stuffer at any pace (20 ms to 50 s between attempts, stretched up to 24 h), from
    1 to 100,000 exits, signing in to its own account at its exits or not: every right
    password of a victim's account meets a step-up (the gateway model of backtest)."""
    engine = Engine(ENFORCE)
    people = [(f"{i:032x}", f"10.0.{i}.1") for i in range(20)]
    for n, (account, home) in enumerate(people):  # the owners' history
        engine.step(att(n, account, home, success=True), T0 + n)
    t = HOUR
    unverified = 0
    for n, gap in enumerate(gaps_ms):
        t += gap * stretch
        exit_ip = f"203.0.{(n % exits) // 256 % 256}.{(n % exits) % 256}"
        if own_every and n % own_every == 0:
            engine.step(att(t, OWNER, exit_ip, success=True), T0 + t)
        victim = people[n % len(people)][0]
        attempt = att(t, victim, exit_ip, success=n % valid_every == 0)
        verdict = engine.accounts.index.check(keys_for(attempt), T0 + t)
        if attempt.success and verdict.allowed and not verdict.step_up:
            unverified += 1
        for report in reported(attempt, verdict, bot=True):
            engine.step(report, T0 + t)
    assert unverified == 0


def test_the_default_policy_verifies_unfamiliar_sign_ins() -> None:
    """[verify] mode defaults to enforce (issue 44): a CAPTCHA is a cost, not a verification."""
    assert Policy().defaults.verify.mode == "enforce"


@settings(max_examples=200, deadline=None)
@given(
    mode=st.sampled_from(["enforce", "observe", "off"]),
    exempt=st.sampled_from(["pair", "client", "other", None]),
    device=st.sampled_from([LAPTOP, None]),
    trusted=st.booleans(),
    flow=st.sampled_from(["login", "token", "recovery", "mfa", "uia", "reset"]),
    expired=st.booleans(),
)
def test_the_fast_path_answers_what_the_full_check_answers(
    mode: str,
    exempt: str | None,
    device: str | None,
    trusted: bool,
    flow: str,
    expired: bool,
) -> None:
    """With no decision on the account, source or tenant (at most a familiar exempt, in
    force or expired), DecisionIndex.unfamiliar (the worker's and the edge's fast path)
    gives the verdict check gives, for every mode, flow, client and exempt."""
    index = DecisionIndex(policy=policy(verify={"mode": mode}))
    until = T0 + (-1 if expired else HOUR)
    exempts = {
        "pair": ("familiar", TENANT, VICTIM, EXIT, None),
        "client": ("familiar", TENANT, VICTIM, None, LAPTOP),
        "other": ("familiar", TENANT, OWNER, EXIT, None),
    }
    if exempt is not None:
        index.put(exempts[exempt], Active("x", "exempt", until, "familiar"))
    a = att(0, VICTIM, EXIT, device=device, trusted=trusted, flow=flow, success=True)
    assert not index.may_apply(TENANT, VICTIM, EXIT)
    full = index.check(keys_for(a), T0)
    fast = (
        index.unfamiliar(TENANT, VICTIM, EXIT, a.device, T0)
        if a.flow in ("login", "token", "recovery") and not a.trusted
        else ALLOWED
    )
    assert (fast.allowed, fast.challenge, fast.step_up, fast.applied) == (
        full.allowed,
        full.challenge,
        full.step_up,
        full.applied,
    )
