"""The tenant rollup: rule 8 (``spray_tenant``), its slow tier (``strangers_tenant``) and
``stuffing_tenant`` from the shards' tenant shares (``pipeline.core.outbox``), evaluated at
second boundaries of event time so the alerts are a function of the events alone, not of
the order the shares arrived in.
"""

from __future__ import annotations

from pipeline.contracts.models import Alert, Decision
from pipeline.core.keys import format_key, stable_id
from pipeline.core.outbox import ACCOUNT_SHARE, UNKNOWN_SHARE
from pipeline.core.policy import DEFAULT_POLICY, Policy
from pipeline.core.policy_waves import TenantSprayConfig
from pipeline.core.records import build_alert, build_decision, decision_value
from pipeline.core.strangers_tier import SLOW_SHARES, StrangersTier
from pipeline.core.stuffing import TenantStuffing

TICK_MS = 1000
"""Rule 8 is evaluated at each second boundary of event time (see ``TenantRollup``)."""
FINAL_MS = 1 << 62
"""A time past every event: ``advance(FINAL_MS)`` evaluates everything recorded."""


class TenantRollup:
    """Rule 8: sums the shards' shares of distinct failing accounts and sources per tenant
    and tumbling window, and raises ``spray_tenant`` once per (tenant, window) when the
    accounts are far above the trailing baseline and enough sources took part.

    Shares are recorded by ``update``; the condition is evaluated by ``advance(time_ms)``
    at each second boundary of event time, before the first share of a later second is
    recorded (and at the end of a replay, ``advance`` past everything). The totals seen
    by an evaluation are therefore exactly those of the events before that boundary,
    whatever order the shares of one second arrived in and however the shards were cut:
    the alert and its ``count`` are a function of the events alone. The baseline (a low
    quantile of the previous windows' account totals, ``TenantSprayConfig``) is taken at
    a window's first evaluation, when those windows are complete; an update is O(1).
    """

    def __init__(self, policy: Policy = DEFAULT_POLICY) -> None:
        self.policy = policy
        self.shares: dict[tuple[str, str, int, int], int] = {}
        self.accounts: dict[tuple[str, int], int] = {}
        self.sources: dict[tuple[str, int], int] = {}
        self.baselines: dict[tuple[str, int], float] = {}
        self.slow_baselines: dict[tuple[str, int], float] = {}
        """Per (tenant, window), the paced check's baseline (``slow_quantile``), taken
        with ``baselines``."""
        self.fired: set[tuple[str, int]] = set()
        self.forgotten_shares: list[tuple[str, str, int, int]] = []
        """``(kind, tenant, window, part)`` of the shares forgotten since the caller last
        drained this (part ``EVERY_PART``: that kind's shares of the window from every
        part): nothing looks at them again, so their changelog records can go."""
        self.forgotten_fired: list[tuple[str, str, int]] = []
        """``(tag, tenant, window)`` of the fired windows forgotten since the caller last
        drained this: rule 8's (tag ``""``, once the slow tier no longer looks at them
        either), the slow tier's checks' (``STRANGER_SHARE``, ``QUICK_FIRED``) and
        ``stuffing_tenant``'s (``UNKNOWN_SHARE``)."""
        self.first_window: dict[str, int] = {}
        self.touched: dict[tuple[str, int], None] = {}
        self.touched_unknown: dict[tuple[str, int], None] = {}
        self.tick_ms = -1
        self._configs: dict[str, TenantSprayConfig] = {}
        self.stuffing = TenantStuffing(self.forgotten_shares, self.forgotten_fired)
        self.decisions: list[tuple[str, Decision]] = []
        self.last_share_ms: dict[str, int] = {}
        """Per tenant, the event time of the newest share recorded: a wave decision is
        issued at the second boundary after it, which the stream and a replay agree on
        (the tick of an evaluation does not: marks can jump over many seconds)."""
        self.newly_fired: list[tuple[str, int]] = []
        """Rule 8's windows that fired since the caller last drained this (a firing
        window of a wave already alerted raises no alert, but is recorded)."""
        self._waves_due: list[tuple[int, str, str, int, int]] = []
        """The wave records one evaluation issues, ``(issued, rule, tenant, count, since)``,
        published in issue order once it is done (``advance``)."""
        self.waves: dict[str, list[int]] = {}
        """Per tenant, ``[since_ms, expires_ms]`` of the last wave record published (rule 8's
        or the slow tier's: they share the tenant's key), so a record issued while it is in
        force keeps its lead-in (in the changelog's ``order`` record)."""
        self.tier = StrangersTier(
            policy,
            self.shares,
            self.first_window,
            self._waves_due,
            self.forgotten_shares,
            self.forgotten_fired,
        )
        """Rule 8's slow tier (``strangers_tenant``), fed the ``x`` and ``r`` shares."""

    def recorded(self, tenant: str, window: int, kind: str, part: int) -> int:
        """The share last recorded for a shard (0 if none): a share at or below it is old."""
        if kind == UNKNOWN_SHARE:
            return self.stuffing.shares.get((tenant, window, part), 0)
        return self.shares.get((kind, tenant, window, part), 0)

    def update(
        self, tenant: str, window: int, kind: str, part: int, share: int, time_ms: int = -1
    ) -> None:
        """Record a shard's latest share (``kind`` ``ACCOUNT_SHARE`` or ``SOURCE_SHARE`` of
        rule 8, ``UNKNOWN_SHARE`` of ``stuffing_tenant``); ``advance`` evaluates both.
        ``time_ms`` is the event time of the attempt that changed the share."""
        if time_ms > self.last_share_ms.get(tenant, -1):
            self.last_share_ms[tenant] = time_ms
        if kind == UNKNOWN_SHARE:
            if self.stuffing.record(tenant, window, part, share):
                self.touched_unknown[(tenant, window)] = None
            return
        if window < self.first_window.get(tenant, window + 1):
            self.first_window[tenant] = window
        share_key = (kind, tenant, window, part)
        old = self.shares.get(share_key, 0)
        if share <= old:
            return
        self.shares[share_key] = share
        if kind in SLOW_SHARES:
            self.tier.record(tenant, window, kind, share - old)
            return
        slot = (tenant, window)
        totals = self.accounts if kind == ACCOUNT_SHARE else self.sources
        totals[slot] = totals.get(slot, 0) + share - old
        self.touched[slot] = None

    def advance(self, time_ms: int) -> list[Alert]:
        """Everything before ``time_ms`` is recorded: evaluate the windows touched since
        the last evaluation if ``time_ms`` reached a new second boundary."""
        boundary = time_ms - time_ms % TICK_MS
        if boundary <= self.tick_ms:
            return []
        previous, self.tick_ms = self.tick_ms, boundary
        # Rule 8 first: the slow tier's baselines leave out the windows it fired on, and
        # a window's last evaluation by rule 8 falls due before the tier looks at it.
        alerts = self._evaluate_touched() if self.touched or self.touched_unknown else []
        if self.tier.strangers:
            alerts.extend(self.tier.settle(previous, boundary))
        if self._waves_due:
            # Both tiers' records in the order of their issue (then rule): the engine visits
            # every second, the stream may jump several, and the records come out the same.
            self._waves_due.sort(key=lambda due: (due[0], due[1]))
            for issued, rule, tenant, count, since in self._waves_due:
                self._publish_wave(tenant, rule, count, issued, since)
            self._waves_due.clear()
        return alerts

    def _evaluate_touched(self) -> list[Alert]:
        alerts = []
        for slot in sorted(self.touched):
            alert = self._evaluate(*slot)
            if alert is not None:
                alerts.append(alert)
        self.touched.clear()
        for slot in sorted(self.touched_unknown):
            alert = self._stuffing(*slot)
            if alert is not None:
                alerts.append(alert)
        self.touched_unknown.clear()
        return alerts

    def _evaluate(self, tenant: str, window: int) -> Alert | None:
        slot = (tenant, window)
        if slot in self.fired:
            return None
        cfg = self._configs.get(tenant)
        if cfg is None:
            cfg = self._configs[tenant] = self.policy.for_tenant(tenant).tenant_spray
        baseline = self.baselines.get(slot)
        if baseline is None:
            baseline = self._new_window(tenant, window, cfg)
        accounts, sources = self.accounts.get(slot, 0), self.sources.get(slot, 0)
        floor = cfg.min_accounts
        if accounts < max(floor, cfg.factor * baseline) or sources < cfg.min_sources:
            # Not a flood: is it a paced wave? The last ``slow_windows`` windows together
            # against as many baselines, at the lower ``slow_factor``.
            n = cfg.slow_windows
            if n <= 1:
                return None
            span = range(window - n + 1, window + 1)
            accounts = sum(self.accounts.get((tenant, w), 0) for w in span)
            slow = self.slow_baselines[slot]
            if accounts < max(floor, cfg.slow_min_accounts, cfg.slow_factor * n * slow):
                return None
            if sum(self.sources.get((tenant, w), 0) for w in span) < cfg.min_sources:
                return None
        if window - self.first_window[tenant] < cfg.min_history_windows:
            return None  # still learning the tenant's norm
        self.fired.add(slot)
        self.tier.rule8_fired.add(slot)
        self.newly_fired.append(slot)
        self._wave(tenant, "spray_tenant", accounts, window, cfg.window_ms)
        if (tenant, window - 1) in self.fired:
            return None  # the same wave: it extends the challenge, one alert per wave
        start = window * cfg.window_ms
        return build_alert(
            "spray_tenant",
            tenant,
            None,
            None,
            accounts,
            accounts,
            start,
            start + cfg.window_ms,
            self.policy.policy_version,
        )

    def _wave(self, tenant: str, rule: str, count: int, window: int, window_ms: int) -> None:
        """A wave fired in ``window``: challenge the tenant's untrusted password attempts
        for ``wave.hold_ms`` from the second boundary after the newest share it saw (a
        later firing issues a later expiry), at most the window's end, so the record is a
        function of the events. No tombstone ever
        lifts it: it ends at its ``expires_at``, live and in replay alike.

        Its ``window_ms`` reaches back to the lead-in's start: ``wave.lead_in_ms`` before
        the end of the first window of the run of consecutive fired windows this one
        belongs to (``fired`` is in the changelog, so a restored rollup computes the
        same); 0 when ``lead_in_ms`` is 0 (no session review)."""
        cfg = self.policy.for_tenant(tenant).wave
        if not cfg.enabled:
            return
        window_end_ms = (window + 1) * window_ms
        last = self.last_share_ms.get(tenant, -1)
        issued = self.tick_ms if last < 0 else last - last % TICK_MS + TICK_MS
        issued = min(issued, self.tick_ms, window_end_ms)
        since = -1
        if cfg.lead_in_ms:
            first = window
            while (tenant, first - 1) in self.fired:
                first -= 1
            since = max(0, (first + 1) * window_ms - cfg.lead_in_ms)
        self._waves_due.append((issued, rule, tenant, count, since))

    def _publish_wave(self, tenant: str, rule: str, count: int, issued: int, since: int) -> None:
        """The wave challenge record: issued at ``issued``, held ``wave.hold_ms``; its
        ``window_ms`` reaches back to ``since`` (-1: no session review).

        Both tiers publish on the tenant's one key, and a record replaces the one before:
        while that one is in force, the new one reaches back to the earlier of both
        lead-ins (rule 8's minute firing inside the slow tier's wave keeps its 5 minutes).
        Called in issue order (``advance``), so the stream, whose tick may jump seconds,
        reaches back exactly as a replay does."""
        cfg = self.policy.for_tenant(tenant).wave
        expires = issued + cfg.hold_ms
        lead_in_ms = max(0, issued - since) if since >= 0 and cfg.lead_in_ms else 0
        before = self.waves.get(tenant)
        if (
            cfg.lead_in_ms
            and before is not None
            and before[1] > issued
            and 0 <= before[0] < issued - lead_in_ms
        ):
            lead_in_ms = issued - before[0]
        self.waves[tenant] = [issued - lead_in_ms if lead_in_ms else -1, expires]
        wire_key = format_key(("tenant", tenant, None, None, None))
        version = self.policy.policy_version
        value = decision_value(
            stable_id(wire_key, issued, expires, version)
            if rule == "spray_tenant"
            else stable_id(wire_key, issued, expires, version, rule),
            wire_key,
            "tenant",
            "challenge" if cfg.mode == "enforce" else "observe",
            rule,
            tenant,
            None,
            None,
            None,
            count,
            0,
            lead_in_ms,
            issued,
            expires,
            version,
            challenge="captcha",
        )
        self.decisions.append((wire_key, build_decision(value)))

    def _stuffing(self, tenant: str, window: int) -> Alert | None:
        cfg = self.policy.for_tenant(tenant).stuffing
        total = self.stuffing.evaluate(
            tenant, window, cfg.tenant_min_unknown, cfg.tenant_factor, cfg.tenant_baseline_windows
        )
        if not total:
            return None
        start = window * cfg.tenant_window_ms
        alert = build_alert(
            "stuffing_tenant",
            tenant,
            None,
            None,
            total,
            total,
            start,
            start + cfg.tenant_window_ms,
            self.policy.policy_version,
        )
        # A window fires again when its total doubles: each firing has its own id.
        alert_id = stable_id(alert.alert_id, total)
        return alert.model_copy(update={"alert_id": alert_id})

    def _new_window(self, tenant: str, window: int, cfg: TenantSprayConfig) -> float:
        # The baseline is a low quantile of the windows seen (at most ``baseline_windows``
        # since the tenant's first), those that fired left out, not their mean: a wave, or
        # a spray from too few sources to fire, raises the mean while it lasts, and the
        # next wave (or the same one's later windows) would hide under it. Leaving the
        # fired windows out keeps a paced spray of an hour firing in a tenant whose norm
        # is a few failures; a lasting change of the norm is a wave for at most
        # ``baseline_windows``: once only fired windows are left, those people redeemed
        # are the sample (an attack's are not, however long it lasts). A
        # quantile of raw counts is a function of the counts alone, and ``fired`` is in
        # the changelog, so a restored rollup computes the same.
        seen = min(cfg.baseline_windows, window - self.first_window.get(tenant, window))
        accounts, fired = self.accounts, self.fired
        slots = [(tenant, w) for w in range(window - seen, window)]
        sample = sorted(accounts.get(slot, 0) for slot in slots if slot not in fired)
        if not sample:
            # Nothing but waves: a wave longer than the horizon stays a wave. Of the fired
            # windows, only those whose strangers a sign-in mostly redeemed are a norm (a
            # true change of it: more people, who mistype and then sign in); none left:
            # baseline 0, the floors (``StrangersTier.people_like``).
            # Settled windows only: their redemptions are all in (a sign-in redeems within
            # redeem_ms), so the sample is the same whenever it is taken, live, restored
            # from the changelog, or replayed.
            people = self.tier.people_like(tenant)
            redeem_ms = self.policy.for_tenant(tenant).strangers.redeem_ms
            settled = window - 1 - -(-redeem_ms // cfg.window_ms)
            sample = sorted(
                accounts.get(slot, 0) for slot in slots if slot[1] <= settled and people(slot[1])
            )
        last = len(sample) - 1
        baseline = float(sample[int(cfg.baseline_quantile * last)]) if sample else 0.0
        self.baselines[(tenant, window)] = baseline
        # The paced check's own quantile (the median): its sum of ``slow_windows`` windows
        # is near ``slow_windows`` times the mean, which twice a low quantile of single
        # windows does not clear once windows hold a few accounts each (a busy tenant, or
        # any tenant cold, where every place is new).
        self.slow_baselines[(tenant, window)] = (
            float(sample[int(cfg.slow_quantile * last)]) if sample else 0.0
        )
        # Forget windows older than the baseline needs (bounded memory).
        horizon = window - cfg.baseline_windows - 2
        for table in (self.accounts, self.sources, self.baselines, self.slow_baselines):
            for slot in [s for s in table if s[0] == tenant and s[1] < horizon]:
                del table[slot]
        for share_key in [k for k in self.shares if k[1] == tenant and k[2] < horizon]:
            del self.shares[share_key]
            if share_key[0] not in SLOW_SHARES:  # the tier's go with its windows
                self.forgotten_shares.append(share_key)
        # (rule 8's fired windows are forgotten for good, their records too, once the
        # slow tier, which looks further back, forgets them: forget_rule8)
        self.fired = {s for s in self.fired if s[0] != tenant or s[1] >= horizon}
        self.tier.forget_rule8(tenant, window)
        return baseline
