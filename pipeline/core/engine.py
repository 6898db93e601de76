"""The policy engine: every rule in one process (replay, backtest, tests), the reference
the stream must agree with.

The work is split the way the stream partitions it, so one worker, many workers and a
single-process replay all run the same code:

* ``AccountShard`` (``pipeline.core.account``, with ``pipeline.core.streaks``) sees every
  attempt of its accounts and forwards untrusted password attempts to the source shard;
* ``SourceShard`` (``pipeline.core.source``) sees those partitioned by source;
* ``TenantRollup`` (``pipeline.core.rollup``) sums the shards' tenant shares.

Windows use event time (``occurred_ms``); ``now_ms`` is the watermark (the newest event
time seen) and decides expiry and lateness, so replaying the same events always gives
byte-identical decisions. Nothing here reads the clock or performs I/O. Every table is
bounded by its tenant's ``entry_cap``; what an entry costs is measured by
``bench/bench_core.py`` (bench/README.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.core.account import AccountShard
from pipeline.core.attempt import Attempt
from pipeline.core.decisions import Verdict, index_wave
from pipeline.core.outbox import (
    ACCOUNT_SHARE,
    REDEEMED_SHARE,
    SOURCE_SHARE,
    STRANGER_SHARE,
    UNKNOWN_SHARE,
    Outbox,
    Shares,
)
from pipeline.core.policy import DEFAULT_POLICY, Policy
from pipeline.core.rollup import FINAL_MS, TICK_MS, TenantRollup
from pipeline.core.source import SourceShard


class Engine:
    """All rules in one process.

    ``step`` applies one attempt with ``now_ms`` as the watermark; ``step_batch`` and
    ``run`` replay a sequence, advancing the watermark to each attempt's time. Both
    stages share one decision index, so source decisions apply to verdicts too. The
    shards' change tracking is off: nothing here flushes a changelog.
    """

    def __init__(self, policy: Policy = DEFAULT_POLICY) -> None:
        self.policy = policy
        self.accounts = AccountShard(policy)
        self.sources = SourceShard(policy, dedupe_horizon_ms=0)
        self.sources.index = self.accounts.index
        self.accounts.track_changes = self.sources.track_changes = False
        self.rollup = TenantRollup(policy)
        self.out = Outbox()
        self._next_advance_ms = 0

    def step(self, attempt: Attempt, now_ms: int) -> Verdict | None:
        out = self.out
        if now_ms >= self._next_advance_ms:
            self.advance(now_ms)
        verdict = self.accounts.step(attempt, now_ms, out)
        if out.tenant_shares:
            self._record(out.tenant_shares, ACCOUNT_SHARE, attempt.occurred_ms)
        if out.forwards:
            self._forward(now_ms, attempt.occurred_ms)
        return verdict

    def advance(self, now_ms: int) -> None:
        """Move the watermark of every part: expiry and tombstones, and rule 8's
        evaluation at the second boundary (``TenantRollup.advance``). Runs once per
        watermark second: enforcement itself is exact (the check compares expires_ms),
        only tombstones may trail by up to a second."""
        self.out.alerts.extend(self.rollup.advance(now_ms))
        self._waves()
        self.accounts.advance(now_ms, self.out)
        self.sources.advance(now_ms, self.out)
        self._next_advance_ms = now_ms - now_ms % TICK_MS + TICK_MS

    def finish(self) -> None:
        """The end of a replay: evaluate rule 8 on everything recorded (what the stream
        does once its watermark passes the last event, e.g. when its input goes idle)."""
        self.out.alerts.extend(self.rollup.advance(FINAL_MS))
        self._waves()

    def _waves(self) -> None:
        """Publish the rollup's wave challenges and index them (shared by both shards'
        checks, like the gateway's view)."""
        rollup = self.rollup
        rollup.newly_fired.clear()  # only the stream's changelog records them
        rollup.tier.newly_slow_fired.clear()
        rollup.tier.newly_quick_fired.clear()
        rollup.tier.newly_quick_sums.clear()
        rollup.forgotten_shares.clear()
        rollup.forgotten_fired.clear()
        if rollup.decisions:
            index_wave(self.accounts.index, rollup.decisions)
            self.out.decisions.extend(rollup.decisions)
            rollup.decisions.clear()

    def _record(self, shares: Shares, kind: str, time_ms: int) -> None:
        """Hand the shares a step changed to the rollup (this process's only shard: 0);
        ``time_ms`` is the attempt's event time."""
        for (tenant, window), share in shares.items():
            self.rollup.update(tenant, window, kind, 0, share, time_ms)
        shares.clear()

    def _forward(self, now_ms: int, time_ms: int) -> None:
        out = self.out
        step = self.sources.step
        for forwarded in out.forwards:
            step(forwarded, now_ms, out)
        out.forwards.clear()
        if out.tenant_shares:
            self._record(out.tenant_shares, SOURCE_SHARE, time_ms)
        if out.unknown_shares:
            self._record(out.unknown_shares, UNKNOWN_SHARE, time_ms)
        if out.stranger_shares:
            self._record(out.stranger_shares, STRANGER_SHARE, time_ms)
        if out.redeemed_shares:
            self._record(out.redeemed_shares, REDEEMED_SHARE, time_ms)

    def step_batch(self, attempts: Iterable[Attempt]) -> list[Verdict | None]:
        """``step`` each attempt with its own time as the watermark (a monotone max)."""
        verdicts: list[Verdict | None] = []
        now = self.accounts.watermark_ms
        for attempt in attempts:
            if attempt.occurred_ms > now:
                now = attempt.occurred_ms
            verdicts.append(self.step(attempt, now))
        return verdicts

    def run(self, attempts: Iterable[Attempt]) -> Outbox:
        """Replay attempts to their end (``finish``); returns everything produced (the
        engine's outbox). The order that reproduces the stream is ``replay_order``."""
        self.step_batch(attempts)
        self.finish()
        return self.out


def replay_order(attempt: Attempt) -> tuple[int, str]:
    """The order every stage applies events in (``pipeline.core.sequence``): event time,
    then event id. A replay sorted by it reproduces the stream's decisions and alerts."""
    return (attempt.occurred_ms, attempt.event_id)
