"""The strangers tier's baselines (``StrangersTier``): whole spans only, and no window
either check of the tier or rule 8 fired on."""

from __future__ import annotations

from pipeline.core.engine import Engine
from pipeline.core.outbox import STRANGER_SHARE
from pipeline.core.policy import DEFAULT_POLICY
from pipeline.core.rollup import TenantRollup
from pipeline.core.strangers_tier import StrangersTier
from tests.unit.test_core_strangers import HISTORY_MS, _history
from tests.unit.test_core_support import att

TENANT = "default"
POLICY = DEFAULT_POLICY.for_tenant(TENANT)
CFG, SPRAY = POLICY.strangers, POLICY.tenant_spray
WINDOW_MS = SPRAY.window_ms
SPAN = CFG.span_ms // WINDOW_MS  # 60 windows
QUICK_SPAN = CFG.quick_span_ms // WINDOW_MS  # 6 windows


def _tier(counts: dict[int, int]) -> StrangersTier:
    """A tier whose tenant began at window 0, with ``counts`` strangers per window."""
    tier = StrangersTier(DEFAULT_POLICY, {}, {TENANT: 0}, [])
    for window, count in counts.items():
        tier.record(TENANT, window, STRANGER_SHARE, count)
    return tier


def test_the_settled_baseline_takes_whole_spans_only() -> None:
    """One stranger a window from the tenant's first: every whole span sums 60, and the
    sums of the first 59 windows (1 to 59, reaching back before the tenant) stay out of
    the sample, where they made the 0.1 quantile 12."""
    tier = _tier({w: 1 for w in range(2 * SPAN)})
    baseline = tier._span_baseline(TENANT, 2 * SPAN, SPAN, 0.1, CFG, SPRAY, WINDOW_MS)
    assert baseline == SPAN


def test_the_quick_baseline_takes_whole_spans_only() -> None:
    """The quick sums recorded for the first five windows (their minute reached back before
    the tenant) are not in the quick check's sample."""
    tier = _tier({})
    tier.quick_sums[TENANT] = {w: (1 if w < QUICK_SPAN - 1 else 10) for w in range(20)}
    assert tier._quick_baseline(TENANT, 20, QUICK_SPAN, 0.0, CFG, SPRAY, WINDOW_MS) == 10


def test_the_calm_sample_leaves_out_the_windows_rule_8_fired_on() -> None:
    """Values 9 down to 0 at windows 9 down to 0; rule 8 fired on 5-9: the three calm
    windows nearest are 4, 3 and 2, so their maximum is 4 (9 if rule 8's were calm)."""
    tier = _tier({})
    tier.rule8_fired.update((TENANT, w) for w in range(5, 10))
    assert tier._calm_quantile(TENANT, 10, iter(range(9, -1, -1)), 3, 1.0) == 4
    tier.rule8_fired.clear()
    assert tier._calm_quantile(TENANT, 10, iter(range(9, -1, -1)), 3, 1.0) == 9


def test_rule_8s_firings_reach_the_tier() -> None:
    """A burst of 30 accounts a window from new exits fires rule 8; the rollup hands each
    window it fired on to the tier."""
    burst = [
        att(HISTORY_MS + i * 300, f"{i:030x}bb", f"240.2.{i // 250}.{i % 250}") for i in range(180)
    ]
    engine = Engine(DEFAULT_POLICY)
    engine.step_batch(sorted([*_history(), *burst], key=lambda a: (a.occurred_ms, a.event_id)))
    assert len(engine.rollup.fired) >= 3
    assert engine.rollup.tier.rule8_fired == engine.rollup.fired


def test_the_tier_forgets_rule_8s_firings_with_its_windows() -> None:
    """Rule 8's firings before the horizon go with the tier's own windows (bounded memory)."""
    tier = _tier({})
    tier.rule8_fired.update({(TENANT, 3), (TENANT, 50), ("other", 3)})
    tier._forget(TENANT, 10)
    assert tier.rule8_fired == {(TENANT, 50), ("other", 3)}


def test_rule_8s_firings_are_forgotten_in_a_tenant_without_strangers() -> None:
    """A tenant whose rule 8 fires but which has no strangers (its tier never settles a
    window) still forgets them, once rule 8's windows are further on than the tier looks
    back (max_wave_ms, a span and baseline_windows: 9,060 windows)."""
    rollup = TenantRollup(DEFAULT_POLICY)
    keep = rollup.tier.keep_windows(TENANT)
    assert keep == 9_060
    rollup.tier.rule8_fired.update({(TENANT, 0), (TENANT, 10)})
    rollup._new_window(TENANT, keep + 5, SPRAY)
    assert rollup.tier.rule8_fired == {(TENANT, 10)}
