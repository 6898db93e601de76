"""Rule 8's slow tier (``strangers_tenant``): per tenant and window, the strangers'
failing sources and those a sign-in redeemed (the ``x`` and ``r`` shares), checked quickly
``quick_ms`` after a window and again once it has settled (``StrangersConfig``).
``TenantRollup`` records the shares and calls ``settle`` at each second boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from pipeline.contracts.models import Alert
from pipeline.core.outbox import REDEEMED_SHARE, STRANGER_SHARE
from pipeline.core.policy import Policy
from pipeline.core.policy_waves import StrangersConfig, TenantSprayConfig
from pipeline.core.records import build_alert

SLOW_SHARES: Final = (STRANGER_SHARE, REDEEMED_SHARE)
"""The share kinds the tier sums."""
QUICK_FIRED: Final = "q"
"""The tag of the quick check's fired windows (``StrangersTier.quick_fired``); the slow
check's are tagged ``STRANGER_SHARE``, rule 8's ``""``."""
EVERY_PART: Final = -1
"""A forgotten share's part: the shares of that kind and window from every part."""


class StrangersTier:
    """The slow tier's state and checks. ``shares``, ``first_window`` and ``waves_due`` are
    the rollup's own (the shards' latest shares, each tenant's first window, and the wave
    records an evaluation issues), shared so that forgetting a window here drops its
    shares there and a firing here is published with rule 8's, in issue order.
    ``forgotten_shares`` and ``forgotten_fired`` are the rollup's lists of what it no
    longer looks at (``TenantRollup``): the tier adds the windows it forgets."""

    def __init__(
        self,
        policy: Policy,
        shares: dict[tuple[str, str, int, int], int],
        first_window: dict[str, int],
        waves_due: list[tuple[int, str, str, int, int]],
        forgotten_shares: list[tuple[str, str, int, int]] | None = None,
        forgotten_fired: list[tuple[str, str, int]] | None = None,
    ) -> None:
        self.policy = policy
        self.shares = shares
        self.first_window = first_window
        self.waves_due = waves_due
        self.forgotten_shares: list[tuple[str, str, int, int]] = (
            [] if forgotten_shares is None else forgotten_shares
        )
        self.forgotten_fired: list[tuple[str, str, int]] = (
            [] if forgotten_fired is None else forgotten_fired
        )
        self.strangers: dict[str, dict[int, int]] = {}
        """Per tenant and rule-8 window, the strangers' failing sources (``StrangersConfig``)."""
        self.redeemed: dict[str, dict[int, int]] = {}
        """Per tenant and window, those of them a sign-in redeemed."""
        self.slow_fired: set[tuple[str, int]] = set()
        """The settled windows the slow tier fired on (in the changelog, like ``fired``)."""
        self.newly_slow_fired: list[tuple[str, int]] = []
        """The slow tier's firings since the caller last drained this."""
        self.quick_fired: set[tuple[str, int]] = set()
        """The windows the slow tier's quick check fired on (in the changelog too): the
        settled check still evaluates them, so a wave lasts as long as without it."""
        self.newly_quick_fired: list[tuple[str, int]] = []
        """The quick check's firings since the caller last drained this."""
        self.quick_sums: dict[str, dict[int, int]] = {}
        """Per tenant and window, the quick check's sum at the window's quick time (when
        not 0): its baseline is taken from them (in the changelog too)."""
        self.newly_quick_sums: list[tuple[str, int, int | None]] = []
        """``(tenant, window, sum)`` recorded since the caller last drained this; None:
        forgotten (a tombstone)."""
        self.rule8_fired: set[tuple[str, int]] = set()
        """Rule 8's fired windows (``TenantRollup`` adds them), kept as long as the tier's
        own: a window in a wave is no calm window for the tier's baselines either, or an
        attack the tier did not fire on (while it learned, or under another wave) would
        raise its norm and mask the next."""
        self.last_fired_ms: dict[str, int] = {}
        """Per tenant, when the tier last fired (either check; derived from the fired
        windows after a restore, ``restored``): a firing within ``wave.hold_ms`` of it is
        the same wave and raises no alert."""

    def restored(self) -> None:
        """After the fired windows were loaded: when each tenant's tier last fired."""
        self.last_fired_ms.clear()
        for fired, settled in ((self.slow_fired, True), (self.quick_fired, False)):
            for tenant, window in fired:
                policy = self.policy.for_tenant(tenant)
                cfg, window_ms = policy.strangers, policy.tenant_spray.window_ms
                due = (window + 1) * window_ms + (cfg.redeem_ms if settled else cfg.quick_ms)
                if due > self.last_fired_ms.get(tenant, -1):
                    self.last_fired_ms[tenant] = due

    def record(self, tenant: str, window: int, kind: str, delta: int) -> None:
        """``delta`` more strangers' sources (``STRANGER_SHARE``) or redeemed ones in the
        tenant's window."""
        by_window = (self.strangers if kind == STRANGER_SHARE else self.redeemed).setdefault(
            tenant, {}
        )
        by_window[window] = by_window.get(window, 0) + delta

    def settle(self, previous: int, boundary: int) -> list[Alert]:
        """Evaluate each tenant's windows due since ``previous``, in the order they fell
        due: window ``w`` is settled at ``(w + 1) x window + redeem_ms``, when no later
        sign-in can redeem its sources, and checked early at ``(w + 1) x window +
        quick_ms`` (``StrangersConfig``). Every share before a due time is recorded when it
        is evaluated and none after (``advance``), so an evaluation is the same whenever
        the tick reaches it, one second at a time or in a jump."""
        alerts = []
        for tenant in sorted(self.strangers):
            policy = self.policy.for_tenant(tenant)
            cfg, window_ms = policy.strangers, policy.tenant_spray.window_ms
            if not cfg.enabled:
                continue
            strangers = self.strangers[tenant]
            due = self._due(strangers, previous, boundary, cfg.redeem_ms, cfg.span_ms, window_ms)
            if cfg.quick_min_sources:
                quick = self._due(
                    strangers, previous, boundary, cfg.quick_ms, cfg.quick_span_ms, window_ms
                )
                due.extend((at, 0, window) for at, _, window in quick)
            for at, settled, window in sorted(due):
                alert = self._strangers(tenant, window, at, settled == 1, cfg, window_ms)
                if alert is not None:
                    alerts.append(alert)
            high = (boundary - cfg.redeem_ms) // window_ms - 1
            if high >= (previous - cfg.redeem_ms) // window_ms:  # a window settled
                self._forget(tenant, high - self.keep_windows(tenant) - 2)
        return alerts

    @staticmethod
    def _due(
        strangers: dict[int, int],
        previous: int,
        boundary: int,
        after_ms: int,
        span_ms: int,
        window_ms: int,
    ) -> list[tuple[int, int, int]]:
        """``(due_ms, 1, window)`` for each window due in ``(previous, boundary]`` (at
        ``(w + 1) x window_ms + after_ms``) whose ``span_ms`` holds a stranger's source."""
        low = (previous - after_ms) // window_ms if previous >= 0 else min(strangers)
        high = (boundary - after_ms) // window_ms - 1
        if high < low:
            return []
        span = max(1, span_ms // window_ms)
        due: set[int] = set()
        # Only windows within a span before the due ones reach them: look those up (one
        # window falls due at a time), not every window kept (up to max_wave_ms).
        reach = range(low - span + 1, high + 1)
        for failed in reach if len(reach) < len(strangers) else list(strangers):
            if failed in strangers and failed + span - 1 >= low and failed <= high:
                due.update(range(max(failed, low), min(failed + span - 1, high) + 1))
        return [((w + 1) * window_ms + after_ms, 1, w) for w in due]

    def _strangers(
        self,
        tenant: str,
        window: int,
        due_ms: int,
        settled: bool,
        cfg: StrangersConfig,
        window_ms: int,
    ) -> Alert | None:
        """``window``, due at ``due_ms`` (its wave record's issue time): fire when its
        ``span_ms`` of unredeemed sources reach ``floor`` and ``factor`` times the
        ``quantile`` of such sums, and its last ``active_ms`` keep that pace: the settled
        check's ``span_ms``, ``min_sources``, ``factor`` and
        ``tenant_spray.baseline_quantile``, or the quick check's. Each check fires a
        window once; one alert per wave, whichever check fired its windows."""
        spray = self.policy.for_tenant(tenant).tenant_spray
        if settled:
            span_ms, floor = cfg.span_ms, cfg.min_sources
            factor, quantile = cfg.factor, spray.baseline_quantile
            fired, newly = self.slow_fired, self.newly_slow_fired
        else:
            span_ms, floor = cfg.quick_span_ms, cfg.quick_min_sources
            factor, quantile = cfg.quick_factor, cfg.quick_quantile
            fired, newly = self.quick_fired, self.newly_quick_fired
        slot = (tenant, window)
        if slot in fired:
            return None
        span = max(1, span_ms // window_ms)
        unredeemed = self._unredeemed(tenant)
        total = sum(unredeemed(w) for w in range(window - span + 1, window + 1))
        if not settled and total:  # the quick check's baseline sample, before anything
            self.quick_sums.setdefault(tenant, {})[window] = total
            self.newly_quick_sums.append((tenant, window, total))
        if (window - self.first_window.get(tenant, window)) * window_ms < cfg.min_history_ms:
            return None
        active = min(span, max(1, cfg.active_ms // window_ms))
        recent = sum(unredeemed(w) for w in range(window - active + 1, window + 1))
        if recent * span < floor * active:
            return None  # not at the floor's pace lately: the attack (if any) is over
        if total < floor:
            return None
        baseline = (
            self._span_baseline(tenant, window, span, quantile, cfg, spray, window_ms)
            if settled
            else self._quick_baseline(tenant, window, span, quantile, cfg, spray, window_ms)
        )
        threshold = max(floor, factor * baseline)
        if total < threshold or recent * span < threshold * active:
            return None  # under the norm, or no longer at the firing pace
        fired.add(slot)
        newly.append(slot)
        either = self._slow_or_quick
        last = self.last_fired_ms.get(tenant, -1)
        self.last_fired_ms[tenant] = due_ms
        wave = self.policy.for_tenant(tenant).wave
        if wave.enabled:
            first = window
            while either((tenant, first - 1)):
                first -= 1
            since = max(0, (first + 1) * window_ms - cfg.lead_in_ms) if cfg.lead_in_ms else -1
            self.waves_due.append((due_ms, "strangers_tenant", tenant, total, since))
        if (
            either((tenant, window - 1))
            or (settled and slot in self.quick_fired)
            or (last >= 0 and due_ms - last <= wave.hold_ms)
        ):
            return None  # the same wave (its record still in force): one alert per wave
        return build_alert(
            "strangers_tenant",
            tenant,
            None,
            None,
            total,
            total,
            (window - span + 1) * window_ms,
            (window + 1) * window_ms,
            self.policy.policy_version,
        )

    def _span_baseline(
        self,
        tenant: str,
        window: int,
        span: int,
        quantile: float,
        cfg: StrangersConfig,
        spray: TenantSprayConfig,
        window_ms: int,
    ) -> int:
        """The ``quantile`` of the span sums ending at the last
        ``spray.baseline_windows`` windows that did not fire, looked for as far back as
        ``max_wave_ms`` (a patient attack is no new norm; when they all fired, the last
        ``baseline_windows`` are the sample: a lasting change of the norm is a wave for
        ``max_wave_ms`` at most). Sums, not windows: a tenant's unredeemed sources are
        sparse (most windows hold none), so only a sum shows a steady level, such as a
        cold start's, where every place is new. Only whole spans: a sum reaching back
        before the tenant's first window would understate its norm."""
        oldest = self._oldest(tenant, window, span, cfg, window_ms)
        unredeemed = self._unredeemed(tenant)

        def sums() -> Iterator[int]:
            # The span sum ending at ``end`` (windows in (end - span, end]), slid back one
            # window at a time: the work is the windows looked at, not all of max_wave_ms.
            total = sum(unredeemed(w) for w in range(window - span, window))
            for end in range(window - 1, oldest - 1, -1):
                yield total
                total += unredeemed(end - span) - unredeemed(end)

        return self._calm_quantile(tenant, window, sums(), spray.baseline_windows, quantile)

    def _quick_baseline(
        self,
        tenant: str,
        window: int,
        span: int,
        quantile: float,
        cfg: StrangersConfig,
        spray: TenantSprayConfig,
        window_ms: int,
    ) -> int:
        """The ``quantile`` of the quick check's sums, each as it stood at its own quick
        time, at the last ``spray.baseline_windows`` windows that did not fire (looked
        for as far back as ``max_wave_ms``, as the settled check's are): later sign-ins
        lower a window's count, so today's counts of old windows would understate what
        the tenant's own people leave unredeemed ``quick_ms`` after a window. Only whole
        spans, as the settled check's."""
        sums = self.quick_sums.get(tenant, {})
        oldest = self._oldest(tenant, window, span, cfg, window_ms)
        values = (sums.get(end, 0) for end in range(window - 1, oldest - 1, -1))
        return self._calm_quantile(tenant, window, values, spray.baseline_windows, quantile)

    def _oldest(
        self, tenant: str, window: int, span: int, cfg: StrangersConfig, window_ms: int
    ) -> int:
        """The oldest window a baseline's sample ends at: within ``max_wave_ms``, and the
        first whose ``span`` lies wholly after the tenant's first window."""
        first = self.first_window.get(tenant, window) + span - 1
        return max(first, window - cfg.max_wave_ms // window_ms)

    def _calm_quantile(
        self, tenant: str, window: int, values: Iterator[int], wanted: int, quantile: float
    ) -> int:
        """The ``quantile`` of ``values`` (one per window from ``window - 1`` back) at the
        first ``wanted`` windows that neither the tier nor rule 8 fired on; when every
        window looked at fired, of the first ``wanted`` of those (a lasting change of the
        norm is a wave for ``max_wave_ms`` at most); 0 with none."""
        sample: list[int] = []
        fired_sums: list[int] = []
        end = window - 1
        rule8 = self.rule8_fired
        for value in values:
            slot = (tenant, end)
            if not self._slow_or_quick(slot) and slot not in rule8:
                sample.append(value)
                if len(sample) == wanted:
                    break
            elif len(fired_sums) < wanted:
                fired_sums.append(value)
            end -= 1
        if not sample:
            sample = fired_sums
        if not sample:
            return 0
        sample.sort()
        return sample[int(quantile * (len(sample) - 1))]

    def _slow_or_quick(self, slot: tuple[str, int]) -> bool:
        """Whether either check of the slow tier fired on the (tenant, window)."""
        return slot in self.slow_fired or slot in self.quick_fired

    def _unredeemed(self, tenant: str) -> Callable[[int], int]:
        strangers = self.strangers.get(tenant, {})
        redeemed = self.redeemed.get(tenant, {})

        def unredeemed(window: int) -> int:
            return max(0, strangers.get(window, 0) - redeemed.get(window, 0))

        return unredeemed

    def people_like(self, tenant: str) -> Callable[[int], bool]:
        """Whether a window's failures were mostly people's: at least one stranger's
        source failed in it and a sign-in redeemed at least half of them (``redeem_ms``
        later at most; a window not yet settled may still gain). An attack's exits are
        redeemed only by the few valid credentials they tried and an attacker's own
        accounts' ``new_per_day``; a rise of people who mistype at new places, then sign
        in, is redeemed like the norm it becomes. Rule 8 takes such fired windows as its
        baseline once no calm window is left in its horizon (``TenantRollup``)."""
        strangers = self.strangers.get(tenant, {})
        redeemed = self.redeemed.get(tenant, {})

        def people(window: int) -> bool:
            failed = strangers.get(window, 0)
            return failed > 0 and 2 * redeemed.get(window, 0) >= failed

        return people

    def keep_windows(self, tenant: str) -> int:
        """How many windows back the tier looks: ``max_wave_ms`` plus a span for its
        sums, then ``baseline_windows`` for a baseline's sample."""
        policy = self.policy.for_tenant(tenant)
        cfg, spray = policy.strangers, policy.tenant_spray
        return (cfg.max_wave_ms + cfg.span_ms) // spray.window_ms + spray.baseline_windows

    def forget_rule8(self, tenant: str, window: int) -> None:
        """Rule 8 reached ``window``: drop its firings the tier no longer looks at (bounded
        memory also for a tenant with no strangers, whose windows ``settle`` never sees)."""
        horizon = window - self.keep_windows(tenant) - 2
        self.rule8_fired = self._without_before(self.rule8_fired, tenant, horizon, "")

    def _forget(self, tenant: str, horizon: int) -> None:
        """Drop the tenant's slow-tier windows before ``horizon`` (bounded memory), and
        say so (``forgotten_shares``, ``forgotten_fired``): their changelog records go."""
        windows: set[int] = set()
        for table in (self.strangers.get(tenant), self.redeemed.get(tenant)):
            if table and min(table) < horizon:
                for window in [w for w in table if w < horizon]:
                    del table[window]
                    windows.add(window)
        for window in sorted(windows):
            for kind in SLOW_SHARES:
                self.forgotten_shares.append((kind, tenant, window, EVERY_PART))
        if not self.strangers.get(tenant):
            self.strangers.pop(tenant, None)
        if not self.redeemed.get(tenant):
            self.redeemed.pop(tenant, None)
        self.slow_fired = self._without_before(self.slow_fired, tenant, horizon, STRANGER_SHARE)
        self.quick_fired = self._without_before(self.quick_fired, tenant, horizon, QUICK_FIRED)
        self.rule8_fired = self._without_before(self.rule8_fired, tenant, horizon, "")
        sums = self.quick_sums.get(tenant)
        if sums and min(sums) < horizon:
            for window in [w for w in sums if w < horizon]:
                del sums[window]
                self.newly_quick_sums.append((tenant, window, None))
        stale = [
            k for k in self.shares if k[1] == tenant and k[2] < horizon and k[0] in SLOW_SHARES
        ]
        for share_key in stale:
            del self.shares[share_key]

    def _without_before(
        self, slots: set[tuple[str, int]], tenant: str, horizon: int, tag: str
    ) -> set[tuple[str, int]]:
        """``slots`` without the tenant's windows before ``horizon`` (the same set when it
        holds none: no copy per call); those dropped go to ``forgotten_fired`` with
        ``tag``."""
        dropped = sorted(w for t, w in slots if t == tenant and w < horizon)
        if not dropped:
            return slots
        self.forgotten_fired.extend((tag, tenant, window) for window in dropped)
        return {s for s in slots if s[0] != tenant or s[1] >= horizon}
