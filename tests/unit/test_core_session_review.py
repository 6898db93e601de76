"""Issue 24: a wave's lead-in. Credentials a stuffing wave tried before it was detected are
stepped up after sign-in (``review_session``); the owner at a place familiar before the
wave is not; the review ends with the wave."""

from __future__ import annotations

from pipeline.contracts.models import Decision, datetime_to_ms
from pipeline.core.attempt import Attempt
from pipeline.core.decision_keys import keys_for
from pipeline.core.decisions import DecisionIndex, active_of
from pipeline.core.engine import Engine
from pipeline.core.keys import parse_key
from pipeline.core.policy import DEFAULT_POLICY, Policy
from pipeline.core.review import review_session
from pipeline.core.rollup import TenantRollup
from tests.unit.test_core_support import MIN, SEC, T0, att

HOME = "198.51.100.77"
PROXY = "203.0.113.9"
OWNER = "0" * 32
VICTIM = "1" * 32
WINDOW_MS = 10 * SEC


def _play(engine: Engine, attempts: list[Attempt]) -> list[Decision]:
    """Each attempt through the engine; every decision and exempt it published, in order."""
    published: list[Decision] = []
    for a in sorted(attempts):
        engine.step(a, max(engine.accounts.watermark_ms, a.occurred_ms))
        out = engine.out
        published += [d for _, d in out.decisions if d is not None]
        published += [Decision.model_validate_json(raw) for _, raw in out.exempts]
        out.decisions.clear()
        out.exempts.clear()
    engine.finish()
    published += [d for _, d in engine.out.decisions if d is not None]
    published += [Decision.model_validate_json(raw) for _, raw in engine.out.exempts]
    return published


def _edge_index(published: list[Decision], until_ms: int) -> DecisionIndex:
    """The decisions issued up to ``until_ms`` as an edge's index holds them."""
    index = DecisionIndex(announce=False)
    for d in published:
        if datetime_to_ms(d.issued_at) <= until_ms:
            index.put(parse_key(d.key), active_of(d))
    return index


def _stuffing(t0_ms: int, valid_at_ms: int) -> list[Attempt]:
    """60 accounts failing from 60 proxies in 9 s, and one valid credential among them."""
    wave = [
        att(t0_ms + i * 150, account=f"{i:030x}ww", source=f"203.0.113.{100 + i}")
        for i in range(60)
    ]
    return [*wave, att(valid_at_ms, account=VICTIM, source=PROXY, success=True)]


def _background(minutes: int) -> list[Attempt]:
    return [
        att(i * 10 * SEC, account=f"{i:031x}b", source=f"198.51.100.{i % 200}")
        for i in range(minutes * 6)
    ]


def test_the_waves_decision_reaches_back_its_lead_in_and_keeps_it_while_extended() -> None:
    """The first firing's window_ms reaches 60 s before the end of its window; the next
    window's firing extends the wave with the same start of evidence."""
    rollup = TenantRollup(DEFAULT_POLICY)
    for window in range(40):
        rollup.update("t", window, "a", 0, 2)
        rollup.update("t", window, "s", 0, 2)
        rollup.advance((window + 1) * WINDOW_MS)
    for window in (40, 41):
        rollup.update("t", window, "a", 0, 60, time_ms=window * WINDOW_MS + 5 * SEC)
        rollup.update("t", window, "s", 0, 60, time_ms=window * WINDOW_MS + 5 * SEC)
        rollup.advance((window + 1) * WINDOW_MS)
    starts = [
        (datetime_to_ms(d.issued_at), datetime_to_ms(d.issued_at) - d.window_ms)
        for _, d in rollup.decisions
    ]
    assert starts == [(406 * SEC, 350 * SEC), (416 * SEC, 350 * SEC)]


def test_no_lead_in_when_it_is_turned_off() -> None:
    """``[wave] lead_in_ms = 0``: the wave's decision has window_ms 0 and reviews nothing."""
    policy = Policy.model_validate({"defaults": {"wave": {"lead_in_ms": 0}}})
    rollup = TenantRollup(policy)
    for window in range(40):
        rollup.update("t", window, "a", 0, 2)
        rollup.update("t", window, "s", 0, 2)
        rollup.advance((window + 1) * WINDOW_MS)
    rollup.update("t", 40, "a", 0, 60, time_ms=405 * SEC)
    rollup.update("t", 40, "s", 0, 60, time_ms=405 * SEC)
    rollup.advance(410 * SEC)
    ((_, wave),) = rollup.decisions
    assert wave.window_ms == 0
    index = DecisionIndex(announce=False)
    index.put(parse_key(wave.key), active_of(wave))
    assert review_session(index, "t", VICTIM, PROXY, None, 404 * SEC, 407 * SEC) is None


def test_a_credential_tried_before_the_wave_is_stepped_up_after_sign_in() -> None:
    """A valid credential 2 s into a stuffing wave signs in unchallenged (the wave is not
    detected yet); once the wave's decision is out, its session owes a step-up, though its
    own success made the proxy pair familiar. The owner who signed in at home before the
    wave, and again during the lead-in, owes none; a session from before the lead-in owes
    none; and nothing is owed once the wave has ended."""
    t = 6 * MIN
    owner_before = att(60 * SEC, account=OWNER, source=HOME, success=True)
    owner_again = att(t + 1 * SEC, account=OWNER, source=HOME, success=True)
    early = att(t - 2 * MIN, account="2" * 32, source="192.0.2.50", success=True)
    attempts = [*_background(6), owner_before, early, owner_again, *_stuffing(t, t + 2 * SEC)]
    engine = Engine(DEFAULT_POLICY)
    # The gateway's view at the valid sign-in: no wave yet, so no challenge.
    published = _play(engine, attempts)
    at_sign_in = _edge_index(published, t + 2 * SEC)
    victim = att(t + 2 * SEC, account=VICTIM, source=PROXY, success=True)
    assert at_sign_in.check(keys_for(victim), victim.occurred_ms).challenge is None
    (first, *_) = [d for d in published if d.scope == "tenant"]
    issued = datetime_to_ms(first.issued_at)
    assert (first.action, first.challenge) == ("challenge", "captcha")
    index = _edge_index(published, issued)
    assert index.get(("familiar", "default", VICTIM, PROXY, None)) is not None

    def review(a: Attempt, now_ms: int = issued) -> str | None:
        return review_session(index, a.tenant, a.account, a.source, a.device, a.occurred_ms, now_ms)

    assert [review(victim), review(owner_again), review(early)] == ["step_up", None, None]
    expires = datetime_to_ms(first.expires_at)
    assert review(victim, expires) is None
    # issued 3 s into the wave; its evidence from 60 s before its first window's end
    assert (issued, issued - first.window_ms) == (T0 + t + 3 * SEC, T0 + t + 10 * SEC - MIN)
