"""A passed CAPTCHA is not asked again (issue 44 item 5): for ``[wave] captcha_pass_ms``
the account shard's ``passed`` exempt spares that account and client every CAPTCHA, and
nothing else (no refusal lifted, no step-up skipped; per account, so one bought CAPTCHA
buys nothing for the next name)."""

from __future__ import annotations

import orjson

from pipeline.contracts.models import Decision, datetime_to_ms
from pipeline.core.account import AccountShard
from pipeline.core.decision_keys import keys_for
from pipeline.core.decisions import Active
from pipeline.core.engine import Engine
from pipeline.core.outbox import Outbox
from pipeline.core.policy import Policy
from tests.unit.test_core_support import HOUR, MIN, SEC, T0, att, policy

PERSON, OTHER = "a" * 32, "b" * 32
CAFE = "203.0.113.9"
PHONE = "d" * 32
WAVE = ("tenant", "default", None, None, None)


def _passes(out: Outbox) -> list[Decision]:
    return [
        d
        for d in map(Decision.model_validate_json, (raw for _, raw in out.exempts))
        if d.scope == "passed"
    ]


def _engine(pol: Policy | None = None) -> Engine:
    """An engine whose tenant is under a wave's CAPTCHA for a day."""
    engine = Engine(pol or policy())
    engine.step(att(0, OTHER, "198.51.100.1", reason=None), T0)
    engine.accounts.index.put(
        WAVE, Active("w", "challenge", T0 + 24 * HOUR, "spray_tenant", "captcha")
    )
    return engine


def _ask(engine: Engine, t: int, account: str = PERSON, **kw: object) -> tuple[str | None, bool]:
    verdict = engine.accounts.index.check(keys_for(att(t, account, CAFE, **kw)), T0 + t)  # type: ignore[arg-type]
    assert verdict.allowed
    return verdict.challenge, verdict.step_up


def _pass(engine: Engine, t: int, account: str = PERSON, **kw: object) -> None:
    engine.step(att(t, account, CAFE, flow="challenge", success=True, **kw), T0 + t)  # type: ignore[arg-type]


def test_a_passed_captcha_is_not_asked_again_for_that_account_and_client() -> None:
    """CAPTCHA, passed; the same account from the same phone is asked none for an hour
    (still the step-up of an unfamiliar right password), then again; another account from
    the same phone still is."""
    engine = _engine()
    assert _ask(engine, SEC, device=PHONE) == ("captcha", True)
    _pass(engine, 2 * SEC, device=PHONE)
    (passed,) = _passes(engine.out)
    assert (passed.key, passed.action, passed.rule) == (
        f"passed|default|{PERSON}|-|{PHONE}",
        "exempt",
        "passed",
    )
    assert datetime_to_ms(passed.expires_at) == T0 + 2 * SEC + HOUR
    assert _ask(engine, 3 * SEC, device=PHONE) == ("step_up", True)
    assert _ask(engine, 2 * SEC + HOUR - 1, device=PHONE) == ("step_up", True)
    assert _ask(engine, 2 * SEC + HOUR, device=PHONE) == ("captcha", True)
    assert _ask(engine, 3 * SEC, OTHER, device=PHONE) == ("captcha", True)
    assert _ask(engine, 3 * SEC) == ("captcha", True)  # no cookie: another client


def test_without_a_cookie_the_pass_is_the_sources() -> None:
    """No device cookie: ``passed|t|a|s|-``, for that account at that source and a client
    without a cookie only."""
    engine = _engine()
    _pass(engine, SEC)
    assert [d.key for d in _passes(engine.out)] == [f"passed|default|{PERSON}|{CAFE}|-"]
    assert _ask(engine, 2 * SEC) == ("step_up", True)
    assert _ask(engine, 2 * SEC, device=PHONE) == ("captcha", True)  # a client with a cookie


def test_a_failed_captcha_passes_nothing_and_a_pass_lifts_no_refusal() -> None:
    """A failed CAPTCHA publishes no pass; a pass voids no lock."""
    engine = _engine()
    engine.step(att(SEC, PERSON, CAFE, flow="challenge", reason="other", device=PHONE), T0 + SEC)
    assert _passes(engine.out) == []
    _pass(engine, 2 * SEC, device=PHONE)
    engine.accounts.index.put(
        ("lock", "default", PERSON, None, None), Active("l", "block", T0 + HOUR, "lockout")
    )
    verdict = engine.accounts.index.check(
        keys_for(att(3 * SEC, device=PHONE, source=CAFE)), T0 + 3 * SEC
    )
    assert (verdict.allowed, verdict.retry_after_ms) == (False, HOUR - 3 * SEC)


def test_captcha_pass_ms_zero_asks_every_time_and_renewal_waits_half_its_time() -> None:
    """``captcha_pass_ms = 0``: nothing published, asked again. Passed again within half
    the time: not published again; after it: published with a new expiry."""
    off = _engine(policy(wave={"captcha_pass_ms": 0}))
    _pass(off, SEC, device=PHONE)
    assert _passes(off.out) == []
    assert _ask(off, 2 * SEC, device=PHONE) == ("captcha", True)
    engine = _engine()
    _pass(engine, 0, device=PHONE)
    _pass(engine, 29 * MIN, device=PHONE)
    _pass(engine, 31 * MIN, device=PHONE)
    assert [datetime_to_ms(d.expires_at) for d in _passes(engine.out)] == [
        T0 + HOUR,
        T0 + 31 * MIN + HOUR,
    ]


def test_the_pass_survives_a_restore() -> None:
    """The pass is a familiar-table entry: a shard restored from its changelog indexes it
    again and still spares the client the CAPTCHA."""
    pol = policy()
    shard = AccountShard(pol)
    shard.step(att(SEC, PERSON, CAFE, flow="challenge", success=True, device=PHONE), 0, Outbox(), 1)
    restored = AccountShard(pol)
    for key, value in {orjson.dumps(k): v for k, v in shard.take_dirty()}.items():
        restored.restore(orjson.loads(key), value)
    restored.finish_restore(Outbox())
    restored.index.put(WAVE, Active("w", "challenge", T0 + 24 * HOUR, "spray_tenant", "captcha"))
    verdict = restored.index.check(keys_for(att(2 * SEC, PERSON, CAFE, device=PHONE)), T0 + 2 * SEC)
    assert (verdict.challenge, verdict.step_up) == ("step_up", True)
