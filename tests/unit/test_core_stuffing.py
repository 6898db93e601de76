"""Credential stuffing (``pipeline.core.stuffing``) and the redemption that keeps NATs,
typo-makers and households out of the stuffing block and the spray signal."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.engine import Engine
from pipeline.core.state import SourceState
from pipeline.core.stuffing import TenantStuffing, is_stuffing
from tests.unit.test_core_support import MIN, SEC, SOURCE, T0, alerts, att, decisions, policy

NAT = "192.0.2.10"
V6 = "2001:db8:1:2::/64"


def _unknown(t: int, i: int, source: str = SOURCE) -> object:
    return att(t, account=f"{i:032x}", source=source, reason="unknown_account")


def test_stuffing_blocks_a_source_at_its_second_distinct_unknown_account() -> None:
    """Two failures on accounts that do not exist: the second issues a one-hour source block
    (rule stuffing) that refuses the third attempt, even on a real account."""
    engine = Engine()
    verdicts = engine.step_batch(
        [_unknown(0, 1), _unknown(10 * SEC, 2), att(20 * SEC, success=True)]
    )  # type: ignore[list-item]
    assert [v is not None and v.allowed for v in verdicts] == [True, True, False]
    (d,) = decisions(engine.out)
    assert (d.rule, d.scope, d.action, d.key, d.count, d.threshold) == (
        "stuffing",
        "source",
        "block",
        f"source|default|-|{SOURCE}|-",
        2,
        2,
    )
    assert datetime_to_ms(d.expires_at) - datetime_to_ms(d.issued_at) == 60 * MIN


def test_stuffing_same_mistyped_account_again_is_not_stuffing() -> None:
    """A typo-maker retrying the same wrong identifier three times is one unknown account."""
    engine = Engine()
    engine.step_batch([_unknown(i * 5 * SEC, 7) for i in range(3)])  # type: ignore[misc]
    assert decisions(engine.out) == []


def test_stuffing_needs_80_percent_or_half_with_five_unknown_accounts() -> None:
    """Four unknown accounts among five wrong passwords (44 %) are an ordinary address; the
    fifth (50 %) blocks it (a proxy whose part of the list started with real accounts)."""
    engine = Engine()
    engine.step_batch([att(i * SEC, account=f"{100 + i:032x}") for i in range(5)])
    engine.step_batch([_unknown((10 + i) * SEC, i) for i in range(4)])  # type: ignore[misc]
    assert decisions(engine.out) == []
    engine.step_batch([_unknown(20 * SEC, 4)])  # type: ignore[list-item]
    assert [(d.rule, d.count) for d in decisions(engine.out)] == [("stuffing", 5)]


def test_a_spray_with_some_unknown_accounts_is_never_blocked() -> None:
    """A sprayer whose list is 10 % unknown accounts stays signal-only (seed 001)."""
    engine = Engine()
    reasons = ["unknown_account" if i % 10 == 0 else "bad_password" for i in range(400)]
    engine.step_batch(att(i * 100, account=f"{i:032x}", reason=r) for i, r in enumerate(reasons))
    assert [(d.rule, d.action) for d in decisions(engine.out)] == [("source", "observe")]


def test_stuffing_never_blocks_a_nat_whose_users_succeed_after_a_typo() -> None:
    """A NAT where a colleague failed then succeeded is redeemed for the window: two
    colleagues mistyping their identifiers later are not refused."""
    engine = Engine()
    engine.step_batch(
        [
            att(0, account="a" * 32, source=NAT),
            att(5 * SEC, account="a" * 32, source=NAT, success=True),
        ]
    )
    verdicts = engine.step_batch(
        [
            _unknown(60 * SEC, 1, NAT),
            _unknown(70 * SEC, 2, NAT),
            att(80 * SEC, account="b" * 32, source=NAT, success=True),
        ]  # type: ignore[list-item]
    )
    assert all(v is not None and v.allowed for v in verdicts)
    assert decisions(engine.out) == []


def test_stuffing_typo_makers_and_ipv6_rotators_are_never_refused() -> None:
    """500 households (IPv4 and IPv6 /64) each mistype their identifier once, then sign in."""
    engine = Engine()
    attempts = []
    for i in range(500):
        source = f"198.18.{i // 250}.{i % 250}" if i % 2 else f"2001:db8:{i:x}::/64"
        attempts += [
            _unknown(i * SEC, 10_000 + i, source),
            att(i * SEC + 4 * SEC, account=f"{i:032x}", source=source, success=True),
        ]
    verdicts = engine.step_batch(attempts)  # type: ignore[arg-type]
    assert all(v is not None and v.allowed for v in verdicts)
    assert decisions(engine.out) == []


def test_stuffing_observe_mode_publishes_observe_and_never_refuses() -> None:
    """mode = "observe": the stuffing decision is observe-only."""
    engine = Engine(policy(stuffing={"mode": "observe"}))
    verdicts = engine.step_batch([_unknown(i * SEC, i) for i in range(10)])  # type: ignore[misc]
    assert all(v is not None and v.allowed for v in verdicts)
    assert [(d.rule, d.action) for d in decisions(engine.out)] == [("stuffing", "observe")]


def test_stuffing_block_replaces_a_spray_observe_decision_and_spray_never_replaces_it() -> None:
    """A source first seen spraying (observe), then stuffing, is blocked; more spray keeps it blocked."""
    engine = Engine()
    engine.step_batch(att(i * 100, account=f"{i:032x}") for i in range(200))
    engine.step_batch([_unknown(30 * SEC + i * 100, 1000 + i) for i in range(900)])  # type: ignore[misc]
    rules = [(d.rule, d.action) for d in decisions(engine.out)]
    assert rules == [("source", "observe"), ("stuffing", "block")]
    verdict = engine.step(att(20 * MIN, account="c" * 32), T0 + 20 * MIN)
    assert verdict is not None and not verdict.allowed


def test_stuffing_never_blocks_a_source_whose_users_sign_in() -> None:
    """An office NAT with colleagues signing in on new browsers (untrusted successes) is
    not blocked by two mistyped identifiers, even with no failure before them; a proxy
    with one takeover is still blocked at its fifth unknown account."""
    engine = Engine()
    engine.step_batch(
        [att(i * SEC, account=f"{i:032x}", source=NAT, success=True) for i in range(3)]
    )
    verdicts = engine.step_batch([_unknown(60 * SEC, 1, NAT), _unknown(70 * SEC, 2, NAT)])  # type: ignore[list-item]
    assert all(v is not None and v.allowed for v in verdicts)
    engine.step_batch([att(0, account="e" * 32, success=True)])
    engine.step_batch([_unknown((1 + i) * SEC, 10 + i) for i in range(5)])  # type: ignore[misc]
    assert [(d.rule, d.source, d.count) for d in decisions(engine.out)] == [("stuffing", SOURCE, 5)]


def test_nat_of_typo_then_success_users_raises_no_spray_alert() -> None:
    """300 colleagues behind one address each fail once and succeed seconds later: no
    spray_source; 300 failures with no success from one address still raise it."""
    engine = Engine()
    for i in range(300):
        engine.step_batch(
            [
                att(i * SEC, account=f"{i:032x}", source=NAT),
                att(i * SEC + 3 * SEC, account=f"{i:032x}", source=NAT, success=True),
            ]
        )
    assert alerts(engine.out, "spray_source") == []
    assert [d for d in decisions(engine.out) if d.scope == "source"] == []
    engine.step_batch(att(i * SEC, account=f"{i:032x}", source="203.0.113.50") for i in range(300))
    (alert,) = alerts(engine.out, "spray_source")
    assert (alert.source, alert.count) == ("203.0.113.50", 200)


def test_stuffing_tenant_fires_within_seconds_of_a_wave_across_proxies() -> None:
    """Unknown accounts from 60 proxies, one each: stuffing_tenant at the 20th, long before
    any proxy has failed twice; a window that fired fires once more when its total doubles."""
    engine = Engine()
    engine.step_batch([_unknown(i * 300, i, f"100.96.0.{i}") for i in range(100)])  # type: ignore[misc]
    fired = alerts(engine.out, "stuffing_tenant")
    assert [a.count for a in fired] == [20, 40]
    assert len({a.alert_id for a in fired}) == 2
    assert decisions(engine.out) == []


def update(
    waves: TenantStuffing,
    tenant: str,
    window: int,
    part: int,
    share: int,
    min_unknown: int,
    factor: float,
    baseline_windows: int,
) -> int:
    """Record a share, then evaluate at the next second boundary (what the rollup does)."""
    waves.record(tenant, window, part, share)
    return waves.evaluate(tenant, window, min_unknown, factor, baseline_windows)


def test_tenant_stuffing_shares_are_absolute_and_fired_windows_do_not_teach_the_baseline() -> None:
    """Replayed shares change nothing; a fired window counts at its own baseline."""
    waves = TenantStuffing()
    assert update(waves, "t", 0, 0, 19, 20, 5.0, 15) == 0
    assert update(waves, "t", 0, 1, 1, 20, 5.0, 15) == 20
    assert update(waves, "t", 0, 1, 1, 20, 5.0, 15) == 0
    assert update(waves, "t", 0, 0, 39, 20, 5.0, 15) == 40
    assert update(waves, "t", 0, 0, 500, 20, 5.0, 15) == 0  # two alerts per window at most
    assert update(waves, "t", 1, 0, 20, 20, 5.0, 15) == 20  # window 0 counted at baseline 0


@given(st.integers(0, 100), st.integers(0, 100), st.booleans(), st.integers(1, 10))
def test_is_stuffing_is_monotone_in_unknown_accounts(
    failures: int, unknown: int, redeemed: bool, k: int
) -> None:
    """More unknown accounts never turn a stuffing verdict off; a redemption always does."""
    unknown = min(unknown, failures)
    if is_stuffing(failures, unknown, 0, redeemed, k, 0.8, 5, 0.5, 4.0):
        assert not redeemed
        assert is_stuffing(failures + 1, unknown + 1, 0, False, k, 0.8, 5, 0.5, 4.0)
        assert not is_stuffing(failures, unknown, unknown, False, k, 0.8, 5, 0.5, 4.0)


def test_source_state_round_trips_and_loads_records_from_before_the_stuffing_rule() -> None:
    """dump/load keep the rule and the redemption; a 10-field record still loads."""
    state = SourceState(15, 15)
    state.blocked_until_ms, state.block_rule, state.redeemed_until_ms, state.decision_id = (
        9,
        "stuffing",
        7,
        "x",
    )
    state.successes.add(3)
    loaded = SourceState.load(state.dump())
    assert (loaded.block_rule, loaded.redeemed_until_ms, loaded.blocked_until_ms) == (
        "stuffing",
        7,
        9,
    )
    assert (loaded.successes.head, loaded.successes.total) == (3, 1)
    old = SourceState.load(state.dump()[:10])
    assert (old.block_rule, old.redeemed_until_ms) == ("source", 0)


def test_rollup_stage_restores_stuffing_firings_from_its_changelog() -> None:
    """The rollup stage's changelog keeps a window's stuffing_tenant firings: a rebuilt
    rollup neither repeats the first alert nor forgets the one more it may raise."""
    from pipeline.core.policy import DEFAULT_POLICY
    from pipeline.stream.rollup_stage import RollupStage

    def at(time_ms: int, part: int, share: int) -> list[list[Any]]:
        """One share of source partition ``part`` at ``time_ms``, and every upstream
        partition's mark a second past it (the sequencer releases it, and the rollup
        evaluates at that second boundary)."""
        row: list[Any] = ["t", 7, "u", part, share, time_ms, f"e{time_ms}", time_ms]
        return [row] + [[None, time_ms + 1000, kind, p] for kind in "as" for p in range(2)]

    base_ms = 7 * 60_000
    stage = RollupStage(DEFAULT_POLICY, partitions=2)
    stage.rebuild(0, [])
    first = stage.process(0, at(base_ms, 0, 20))
    assert [orjson_type(a) for a in first.alerts] == ["stuffing_tenant"]
    again = RollupStage(DEFAULT_POLICY, partitions=2)
    again.rebuild(0, [(k, v) for k, v in first.changelog if v is not None])
    assert again.process(0, at(base_ms + 1000, 1, 5)).alerts == []
    second = again.process(0, at(base_ms + 2000, 1, 20))
    assert [orjson_type(a) for a in second.alerts] == ["stuffing_tenant"]
    third = RollupStage(DEFAULT_POLICY, partitions=2)
    third.rebuild(0, [(k, v) for k, v in first.changelog + second.changelog if v is not None])
    assert third.process(0, at(base_ms + 3000, 1, 500)).alerts == []


def orjson_type(raw: bytes) -> str:
    import orjson

    return str(orjson.loads(raw)["type"])
