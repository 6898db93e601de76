"""Credential stuffing (``pipeline.core.stuffing``) and the redemption that keeps NATs,
typo-makers and households out of the stuffing block and the spray signal."""

from __future__ import annotations

from typing import Any

from pipeline.core.engine import Engine
from pipeline.core.state import SourceState
from pipeline.core.stuffing import TenantStuffing
from tests.unit.test_core_support import SEC, SOURCE, alerts, att, decisions

NAT = "192.0.2.10"
V6 = "2001:db8:1:2::/64"


def _unknown(t: int, i: int, source: str = SOURCE) -> object:
    return att(t, account=f"{i:032x}", source=source, reason="unknown_account")


def test_stuffing_same_mistyped_account_again_is_not_stuffing() -> None:
    """A typo-maker retrying the same wrong identifier three times is one unknown account."""
    engine = Engine()
    engine.step_batch([_unknown(i * 5 * SEC, 7) for i in range(3)])  # type: ignore[misc]
    assert decisions(engine.out) == []


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
    # An alert only: whether accounts exist never changes a decision (no oracle), and
    # no source is blocked; the wave challenge follows rule 8's existence-blind count.
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
