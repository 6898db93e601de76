"""Credential stuffing's signals: a source's alert, and the wave across sources.

Credential stuffing replays leaked (account, password) pairs from many proxies; most of
the accounts do not exist here, so the login service answers ``unknown_account``. Whether
an account exists must never change what a client sees (an existence oracle: fail once
on X, once on a surely absent identifier, and watch the third attempt), so these counts
feed only what reaches operators (``credential_stuffing``, per source) and the tenant's
wave (``stuffing_tenant``, summed over every source, which challenges every untrusted
stranger of the tenant alike). A proxy used once looks exactly like a typo; the wave is
what shows, within seconds, across proxies.

Pure functions of counts: the engine keeps the counts (``SourceState``).
"""

from __future__ import annotations

from pipeline.core.outbox import UNKNOWN_SHARE


def stuffing_alert_due(
    failures: int, unknown: int, min_attempts: int, unknown_ratio: float
) -> bool:
    """Whether the ``credential_stuffing`` alert is due: enough failures, mostly unknown."""
    return failures >= min_attempts and unknown >= unknown_ratio * failures


REFIRED = -1
"""``TenantStuffing.fired`` of a window that fired twice (the most it fires)."""


class TenantStuffing:
    """The wave across sources: sums the source shards' shares of distinct unknown
    accounts per (tenant, tumbling window) and says when a window crosses
    ``max(min_unknown, factor * baseline)`` (the baseline is the mean of the previous
    ``baseline_windows`` windows, a window that fired counting at its own baseline),
    and once more if the window's total then doubles: a wave that starts inside a window
    another one (a spray) already fired in is still reported within seconds. At most
    two alerts per window.

    Shares are absolute (each shard's latest count for the window), so a replayed or
    duplicated share changes nothing; the sum is exact because sources, and so the
    (account, source) pairs counted, are disjoint across shards. Memory is bounded:
    windows older than the baseline needs are forgotten.
    """

    def __init__(
        self,
        forgotten_shares: list[tuple[str, str, int, int]] | None = None,
        forgotten_fired: list[tuple[str, str, int]] | None = None,
    ) -> None:
        self.forgotten_shares: list[tuple[str, str, int, int]] = (
            [] if forgotten_shares is None else forgotten_shares
        )
        """``(UNKNOWN_SHARE, tenant, window, part)`` of the shares forgotten (the rollup's
        list, ``TenantRollup.forgotten_shares``)."""
        self.forgotten_fired: list[tuple[str, str, int]] = (
            [] if forgotten_fired is None else forgotten_fired
        )
        """``(UNKNOWN_SHARE, tenant, window)`` of the fired windows forgotten."""
        self.shares: dict[tuple[str, int, int], int] = {}
        self.totals: dict[tuple[str, int], int] = {}
        self.baselines: dict[tuple[str, int], float] = {}
        self.fired: dict[tuple[str, int], int] = {}
        """The total at a window's first firing; ``REFIRED`` once it fired again."""

    def record(self, tenant: str, window: int, part: int, share: int) -> bool:
        """Record a shard's share; True when the window's total moved (evaluate it)."""
        share_key = (tenant, window, part)
        old = self.shares.get(share_key, 0)
        if share <= old:
            return False
        self.shares[share_key] = share
        slot = (tenant, window)
        self.totals[slot] = self.totals.get(slot, 0) + share - old
        return True

    def evaluate(
        self, tenant: str, window: int, min_unknown: int, factor: float, baseline_windows: int
    ) -> int:
        """The window's total when it fires now, else 0 (called at second boundaries of
        event time, like rule 8, so the answer does not depend on how shares were cut)."""
        slot = (tenant, window)
        total = self.totals.get(slot, 0)
        first = self.fired.get(slot, 0)
        if first == REFIRED or (first and total < 2 * first):
            return 0
        baseline = self.baselines.get(slot)
        if baseline is None:
            baseline = self._new_window(tenant, window, baseline_windows)
        if total < max(min_unknown, factor * baseline):
            return 0
        self.fired[slot] = REFIRED if first else total
        return total

    def _new_window(self, tenant: str, window: int, baseline_windows: int) -> float:
        # A window that fired is a wave, not the norm: it counts at its own baseline, so
        # one wave (or a spray next to it) does not hide the next.
        baselines, fired, totals = self.baselines, self.fired, self.totals
        previous = [
            baselines.get(slot, 0.0) if slot in fired else totals.get(slot, 0)
            for slot in ((tenant, w) for w in range(window - baseline_windows, window))
        ]
        baseline = sum(previous) / baseline_windows
        self.baselines[(tenant, window)] = baseline
        horizon = window - baseline_windows - 2
        for table in (self.totals, self.baselines):
            for slot in [s for s in table if s[0] == tenant and s[1] < horizon]:
                del table[slot]
        for share_key in [k for k in self.shares if k[0] == tenant and k[1] < horizon]:
            del self.shares[share_key]
            self.forgotten_shares.append((UNKNOWN_SHARE, tenant, share_key[1], share_key[2]))
        dropped = sorted(w for t, w in self.fired if t == tenant and w < horizon)
        if dropped:
            self.forgotten_fired.extend((UNKNOWN_SHARE, tenant, w) for w in dropped)
            self.fired = {s: v for s, v in self.fired.items() if s[0] != tenant or s[1] >= horizon}
        return baseline
