"""One tenant's policy compiled for the hot path: its counter rules with their bounded
tables, the source and streak tables, and the numbers the rules read per event (plain
attributes: cheaper than going through the policy models each event).

Entries a table drops (expired or evicted by the cap) are recorded in the shard's
``dirty`` record when it tracks changes, so the changelog deletes them too and a restore
never brings an evicted entry back.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeAlias

from pipeline.core.keys import Key
from pipeline.core.lockout import FOREVER_MS, StreakState, holds
from pipeline.core.normalise import parse_address
from pipeline.core.policy import TenantPolicy
from pipeline.core.policy_rules import RuleConfig
from pipeline.core.state import KeyState, PairState, SourceState
from pipeline.core.table import BoundedTable
from pipeline.core.window import WindowSpec

COUNTER_RULES = ("account_source", "account", "device", "uia", "mfa")

Dirty = dict[tuple[str, Key], None]
"""(table name, key) of every entry changed since the changelog was last flushed. A dict,
not a set: its order is the order of first change, so the changelog (and a restore from
it) does not depend on string hash randomisation."""

AnyTable: TypeAlias = "BoundedTable[KeyState] | BoundedTable[SourceState] | BoundedTable[PairState] | BoundedTable[StreakState]"


def _factory(ring_size: int) -> Callable[[], KeyState]:
    return partial(KeyState, ring_size)  # a C-level call: no extra frame per new key


def _marker(dirty: Dirty | None, name: str) -> Callable[[Key, Any], None] | None:
    """The drop hook of a table: records dropped keys in ``dirty``. None (no call per
    eviction) when the shard does not track changes."""
    if dirty is None:
        return None

    def mark(key: Key, _entry: Any) -> None:
        dirty[(name, key)] = None

    return mark


class CounterRule:
    """One counter rule of one tenant: its table and the numbers the hot path reads."""

    __slots__ = ("cfg", "entries", "factory", "name", "ring_size", "sub_ms", "table", "threshold")

    def __init__(
        self, name: str, cfg: RuleConfig, spec: WindowSpec, table: BoundedTable[KeyState]
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.threshold = cfg.threshold
        self.sub_ms = spec.sub_ms
        self.ring_size = spec.ring_size
        self.table = table
        self.entries = table.mapping
        self.factory = _factory(spec.ring_size)


class TenantRules:
    """One tenant's compiled rules and bounded tables (built once per tenant and shard).
    ``dirty`` is the shard's change record, or None when it does not track changes."""

    def __init__(self, policy: TenantPolicy, dirty: Dirty | None) -> None:
        self.policy = policy
        self.specs = {
            rule: WindowSpec(getattr(policy, rule).window_ms, policy.sub_buckets)
            for rule in (*COUNTER_RULES, "source")
        }
        self.stuffing_spec = WindowSpec(policy.stuffing.window_ms, policy.sub_buckets)
        self.cfg: dict[str, RuleConfig] = {
            rule: getattr(policy, rule) for rule in (*COUNTER_RULES, "source")
        }
        self.counters: dict[str, BoundedTable[KeyState]] = {
            rule: BoundedTable(policy.entry_cap, _marker(dirty, rule)) for rule in COUNTER_RULES
        }
        self.rules = {
            rule: CounterRule(rule, self.cfg[rule], self.specs[rule], self.counters[rule])
            for rule in COUNTER_RULES
        }
        self.acct = self.rules["account"]
        self.pair_rule = self.rules["account_source"]
        self.device = self.rules["device"]
        self.uia = self.rules["uia"]
        self.mfa = self.rules["mfa"]
        self.sources: BoundedTable[SourceState] = BoundedTable(
            policy.entry_cap, _marker(dirty, "sources")
        )
        self.pairs: BoundedTable[PairState] = BoundedTable(
            policy.entry_cap, _marker(dirty, "pairs")
        )
        # Consecutive-failure records (seed 002's lock, seed 004's mfa curve): no decay,
        # bounded by the cap, which passes over entries holding a decision and records
        # what it evicts, so the shard tombstones an evicted entry's decision.
        self.streaks: BoundedTable[StreakState] = BoundedTable(
            policy.entry_cap, _marker(dirty, "streaks"), record_evicted=True, pinned=holds
        )
        # The holds published for ``lifetime.publish_ms`` and renewed: (renew at, key),
        # a heap (``pipeline.core.streaks.renew_holds``); not in the changelog: rebuilt
        # from the streaks table at the first renewal check (``renewals_ready``).
        self.renewals: list[tuple[int, Key]] = []
        self.renewals_ready = False
        # Familiar (account, source) pairs: a table of their own, so successes can never
        # evict a lock's count (an attacker's own account signs in from every proxy).
        # Its entries stand for published exempts: the shard lifts what the cap evicts.
        self.familiar: BoundedTable[StreakState] = BoundedTable(
            policy.familiar.entry_cap, _marker(dirty, "familiar"), record_evicted=True
        )
        # Per account, the new familiar places and clients of the current UTC day (its
        # ``count``; ``keep_until_ms`` is the day's end): ``familiar.new_per_day``.
        self.familiar_new: BoundedTable[StreakState] = BoundedTable(
            policy.familiar.entry_cap, _marker(dirty, "familiar_new")
        )
        self.max_span_ms = max(spec.span_ms for spec in self.specs.values())
        self.tenant_window_ms = policy.tenant_spray.window_ms
        self.wave_counts_familiar = policy.tenant_spray.count_familiar
        self.recount_windows = -(-policy.tenant_spray.recount_ms // self.tenant_window_ms)
        self.shares_bound = 4 * policy.tenant_spray.baseline_windows + 64
        self._compile_streaks(policy)
        self._compile_sources(policy)

    def _compile_streaks(self, policy: TenantPolicy) -> None:
        """The account shard's consecutive-failure rules; their decisions' configs have
        window 0 (no window)."""
        lockout, lifetime, curve = policy.lockout, policy.lifetime, policy.mfa_curve
        self.streak_cfg: dict[str, RuleConfig] = {
            "lockout": RuleConfig.model_construct(
                threshold=lockout.threshold, window_ms=0, mode=lockout.mode
            ),
            "lifetime_bound": RuleConfig.model_construct(
                threshold=lifetime.threshold, window_ms=0, mode=lifetime.mode
            ),
            "mfa_curve": RuleConfig.model_construct(threshold=1, window_ms=0, mode=curve.mode),
            "mfa_bound": RuleConfig.model_construct(
                threshold=policy.mfa_account.threshold, window_ms=0, mode=policy.mfa_account.mode
            ),
            "device_bound": RuleConfig.model_construct(
                threshold=policy.trusted_devices_per_account,
                window_ms=policy.device.window_ms,
                mode=policy.device.mode,
            ),
        }
        self.trusted_devices_per_account = policy.trusted_devices_per_account
        self.mfa_bound_threshold = policy.mfa_account.threshold
        familiar = policy.familiar
        self.familiar_on = familiar.enabled
        self.familiar_memory_ms = familiar.memory_ms
        self.familiar_renew_ms = familiar.renew_ms
        self.familiar_after_reset_ms = familiar.after_reset_ms if familiar.enabled else 0
        self.familiar_new_per_day = familiar.new_per_day
        self.captcha_pass_ms = policy.wave.captcha_pass_ms if familiar.enabled else 0
        self.familiar_cfg = RuleConfig.model_construct(
            threshold=familiar.shared_accounts, window_ms=familiar.memory_ms, mode="enforce"
        )
        # A hold's end (``FOREVER_MS``: until a success) and how long it is published for.
        self.lifetime_block_ms = lifetime.block_ms or FOREVER_MS
        self.hold_publish_ms = lifetime.publish_ms
        self.in_flight_max = policy.lockout.in_flight_max
        self.lifetime_memory_ms = lifetime.memory_ms or FOREVER_MS
        self.lifetime_threshold = lifetime.threshold
        self.mfa_curve = curve.enabled
        self.notice_window_ms = policy.notice.window_ms if policy.notice.enabled else 0
        self.streak_memory_ms = policy.streak_memory_ms

    def _compile_sources(self, policy: TenantPolicy) -> None:
        """The source shard's spray and credential-stuffing numbers."""
        spray, stuffing = self.specs["source"], self.stuffing_spec
        failures = policy.challenge_failures
        challenge = WindowSpec(failures.window_ms, policy.sub_buckets)
        self.challenge_sub_ms = challenge.sub_ms
        self.challenge_ring_size = challenge.ring_size
        self.spray_sub_ms = spray.sub_ms
        self.spray_ring_size = spray.ring_size
        self.stuffing_sub_ms = stuffing.sub_ms
        self.source_factory = lambda: SourceState(
            spray.ring_size, stuffing.ring_size, challenge.ring_size
        )
        self.spray_threshold = policy.source.threshold
        stuffing_cfg = policy.stuffing
        self.stuffing_min = stuffing_cfg.min_attempts
        self.stuffing_ratio = stuffing_cfg.unknown_ratio
        self.stuffing_tenant_window_ms = stuffing_cfg.tenant_window_ms
        self.unknown_shares_bound = 4 * stuffing_cfg.tenant_baseline_windows + 64
        self.challenge_rule = RuleConfig(
            threshold=failures.threshold, window_ms=failures.window_ms, mode=failures.mode
        )
        self.challenge_block_ms = failures.block_ms
        self.shared_accounts = policy.familiar.shared_accounts
        self.renew_ms = policy.familiar.renew_ms
        strangers = policy.strangers
        self.strangers_on = strangers.enabled
        self.strangers_redeem_ms = strangers.redeem_ms
        self.allowlist = policy.allowlist_set if policy.allowlist else None
        self._allowed: dict[str, bool] = {}

    def tables(self) -> list[AnyTable]:
        return [
            *self.counters.values(),
            self.sources,
            self.pairs,
            self.streaks,
            self.familiar,
            self.familiar_new,
        ]

    def allowlisted(self, source: str) -> bool:
        """Whether the source is in the allowlist; cached, because parsing the address
        costs more than the rest of the source stage. The cache is cleared when it grows
        past 65,536 sources, so an attacker's distinct addresses cannot grow it."""
        cached = self._allowed.get(source)
        if cached is None:
            address = parse_address(source.partition("/")[0])
            allowlist = self.allowlist
            cached = address is not None and allowlist is not None and address in allowlist
            if len(self._allowed) >= 65_536:
                self._allowed.clear()
            self._allowed[source] = cached
        return cached
