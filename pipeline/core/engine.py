"""The policy engine: ``step(state, attempt, now_ms) -> (state, decisions, alerts)``.

The work is split the way the stream partitions it, so one worker, many workers and a
single-process replay all run the same code:

* ``AccountShard`` sees every attempt of its accounts (partitioned by account digest):
  rules 1-4 and mfa, escalation (6), the lifetime bound (7), seed 002's consecutive
  lock and seed 004's mfa curve (``lockout``), the owner's notices, the ceiling alert, and its
  share of the tenant-wide count of distinct failing accounts (exact when summed,
  because accounts are disjoint across shards). It forwards untrusted password
  failures and successes to the source stage (a source's real users, and redemptions:
  typo then success from the same source).
* ``SourceShard`` sees those partitioned by source: the spray signal (5), the
  credential-stuffing block (``pipeline.core.stuffing``) and alert, and its share of
  distinct failing sources per tenant.
* ``TenantRollup`` sums the shares and raises ``spray_tenant`` (8).
* ``Engine`` wires the three together in one process (replay, backtest, tests).

Windows use event time (``occurred_ms``); ``now_ms`` is the watermark (the newest event
time seen) and decides expiry and lateness, so replaying the same events always gives
byte-identical decisions. Nothing here reads the clock or performs I/O.

State and cost: a tracked key is one table entry, about 350 bytes on average (412 not
compiled with mypyc) measured by ``bench/bench_core.py`` (a KeyState, its key tuple and ordered table slot, and a
16-bucket list only once it has counts in two buckets; digests are shared by a key's
entries), so a table at its default cap of 100,000 holds roughly 35-41 MB. An entry past
its ``keep_until_ms`` is dead whether or not
``expire`` has popped it yet, so what the tables hold never changes a decision, only
memory. The hot path is a handful of dict lookups per attempt; what it costs per event
is printed by the benchmark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pipeline.contracts.models import AccountNotice, Alert, Decision, ms_to_datetime
from pipeline.core.attempt import PASSWORD_FLOWS, Attempt
from pipeline.core.decisions import (
    ALLOWED,
    Active,
    DecisionIndex,
    Verdict,
    keys_for,
    lock_key,
    mfa_key,
    uia_device_key,
    uia_key,
)
from pipeline.core.dedupe import Deduper
from pipeline.core.keys import Key, format_key, stable_id
from pipeline.core.lockout import FOREVER_MS, StreakState, lock_ms, wait_ms
from pipeline.core.normalise import parse_address
from pipeline.core.policy import (
    DEFAULT_POLICY,
    Policy,
    RuleConfig,
    TenantPolicy,
    TenantSprayConfig,
)
from pipeline.core.state import KeyState, PairState, SourceState
from pipeline.core.stuffing import TenantStuffing, is_stuffing, stuffing_alert_due
from pipeline.core.table import BoundedTable
from pipeline.core.window import WindowSpec

APPLIES_TO = {
    "account_source": "untrusted",
    "account": "untrusted",
    "device": "device",
    "uia": "uia",
    "mfa": "mfa",
    "source": "all",
    "lock": "untrusted",
}
COUNTER_RULES = ("account_source", "account", "device", "uia", "mfa")


@dataclass
class Outbox:
    """What a step produced, in order. ``decisions`` holds ``(key, Decision | None)``;
    None is a tombstone (the decision was lifted early or expired)."""

    decisions: list[tuple[str, Decision | None]] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    forwards: list[Attempt] = field(default_factory=list)
    partials: dict[tuple[str, int], int] = field(default_factory=dict)
    notices: list[AccountNotice] = field(default_factory=list)
    unknown_partials: dict[tuple[str, int], int] = field(default_factory=dict)
    """The source stage's shares of distinct unknown accounts (``stuffing_tenant``)."""

    def clear(self) -> None:
        self.notices.clear()
        self.decisions.clear()
        self.alerts.clear()
        self.forwards.clear()
        self.partials.clear()
        self.unknown_partials.clear()


@dataclass
class Metrics:
    """Counters a shell exports: what the core did and where its bounds bit."""

    counted: int = 0
    duplicates: int = 0
    late: int = 0
    decisions: int = 0
    lifts: int = 0
    alerts: int = 0


def _alert(
    kind: str, tenant: str, source: str | None, account: str | None,
    count: int, distinct: int, start_ms: int, end_ms: int, version: str,
) -> Alert:  # fmt: skip
    return Alert(
        alert_id=stable_id(kind, tenant, source or "-", account or "-", start_ms, version),
        type=kind,
        tenant=tenant,
        source=source,
        account_digest=account,
        count=count,
        distinct_accounts=distinct,
        window_start=ms_to_datetime(start_ms),
        window_end=ms_to_datetime(end_ms),
        policy_version=version,
    )


def _factory(ring_size: int) -> Callable[[], KeyState]:
    return partial(KeyState, ring_size)  # a C-level call: no extra frame per new key


class _Rule:
    """One counter rule of one tenant, compiled once: its table and the numbers the hot
    path reads (plain slots: cheaper than going through the policy models each event)."""

    __slots__ = ("cfg", "entries", "factory", "name", "ring_size", "sub_ms", "table", "threshold")

    def __init__(self, name: str, cfg: RuleConfig, spec: WindowSpec, table: BoundedTable[KeyState]) -> None:
        self.name = name
        self.cfg = cfg
        self.threshold = cfg.threshold
        self.sub_ms = spec.sub_ms
        self.ring_size = spec.ring_size
        self.table = table
        self.entries = table.mapping
        self.factory = _factory(spec.ring_size)


class _TenantTables:
    """One tenant's compiled rules and bounded tables (built once per tenant).

    Entries a table drops (expired or evicted by the cap) are marked dirty in the shard,
    so the changelog deletes them too and a restore never brings an evicted entry back.
    """

    def __init__(self, policy: TenantPolicy, shard: _Shard) -> None:
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
            rule: BoundedTable(policy.entry_cap, _marker(shard, rule)) for rule in COUNTER_RULES
        }
        self.rules = {
            rule: _Rule(rule, self.cfg[rule], self.specs[rule], self.counters[rule])
            for rule in COUNTER_RULES
        }
        self.acct = self.rules["account"]
        self.pair_rule = self.rules["account_source"]
        self.device = self.rules["device"]
        self.uia = self.rules["uia"]
        self.mfa = self.rules["mfa"]
        self.sources: BoundedTable[SourceState] = BoundedTable(
            policy.entry_cap, _marker(shard, "sources")
        )
        self.pairs: BoundedTable[PairState] = BoundedTable(policy.entry_cap, _marker(shard, "pairs"))
        # Consecutive-failure records (seed 002's lock, seed 004's mfa curve): no decay,
        # bounded by the cap. Their decisions' configs (window 0: no window).
        self.streaks: BoundedTable[StreakState] = BoundedTable(policy.entry_cap, _marker(shard, "streaks"))
        lockout, lifetime, curve = policy.lockout, policy.lifetime, policy.mfa_curve
        self.streak_cfg: dict[str, RuleConfig] = {
            "lockout": RuleConfig.model_construct(threshold=lockout.threshold, window_ms=0, mode=lockout.mode),
            "lifetime_bound": RuleConfig.model_construct(threshold=lifetime.threshold, window_ms=0, mode=lifetime.mode),
            "mfa_curve": RuleConfig.model_construct(threshold=1, window_ms=0, mode=curve.mode),
        }
        self.lifetime_block_ms = lifetime.block_ms
        self.lifetime_memory_ms = lifetime.memory_ms or FOREVER_MS
        self.mfa_curve = curve.enabled
        self.notice_window_ms = policy.notice.window_ms if policy.notice.enabled else 0
        self.max_span_ms = max(spec.span_ms for spec in self.specs.values())
        # Numbers of the rarer paths, read once here rather than through the models.
        self.streak_memory_ms = policy.streak_memory_ms
        self.lifetime_threshold = policy.lifetime.threshold
        self.tenant_window_ms = policy.tenant_spray.window_ms
        self.partials_bound = 4 * policy.tenant_spray.baseline_windows + 64
        spray, stuffing = self.specs["source"], self.stuffing_spec
        self.spray_sub_ms = spray.sub_ms
        self.spray_ring_size = spray.ring_size
        self.stuffing_sub_ms = stuffing.sub_ms
        self.source_factory = lambda: SourceState(spray.ring_size, stuffing.ring_size)
        self.spray_threshold = policy.source.threshold
        self.stuffing_min = policy.stuffing.min_attempts
        self.stuffing_block_min = policy.stuffing.block_min_unknown
        self.stuffing_block_more = policy.stuffing.block_more_unknown
        self.stuffing_lower_ratio = policy.stuffing.block_lower_ratio
        self.stuffing_success_factor = policy.stuffing.success_factor
        self.stuffing_ring_size = self.stuffing_spec.ring_size
        self.stuffing_ratio = policy.stuffing.unknown_ratio
        self.stuffing_window_ms = policy.stuffing.window_ms
        self.stuffing_tenant_window_ms = policy.stuffing.tenant_window_ms
        self.unknown_partials_bound = 4 * policy.stuffing.tenant_baseline_windows + 64
        stuffing_cfg = policy.stuffing
        self.stuffing_rule = RuleConfig(
            threshold=stuffing_cfg.block_min_unknown, window_ms=stuffing_cfg.window_ms,
            mode=stuffing_cfg.mode,
        )  # fmt: skip
        self.allowlist = policy.allowlist_set if policy.allowlist else None
        self._allowed: dict[str, bool] = {}

    def tables(
        self,
    ) -> list[BoundedTable[KeyState] | BoundedTable[SourceState] | BoundedTable[PairState] | BoundedTable[StreakState]]:
        return [*self.counters.values(), self.sources, self.pairs, self.streaks]

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


def _marker(shard: _Shard, name: str) -> Callable[[Key, Any], None] | None:
    """The drop hook of a table: marks dropped keys dirty. None (no call per eviction)
    when the shard does not track changes; set ``track_changes`` before the first step."""
    if not shard.track_changes:
        return None

    def mark(key: Key, _entry: Any) -> None:
        shard.dirty[(name, key)] = None

    return mark


class _Shard:
    """What both shards share: policy, tables per tenant, the decision index, dedupe."""

    def __init__(self, policy: Policy, dedupe_horizon_ms: int, dedupe_capacity: int) -> None:
        self.policy = policy
        self.version = policy.policy_version
        self.tenants: dict[str, _TenantTables] = {}
        self.index = DecisionIndex()
        # A zero horizon turns dedupe off (the source stage of a single-process Engine is
        # fed only by the already-deduplicated account stage).
        self.dedupe = Deduper(dedupe_horizon_ms, dedupe_capacity) if dedupe_horizon_ms else None
        self.watermark_ms = 0
        self.metrics = Metrics()
        self.tenant_partials: dict[tuple[str, int], int] = {}
        # Keys whose state changed since the last ``take_dirty``: the stream flushes them.
        # A dict, not a set: its order is the order of first change, so the changelog
        # (and a restore from it) does not depend on string hash randomisation. A shard
        # that is never flushed (inside Engine) turns ``track_changes`` off, or the record
        # would grow with every key ever seen.
        self.dirty: dict[tuple[str, Key], None] = {}
        self.track_changes = True

    def tenant(self, tenant: str) -> _TenantTables:
        tables = self.tenants.get(tenant)
        if tables is None:
            tables = _TenantTables(self.policy.for_tenant(tenant), self)
            self.tenants[tenant] = tables
        return tables

    def _issue(
        self, out: Outbox, rule: str, scope: str, key: Key, tenant: str, account: str | None,
        source: str | None, device: str | None, cfg: RuleConfig, count: int,
        issued_ms: int, expires_ms: int,
    ) -> str:  # fmt: skip
        action = "block" if cfg.mode == "enforce" else "observe"
        wire_key = format_key(key)
        decision_id = stable_id(wire_key, issued_ms, expires_ms, self.version)
        decision = Decision(
            decision_id=decision_id,
            key=wire_key,
            tenant=tenant,
            scope=scope,  # type: ignore[arg-type]
            account_digest=account,
            source=source,
            device_id=device,
            applies_to=APPLIES_TO[scope],  # type: ignore[arg-type]
            action=action,  # type: ignore[arg-type]
            rule=rule,
            count=count,
            threshold=cfg.threshold,
            window_ms=cfg.window_ms,
            issued_at=ms_to_datetime(issued_ms),
            expires_at=ms_to_datetime(expires_ms),
            policy_version=self.version,
        )
        self.index.put(key, Active(decision_id, action, expires_ms, rule))
        out.decisions.append((wire_key, decision))
        self.metrics.decisions += 1
        return decision_id

    def _lift(self, out: Outbox, key: Key) -> None:
        if self.index.lift(key) is not None:
            out.decisions.append((format_key(key), None))
            self.metrics.lifts += 1

    def advance(self, now_ms: int, out: Outbox) -> None:
        """Move the watermark: expire table entries and tombstone expired decisions."""
        if now_ms > self.watermark_ms:
            self.watermark_ms = now_ms
        for key in self.index.prune(self.watermark_ms):
            out.decisions.append((format_key(key), None))
            self.metrics.lifts += 1
        for tables in self.tenants.values():
            for table in tables.tables():
                table.expire(self.watermark_ms)  # the tables mark what they drop as dirty

    # -- durable state: the stream writes changed entries to a changelog and restores them

    def _table(self, name: str, tenant: str) -> BoundedTable[Any]:
        tables = self.tenant(tenant)
        if name == "sources":
            return tables.sources
        if name == "pairs":
            return tables.pairs
        if name == "streaks":
            return tables.streaks
        return tables.counters[name]

    def take_dirty(self) -> list[tuple[list[Any], list[Any] | None]]:
        """Changed entries since the last call as ``([table, *key], dump or None)``, plus
        the shard's meta record (watermark, tenant shares). None means deleted."""
        changes: list[tuple[list[Any], list[Any] | None]] = []
        for name, key in self.dirty:
            entry = self._table(name, key[1]).get(key)
            changes.append(([name, *key], entry.dump() if entry is not None else None))
        self.dirty.clear()
        changes.append((["meta"], self.meta()))
        return changes

    def meta(self) -> list[Any]:
        return [self.watermark_ms, [[t, w, v] for (t, w), v in self.tenant_partials.items()]]

    def restore(self, key: list[Any], value: list[Any] | None) -> None:
        """Load one changelog record (the inverse of ``take_dirty``); None deletes."""
        if key == ["meta"]:
            if value is None:
                return
            self.watermark_ms = max(self.watermark_ms, value[0])
            for tenant, window, share in value[1]:
                slot = (tenant, window)
                self.tenant_partials[slot] = max(self.tenant_partials.get(slot, 0), share)
            return
        name, *parts = key
        entry_key: Key = tuple(parts)
        if value is None:
            self._table(name, entry_key[1]).pop(entry_key)
            return
        loader: Any = {"sources": SourceState, "pairs": PairState, "streaks": StreakState}.get(name, KeyState)
        self._table(name, entry_key[1]).put(entry_key, loader.load(value))

    def finish_restore(self, out: Outbox) -> None:
        """After loading: re-index active decisions and expire what the changelog kept
        past its time (restored windows are not expired by the framework). Tables are put
        in deadline order first, so expiry from the front reaches every dead entry."""
        for tables in self.tenants.values():
            for any_table in tables.tables():
                any_table.sort_by_deadline()
            pairs: list[tuple[str, BoundedTable[Any]]] = [
                *tables.counters.items(), ("source", tables.sources)
            ]
            for rule, table in pairs:
                mode = tables.cfg[rule].mode
                for key, entry in table.items():
                    if entry.blocked_until_ms > self.watermark_ms and entry.decision_id:
                        name, rule_mode = rule, mode
                        if rule == "source" and entry.block_rule == "stuffing":
                            name, rule_mode = "stuffing", tables.policy.stuffing.mode
                        action = "block" if rule_mode == "enforce" else "observe"
                        active = Active(entry.decision_id, action, entry.blocked_until_ms, name)
                        self.index.put(key, active)
            for key, streak in tables.streaks.items():
                if streak.blocked_until_ms > self.watermark_ms and streak.decision_id:
                    mode = tables.streak_cfg[streak.rule].mode
                    action = "block" if mode == "enforce" else "observe"
                    self.index.put(key, Active(streak.decision_id, action, streak.blocked_until_ms, streak.rule))
        self.advance(self.watermark_ms, out)

    def evictions(self) -> int:
        return sum(t.evictions for tt in self.tenants.values() for t in tt.tables())

    def entries(self) -> int:
        return sum(len(t) for tt in self.tenants.values() for t in tt.tables())


class AccountShard(_Shard):
    """Rules keyed by account: per (account, source), the ceiling, device, uia, mfa,
    escalation and the lifetime bound. See the module docstring for the split.

    The hot path reads the tables' dicts directly and builds only the keys it needs:
    most attempts are successes of accounts with no state and no decision, which cost a
    dedupe lookup, two subject lookups in the index and two or three dict misses.
    """

    def __init__(
        self, policy: Policy = DEFAULT_POLICY, *, part: int = 0,
        dedupe_horizon_ms: int = 3_600_000, dedupe_capacity: int = 1_000_000,
    ) -> None:  # fmt: skip
        super().__init__(policy, dedupe_horizon_ms, dedupe_capacity)
        self.part = part

    def step(self, a: Attempt, now_ms: int, out: Outbox, seq: int = -1) -> Verdict | None:
        """Apply one attempt. Returns the decision that applied to it (for the audit row),
        or None for a duplicate ``event_id`` (not counted, not audited)."""
        if now_ms > self.watermark_ms:
            self.watermark_ms = now_ms
        dedupe = self.dedupe
        if dedupe is not None and dedupe.seen(a.event_id, self.watermark_ms, a.tenant):
            self.metrics.duplicates += 1
            return None
        index = self.index
        subjects = index.subjects
        # Only an account or source with an active decision can be refused: two string
        # lookups spare building the attempt's keys in the common case.
        if subjects and (a.account in subjects or a.source in subjects):
            verdict = index.check(keys_for(a), a.occurred_ms)
        else:
            verdict = ALLOWED
        t = self.tenants.get(a.tenant) or self.tenant(a.tenant)
        if a.occurred_ms <= self.watermark_ms - t.max_span_ms:
            self.metrics.late += 1
            if not a.success and a.failure_reason != "refused":
                self._late_streak(a, t, out, seq)
            return verdict
        if a.success:
            self._success(a, t, out, seq)
        elif a.failure_reason != "refused":
            self._failure(a, t, out, seq)
            self.metrics.counted += 1
        return verdict

    # -- successes ----------------------------------------------------------------------

    def _success(self, a: Attempt, t: _TenantTables, out: Outbox, seq: int) -> None:
        tenant, account = a.tenant, a.account
        wm = self.watermark_ms
        acct_key: Key = ("account", tenant, account, None, None)
        acct = t.acct.entries.get(acct_key)
        if acct is not None and acct.keep_until_ms > wm and (seq < 0 or acct.seq < seq):
            # Rule 7's streak ends; the ceiling's count and escalation are never cleared.
            acct.streak = 0
            acct.lifetime_alerted = False
            self._mark(t.acct, acct_key, acct, seq)
        # Each success resets its own counter; most find none (a dict miss, no call).
        flow = a.flow
        if flow in PASSWORD_FLOWS:
            if not (a.trusted and a.device):
                out.forwards.append(a)  # the source stage counts the source's real users
            key: Key = ("lock", tenant, account, None, None)
            streak = t.streaks.mapping.get(key)
            if streak is not None and (
                not (a.trusted and a.device) or t.policy.lockout.trusted_success_clears
                or (streak.rule == "lifetime_bound" and streak.blocked_until_ms > wm)
            ):  # fmt: skip
                self._clear_streak(t, key, streak, out, seq)
            key = ("account_source", tenant, account, a.source, None)
            entry = t.pair_rule.entries.get(key)
            if entry is not None and entry.keep_until_ms > wm:
                self._reset(t.pair_rule, key, entry, out, seq)
            if a.trusted and a.device:
                key = ("device", tenant, account, None, a.device)
                entry = t.device.entries.get(key)
                if entry is not None and entry.keep_until_ms > wm:
                    self._reset(t.device, key, entry, out, seq)
            return
        if flow == "uia":
            rule = t.uia
            key = uia_key(tenant, account, a.source, a.session, a.device)
            device_key = uia_device_key(tenant, account, a.session, a.device)
            if device_key is not None:
                entry = rule.entries.get(device_key)
                if entry is not None and entry.keep_until_ms > wm:
                    self._reset(rule, device_key, entry, out, seq)
        else:
            rule = t.mfa
            key = mfa_key(tenant, account, a.source, a.device, a.session)
            streak = t.streaks.mapping.get(key)
            if streak is not None:
                self._clear_streak(t, key, streak, out, seq)
        entry = rule.entries.get(key)
        if entry is not None and entry.keep_until_ms > wm:
            self._reset(rule, key, entry, out, seq)

    def _reset(self, rule: _Rule, key: Key, entry: KeyState, out: Outbox, seq: int) -> None:
        """A success clears its own live counter and escalation, and lifts its decision.
        (An entry past its time is gone even before ``expire`` pops it: never reset.)"""
        if seq >= 0 and entry.seq >= seq:
            return
        entry.clear()
        entry.level = 0
        if entry.blocked_until_ms:
            entry.blocked_until_ms = 0
            self._lift(out, key)
        self._mark(rule, key, entry, seq)

    # -- failures -----------------------------------------------------------------------

    def _failure(self, a: Attempt, t: _TenantTables, out: Outbox, seq: int) -> None:
        tenant, account, flow = a.tenant, a.account, a.flow
        acct_rule = t.acct
        acct_key: Key = ("account", tenant, account, None, None)
        acct = self._touch(acct_rule, acct_key)
        fresh = seq < 0 or acct.seq < seq
        if fresh:
            # Rule 7's streak (inlined; the alert itself is rare).
            acct.streak += 1
            memory = a.occurred_ms + t.lifetime_memory_ms
            if memory > acct.keep_until_ms:
                acct.keep_until_ms = memory
            if acct.streak >= t.lifetime_threshold and not acct.lifetime_alerted:
                self._lifetime_bound(a, acct, out)
        if flow in PASSWORD_FLOWS:
            device = a.device
            if a.trusted and device:
                # Trusted-device failures feed only their device's counter (rule 3).
                key: Key = ("device", tenant, account, None, device)
                self._count(a, t.device, key, None, device, out, seq)
            else:
                key = ("account_source", tenant, account, a.source, None)
                self._count(a, t.pair_rule, key, a.source, None, out, seq)
                self._lock_failure(a, t, out, seq)
                if fresh:
                    if self._count_entry(a, acct_rule, acct_key, acct, None, None, out):
                        self._under_attack(a, t, acct, out)
                    if acct.spray_window != a.occurred_ms // t.tenant_window_ms:
                        self._tenant_share(a, t, acct, out)
                    out.forwards.append(a)
        elif flow == "uia":
            handle = a.session or a.device
            key = uia_key(tenant, account, a.source, a.session, a.device)
            self._count(a, t.uia, key, None if handle else a.source, handle, out, seq)
            device_key = uia_device_key(tenant, account, a.session, a.device)
            if device_key is not None:
                self._count(a, t.uia, device_key, None, a.device, out, seq)
        else:
            handle = a.device or a.session
            key = mfa_key(tenant, account, a.source, a.device, a.session)
            if t.mfa_curve:
                self._mfa_failure(a, t, key, None if handle else a.source, handle, out, seq)
            else:
                self._count(a, t.mfa, key, None if handle else a.source, handle, out, seq)
        if fresh:
            self._mark(acct_rule, acct_key, acct, seq)

    def _touch(self, rule: _Rule, key: Key) -> KeyState:
        """The live entry for ``key``, moved to the newest end; the table creates (and
        evicts for) a missing or dead one."""
        entry = rule.entries.get(key)
        if entry is None:
            return rule.table.create(key, rule.factory)
        if entry.keep_until_ms > self.watermark_ms:
            rule.entries.move_to_end(key)
            return entry
        return rule.table.create(key, rule.factory, replace=True)

    def _lifetime_bound(self, a: Attempt, acct: KeyState, out: Outbox) -> None:
        """Rule 7: the streak of consecutive failures reached the bound: alert once."""
        acct.lifetime_alerted = True
        out.alerts.append(_alert(
            "lifetime_bound", a.tenant, None, a.account, acct.streak, 0,
            a.occurred_ms, a.occurred_ms, self.version,
        ))  # fmt: skip
        self.metrics.alerts += 1

    # -- consecutive failures: seed 002's lock, seed 004's mfa curve, the lifetime bound ----

    def _late_streak(self, a: Attempt, t: _TenantTables, out: Outbox, seq: int) -> None:
        """A failure too late for the windows still counts in its consecutive run: the
        lock and the mfa curve have no window, so only the order within the account
        matters (which the stream keeps), not how far the shard's watermark ran ahead."""
        flow = a.flow
        if flow in PASSWORD_FLOWS:
            if not (a.trusted and a.device):
                self._lock_failure(a, t, out, seq)
        elif flow == "mfa" and t.mfa_curve:
            handle = a.device or a.session
            key = mfa_key(a.tenant, a.account, a.source, a.device, a.session)
            self._mfa_failure(a, t, key, None if handle else a.source, handle, out, seq)

    def _streak(self, t: _TenantTables, key: Key) -> StreakState:
        entry = t.streaks.mapping.get(key)
        if entry is None:
            return t.streaks.create(key, StreakState)
        t.streaks.mapping.move_to_end(key)
        return entry

    def _lock_failure(self, a: Attempt, t: _TenantTables, out: Outbox, seq: int) -> None:
        """One more consecutive untrusted password failure of the account: lock it on seed
        002's curve, or until a success once the lifetime bound is reached. A lock already
        in force is not shortened or re-issued, except to become the lifetime bound."""
        key = lock_key(a.tenant, a.account)
        streak = self._streak(t, key)
        if seq >= 0 and streak.seq >= seq:
            return
        now = a.occurred_ms
        if now < streak.blocked_until_ms and t.streak_cfg[streak.rule].mode == "enforce":
            return  # the lock refused it (seed 002 refuses before counting): not counted
        streak.count += 1
        n = streak.count
        if n >= t.lifetime_threshold:
            rule, expires = "lifetime_bound", now + t.lifetime_block_ms
        else:
            lock = t.policy.lockout
            length = lock_ms(n, lock.threshold, lock.base_ms, lock.step, lock.cap_ms)
            rule, expires = "lockout", now + length if length else 0
        if expires and (now >= streak.blocked_until_ms or rule != streak.rule):
            self._hold(a, t, key, streak, rule, expires, None, None, out)
            if t.streak_cfg[rule].mode == "enforce":
                self._notice(a, t, streak, "consecutive_lock" if rule == "lockout" else rule, expires, out)
        self._mark_streak(key, streak, seq)

    def _mfa_failure(
        self, a: Attempt, t: _TenantTables, key: Key, source: str | None, device: str | None,
        out: Outbox, seq: int,
    ) -> None:  # fmt: skip
        """Seed 004: the n-th consecutive second-factor failure makes the next attempt
        wait ``factor * 2**(n-1)`` (capped)."""
        streak = self._streak(t, key)
        if seq >= 0 and streak.seq >= seq:
            return
        if a.occurred_ms < streak.blocked_until_ms and t.streak_cfg["mfa_curve"].mode == "enforce":
            return  # refused by the wait, not a failure of the factor (seed 004)
        streak.count += 1
        curve = t.policy.mfa_curve
        expires = a.occurred_ms + wait_ms(streak.count, curve.factor_ms, curve.cap_ms)
        if expires > streak.blocked_until_ms:
            self._hold(a, t, key, streak, "mfa_curve", expires, source, device, out)
        self._mark_streak(key, streak, seq)

    def _hold(
        self, a: Attempt, t: _TenantTables, key: Key, streak: StreakState, rule: str,
        expires: int, source: str | None, device: str | None, out: Outbox,
    ) -> None:  # fmt: skip
        streak.rule = rule
        streak.blocked_until_ms = expires
        streak.decision_id = self._issue(
            out, rule, key[0], key, a.tenant, a.account, source, device, t.streak_cfg[rule],
            streak.count, a.occurred_ms, expires,
        )  # fmt: skip

    def _clear_streak(self, t: _TenantTables, key: Key, streak: StreakState, out: Outbox, seq: int) -> None:
        """A success ends the run and lifts the lock it holds (seed 002: same step)."""
        if seq >= 0 and streak.seq >= seq:
            return
        streak.count = 0
        if streak.blocked_until_ms:
            streak.blocked_until_ms = 0
            self._lift(out, key)
        self._mark_streak(key, streak, seq)

    def _mark_streak(self, key: Key, streak: StreakState, seq: int) -> None:
        if seq > streak.seq:
            streak.seq = seq
        if self.track_changes:
            self.dirty[("streaks", key)] = None

    def _notice(
        self, a: Attempt, t: _TenantTables, streak: StreakState, reason: str, expires: int,
        out: Outbox,
    ) -> None:  # fmt: skip
        """Seed 001's unlock mail: at most one notice per account per notice window."""
        now = a.occurred_ms
        window_ms = t.notice_window_ms
        if not window_ms or now < streak.notice_until_ms:
            return
        streak.notice_until_ms = now + window_ms
        out.notices.append(AccountNotice(
            notice_id=stable_id("notice", a.tenant, a.account, now, self.version),
            tenant=a.tenant,
            account_digest=a.account,
            reason=reason,  # type: ignore[arg-type]
            expires_at=ms_to_datetime(expires),
            window_start=ms_to_datetime(now),
            window_end=ms_to_datetime(now + window_ms),
            policy_version=self.version,
        ))  # fmt: skip

    def _under_attack(self, a: Attempt, t: _TenantTables, acct: KeyState, out: Outbox) -> None:
        """The ceiling tripped: raise ``account_under_attack`` (and the owner's notice
        when the ceiling enforces)."""
        if t.acct.cfg.mode == "enforce":
            key = lock_key(a.tenant, a.account)
            streak = self._streak(t, key)
            self._notice(a, t, streak, "account_ceiling", acct.blocked_until_ms, out)
            self._mark_streak(key, streak, -1)
        out.alerts.append(_alert(
            "account_under_attack", a.tenant, None, a.account, acct.total,
            0, a.occurred_ms - t.acct.cfg.window_ms, a.occurred_ms, self.version,
        ))  # fmt: skip
        self.metrics.alerts += 1

    def _tenant_share(self, a: Attempt, t: _TenantTables, acct: KeyState, out: Outbox) -> None:
        """Count the account once per tumbling window in this shard's share of rule 8
        (the caller checked it is not counted in this window yet)."""
        window = a.occurred_ms // t.tenant_window_ms
        acct.spray_window = window
        # Keep the entry to the window's end, or a re-created entry would count twice.
        end = (window + 1) * t.tenant_window_ms
        if acct.keep_until_ms < end:
            acct.keep_until_ms = end
        _add_share(self.tenant_partials, a.tenant, window, t.partials_bound, out.partials)

    def _count(
        self, a: Attempt, rule: _Rule, key: Key, source: str | None, device: str | None,
        out: Outbox, seq: int,
    ) -> None:  # fmt: skip
        """Touch, count and mark one failure of ``rule`` (``_touch``, ``_count_entry`` and
        ``_mark`` inlined: this runs once or twice per failure)."""
        entries = rule.entries
        entry = entries.get(key)
        if entry is None:
            entry = rule.table.create(key, rule.factory)
        elif entry.keep_until_ms > self.watermark_ms:
            entries.move_to_end(key)
        else:
            entry = rule.table.create(key, rule.factory, replace=True)
        if seq >= 0 and entry.seq >= seq:
            return
        now = a.occurred_ms
        sub_ms = rule.sub_ms
        if entry.add(now // sub_ms):
            keep = (entry.head + rule.ring_size) * sub_ms
            if keep > entry.keep_until_ms:
                entry.keep_until_ms = keep
            if entry.total >= rule.threshold and now >= entry.blocked_until_ms:
                self._trip(a, rule, key, entry, source, device, out)
        if seq > entry.seq:
            entry.seq = seq
        if self.track_changes:
            self.dirty[(rule.name, key)] = None

    def _count_entry(
        self, a: Attempt, rule: _Rule, key: Key, entry: KeyState,
        source: str | None, device: str | None, out: Outbox,
    ) -> bool:  # fmt: skip
        """Count one failure; trip (issue a decision) when the threshold is reached with
        no decision active. Returns True on a trip."""
        now = a.occurred_ms
        if not entry.add(now // rule.sub_ms):
            return False
        keep = (entry.head + rule.ring_size) * rule.sub_ms
        if keep > entry.keep_until_ms:
            entry.keep_until_ms = keep
        if entry.total < rule.threshold or now < entry.blocked_until_ms:
            return False
        self._trip(a, rule, key, entry, source, device, out)
        return True

    def _trip(
        self, a: Attempt, rule: _Rule, key: Key, entry: KeyState,
        source: str | None, device: str | None, out: Outbox,
    ) -> None:  # fmt: skip
        """Escalate (rule 6) and issue the decision."""
        t = self.tenants[a.tenant]
        now = a.occurred_ms
        entry.level += 1
        expires = now + t.policy.backoff.block_ms(entry.level)
        entry.blocked_until_ms = expires
        entry.decision_id = self._issue(
            out, rule.name, rule.name, key, a.tenant, a.account, source, device, rule.cfg,
            entry.total, now, expires,
        )  # fmt: skip
        entry.keep_until_ms = max(entry.keep_until_ms, expires, now + t.streak_memory_ms)

    def _mark(self, rule: _Rule, key: Key, entry: KeyState, seq: int) -> None:
        if seq > entry.seq:
            entry.seq = seq
        if self.track_changes:
            self.dirty[(rule.name, key)] = None


def _add_share(
    partials: dict[tuple[str, int], int], tenant: str, window: int, bound: int,
    changed: dict[tuple[str, int], int],
) -> None:  # fmt: skip
    """One more distinct subject in the (tenant, window) share, recorded in ``changed``
    (an outbox's partials); the dict stays bounded."""
    slot = (tenant, window)
    value = partials.get(slot, 0) + 1
    partials[slot] = value
    changed[slot] = value
    if len(partials) > bound:
        # Old windows are closed: keep the dict bounded (insertion order = age).
        del partials[next(iter(partials))]


class SourceShard(_Shard):
    """Signals keyed by source: spray (rule 5) and credential stuffing.

    Fed untrusted password failures and successes, forwarded by the account shard; a
    success of an account that failed from the source within the window is a redemption. Allowlisted
    ranges are exempt. In ``observe`` mode (the default) spray raises ``spray_source``
    once per window and publishes an ``observe`` decision that never refuses: a NAT full
    of colleagues is never collateral. In ``enforce`` mode that decision is a block. A
    redeemed pair stops counting towards spray: a user who succeeds right after a typo
    is not being sprayed.

    Credential stuffing (``pipeline.core.stuffing``) publishes a ``stuffing`` decision on
    the source key (a block by default): it replaces a spray ``observe`` decision on the
    same key, and spray never replaces it while it is active.
    """

    def __init__(
        self, policy: Policy = DEFAULT_POLICY, *, part: int = 0,
        dedupe_horizon_ms: int = 3_600_000, dedupe_capacity: int = 1_000_000,
    ) -> None:  # fmt: skip
        super().__init__(policy, dedupe_horizon_ms, dedupe_capacity)
        self.part = part
        self.unknown_partials: dict[tuple[str, int], int] = {}

    def meta(self) -> list[Any]:
        unknown = [[t, w, v] for (t, w), v in self.unknown_partials.items()]
        return [*super().meta(), unknown]

    def restore(self, key: list[Any], value: list[Any] | None) -> None:
        if key == ["meta"] and value is not None and len(value) > 2:
            for tenant, window, share in value[2]:
                slot = (tenant, window)
                self.unknown_partials[slot] = max(self.unknown_partials.get(slot, 0), share)
        super().restore(key, value)

    def step(self, a: Attempt, now_ms: int, out: Outbox, seq: int = -1) -> None:
        if now_ms > self.watermark_ms:
            self.watermark_ms = now_ms
        if self.dedupe is not None and self.dedupe.seen(a.event_id, self.watermark_ms, a.tenant):
            self.metrics.duplicates += 1
            return
        t = self.tenants.get(a.tenant) or self.tenant(a.tenant)
        if a.occurred_ms <= self.watermark_ms - t.max_span_ms:
            self.metrics.late += 1
            return
        if t.allowlist is not None and t.allowlisted(a.source):
            return
        skey: Key = ("source", a.tenant, None, a.source, None)
        entries = t.sources.mapping
        src = entries.get(skey)
        if src is None:
            src = t.sources.create(skey, t.source_factory)
        else:
            entries.move_to_end(skey)
        if seq >= 0 and src.seq >= seq:
            return
        if a.success:
            self._success(a, t, src)
            if seq > src.seq:
                src.seq = seq
            if self.track_changes:
                self.dirty[("sources", skey)] = None
            return
        self.metrics.counted += 1
        new_pair = self._distinct(a, t, src)
        now = a.occurred_ms
        if src.distinct.total >= t.spray_threshold and now >= src.spray_alerted_until_ms:
            self._spray(a, t, src, skey, out)
        # Credential stuffing: all failures, and unknown_account failures of accounts new
        # from this source in the window (distinct unknown accounts), on aligned rings.
        bucket = now // t.stuffing_sub_ms
        failures, unknown = src.failures, src.unknown
        failures.add(bucket)
        if new_pair and a.failure_reason == "unknown_account":
            unknown.add(bucket)
            _add_share(
                self.unknown_partials, a.tenant, now // t.stuffing_tenant_window_ms,
                t.unknown_partials_bound, out.unknown_partials,
            )  # fmt: skip
        if unknown.head < failures.head:
            unknown.advance(failures.head)
        successes = src.successes
        if successes.head < failures.head:
            successes.advance(failures.head)
        if (
            (src.block_rule != "stuffing" or now >= src.blocked_until_ms)
            and is_stuffing(failures.total, unknown.total, successes.total,
                            now < src.redeemed_until_ms, t.stuffing_block_min,
                            t.stuffing_ratio, t.stuffing_block_more, t.stuffing_lower_ratio,
                            t.stuffing_success_factor)
        ):  # fmt: skip
            self._stuffing_block(a, t, src, skey, out)
        if now >= src.stuffing_alerted_until_ms and stuffing_alert_due(
            failures.total, unknown.total, t.stuffing_min, t.stuffing_ratio
        ):
            self._stuffing(a, t, src, out)
        if src.tenant_window != now // t.tenant_window_ms:
            self._tenant_share(a, t, src, out)
        if seq > src.seq:
            src.seq = seq
        if self.track_changes:
            self.dirty[("sources", skey)] = None

    def _success(self, a: Attempt, t: _TenantTables, src: SourceState) -> None:
        """An untrusted success: one more real user of the source in the stuffing window.
        After a failure of the same account from here (a redemption) the source has real
        users for a whole window, and the pair stops counting as sprayed."""
        now = a.occurred_ms
        successes = src.successes
        successes.add(now // t.stuffing_sub_ms)
        keep = (successes.head + t.stuffing_ring_size) * t.stuffing_sub_ms
        if keep > src.keep_until_ms:
            src.keep_until_ms = keep
        pkey: Key = ("pair", a.tenant, a.account, a.source, None)
        pair = t.pairs.mapping.get(pkey)
        if pair is not None and pair.bucket >= 0:
            until = now + t.stuffing_window_ms
            if until > src.redeemed_until_ms:
                src.redeemed_until_ms = until
            if until > src.keep_until_ms:
                src.keep_until_ms = until
            src.distinct.remove(pair.bucket)
            pair.bucket = -1
            if self.track_changes:
                self.dirty[("pairs", pkey)] = None

    def _distinct(self, a: Attempt, t: _TenantTables, src: SourceState) -> bool:
        """Move the pair's one count to the bucket of its latest failure. True when the
        pair is new in the spray window (no failure of it counted there)."""
        sub_ms = t.spray_sub_ms
        bucket = a.occurred_ms // sub_ms
        pkey: Key = ("pair", a.tenant, a.account, a.source, None)
        entries = t.pairs.mapping
        pair = entries.get(pkey)
        if pair is None:
            pair = t.pairs.create(pkey, PairState)
        else:
            entries.move_to_end(pkey)
        distinct = src.distinct
        new_pair = pair.bucket < 0 or pair.bucket <= bucket - t.spray_ring_size
        if pair.bucket < bucket:
            if pair.bucket >= 0:
                distinct.remove(pair.bucket)
            if distinct.add(bucket):
                pair.bucket = bucket
        keep = (max(pair.bucket, distinct.head) + t.spray_ring_size) * sub_ms
        pair.keep_until_ms = keep
        if keep > src.keep_until_ms:
            src.keep_until_ms = keep
        if self.track_changes:
            self.dirty[("pairs", pkey)] = None
        return new_pair

    def _spray(self, a: Attempt, t: _TenantTables, src: SourceState, skey: Key, out: Outbox) -> None:
        distinct = src.distinct.total
        cfg = t.policy.source
        now = a.occurred_ms
        if distinct < cfg.threshold or now < src.spray_alerted_until_ms:
            return
        src.spray_alerted_until_ms = now + cfg.window_ms
        out.alerts.append(_alert(
            "spray_source", a.tenant, a.source, None, distinct, distinct,
            now - cfg.window_ms, now, self.version,
        ))  # fmt: skip
        self.metrics.alerts += 1
        # Like every rule, observe mode publishes its decision with action "observe" (the
        # refusal check never applies it); enforce mode publishes a block.
        if now >= src.blocked_until_ms:
            expires = now + cfg.window_ms
            src.blocked_until_ms = expires
            src.block_rule = "source"
            src.decision_id = self._issue(
                out, "source", "source", skey, a.tenant, None, a.source, None, cfg,
                distinct, now, expires,
            )  # fmt: skip
        src.keep_until_ms = max(src.keep_until_ms, src.spray_alerted_until_ms, src.blocked_until_ms)

    def _stuffing_block(
        self, a: Attempt, t: _TenantTables, src: SourceState, skey: Key, out: Outbox
    ) -> None:
        """Publish the ``stuffing`` decision on the source key (replacing a spray
        ``observe`` decision there); it ends after ``block_ms`` or at a later trip."""
        cfg = t.policy.stuffing
        now = a.occurred_ms
        expires = now + cfg.block_ms
        src.blocked_until_ms = expires
        src.block_rule = "stuffing"
        src.decision_id = self._issue(
            out, "stuffing", "source", skey, a.tenant, None, a.source, None, t.stuffing_rule,
            src.unknown.total, now, expires,
        )  # fmt: skip
        if expires > src.keep_until_ms:
            src.keep_until_ms = expires

    def _stuffing(self, a: Attempt, t: _TenantTables, src: SourceState, out: Outbox) -> None:
        """Enough failures, mostly unknown accounts, no alert this window: alert."""
        failures = src.failures.total
        cfg = t.policy.stuffing
        now = a.occurred_ms
        src.stuffing_alerted_until_ms = now + cfg.window_ms
        src.keep_until_ms = max(src.keep_until_ms, src.stuffing_alerted_until_ms)
        out.alerts.append(_alert(
            "credential_stuffing", a.tenant, a.source, None, failures, src.distinct.total,
            now - cfg.window_ms, now, self.version,
        ))  # fmt: skip
        self.metrics.alerts += 1

    def _tenant_share(self, a: Attempt, t: _TenantTables, src: SourceState, out: Outbox) -> None:
        """Count the source once per tumbling window (the caller checked it is new)."""
        window = a.occurred_ms // t.tenant_window_ms
        src.tenant_window = window
        end = (window + 1) * t.tenant_window_ms
        if src.keep_until_ms < end:
            src.keep_until_ms = end
        _add_share(self.tenant_partials, a.tenant, window, t.partials_bound, out.partials)


TICK_MS = 1000
FINAL_MS = 1 << 62
"""Rule 8 is evaluated at each second boundary of event time (see ``TenantRollup``)."""


class TenantRollup:
    """Rule 8: sums the shards' shares of distinct failing accounts and sources per tenant
    and tumbling window, and raises ``spray_tenant`` once per (tenant, window) when the
    accounts are far above the trailing baseline and enough sources took part.

    Shares are recorded by ``update``; the condition is evaluated by ``advance(time_ms)``
    at each second boundary of event time, before the first share of a later second is
    recorded (and at the end of a replay, ``advance`` past everything). The totals seen
    by an evaluation are therefore exactly those of the events before that boundary,
    whatever order the shares of one second arrived in and however the shards were cut:
    the alert and its ``count`` are a function of the events alone. The baseline (mean of
    the previous windows' account totals) is taken at a window's first evaluation, when
    those windows are complete; an update is O(1).
    """

    def __init__(self, policy: Policy = DEFAULT_POLICY) -> None:
        self.policy = policy
        self.shares: dict[tuple[str, str, int, int], int] = {}
        self.accounts: dict[tuple[str, int], int] = {}
        self.sources: dict[tuple[str, int], int] = {}
        self.baselines: dict[tuple[str, int], float] = {}
        self.fired: set[tuple[str, int]] = set()
        self.first_window: dict[str, int] = {}
        self.touched: dict[tuple[str, int], None] = {}
        self.touched_unknown: dict[tuple[str, int], None] = {}
        self.tick_ms = -1
        self._configs: dict[str, TenantSprayConfig] = {}
        self.stuffing = TenantStuffing()

    def recorded(self, tenant: str, window: int, kind: str, part: int) -> int:
        """The share last recorded for a shard (0 if none): a share at or below it is old."""
        if kind == "u":
            return self.stuffing.shares.get((tenant, window, part), 0)
        return self.shares.get((kind, tenant, window, part), 0)

    def update(self, tenant: str, window: int, kind: str, part: int, share: int) -> None:
        """Record a shard's latest share (``kind`` "a" accounts or "s" sources of rule 8,
        "u" distinct unknown accounts of ``stuffing_tenant``); ``advance`` evaluates both."""
        if kind == "u":
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
        slot = (tenant, window)
        totals = self.accounts if kind == "a" else self.sources
        totals[slot] = totals.get(slot, 0) + share - old
        self.touched[slot] = None

    def advance(self, time_ms: int) -> list[Alert]:
        """Everything before ``time_ms`` is recorded: evaluate the windows touched since
        the last evaluation if ``time_ms`` reached a new second boundary."""
        boundary = time_ms - time_ms % TICK_MS
        if boundary <= self.tick_ms:
            return []
        self.tick_ms = boundary
        if not self.touched and not self.touched_unknown:
            return []
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
            baseline = self._new_window(tenant, window, cfg.baseline_windows)
        accounts, sources = self.accounts.get(slot, 0), self.sources.get(slot, 0)
        if accounts < max(cfg.min_accounts, cfg.factor * baseline) or sources < cfg.min_sources:
            return None
        if window - self.first_window[tenant] < cfg.min_history_windows:
            return None
        self.fired.add(slot)
        start = window * cfg.window_ms
        return _alert(
            "spray_tenant", tenant, None, None, accounts, accounts, start,
            start + cfg.window_ms, self.policy.policy_version,
        )  # fmt: skip

    def _stuffing(self, tenant: str, window: int) -> Alert | None:
        cfg = self.policy.for_tenant(tenant).stuffing
        total = self.stuffing.evaluate(
            tenant, window, cfg.tenant_min_unknown, cfg.tenant_factor, cfg.tenant_baseline_windows
        )
        if not total:
            return None
        start = window * cfg.tenant_window_ms
        alert = _alert(
            "stuffing_tenant", tenant, None, None, total, total, start,
            start + cfg.tenant_window_ms, self.policy.policy_version,
        )  # fmt: skip
        # A window fires again when its total doubles: each firing has its own id.
        alert_id = stable_id(alert.alert_id, total)
        return alert.model_copy(update={"alert_id": alert_id})

    def _new_window(self, tenant: str, window: int, baseline_windows: int) -> float:
        previous = [self.accounts.get((tenant, w), 0) for w in range(window - baseline_windows, window)]
        baseline = sum(previous) / baseline_windows
        self.baselines[(tenant, window)] = baseline
        # Forget windows older than the baseline needs (bounded memory).
        horizon = window - baseline_windows - 2
        for table in (self.accounts, self.sources, self.baselines):
            for slot in [s for s in table if s[0] == tenant and s[1] < horizon]:
                del table[slot]
        for share_key in [k for k in self.shares if k[1] == tenant and k[2] < horizon]:
            del self.shares[share_key]
        self.fired = {s for s in self.fired if s[0] != tenant or s[1] >= horizon}
        return baseline


class Engine:
    """All rules in one process: the reference the stream must agree with.

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

    def step(self, a: Attempt, now_ms: int) -> Verdict | None:
        out = self.out
        if now_ms >= self._next_advance_ms:
            self.advance(now_ms)
        verdict = self.accounts.step(a, now_ms, out)
        if out.partials:
            self._drain_partials("a")
        if out.forwards:
            self._forward(now_ms)
        return verdict

    def advance(self, now_ms: int) -> None:
        """Move the watermark of every part: expiry and tombstones, and rule 8's
        evaluation at the second boundary (``TenantRollup.advance``). Runs once per
        watermark second: enforcement itself is exact (the check compares expires_ms),
        only tombstones may trail by up to a second."""
        self.out.alerts.extend(self.rollup.advance(now_ms))
        self.accounts.advance(now_ms, self.out)
        self.sources.advance(now_ms, self.out)
        self._next_advance_ms = now_ms - now_ms % 1000 + 1000

    def _drain_unknown(self) -> None:
        partials = self.out.unknown_partials
        for (tenant, window), share in partials.items():
            self.rollup.update(tenant, window, "u", 0, share)
        partials.clear()

    def finish(self) -> None:
        """The end of a replay: evaluate rule 8 on everything recorded (what the stream
        does once its watermark passes the last event, e.g. when its input goes idle)."""
        self.out.alerts.extend(self.rollup.advance(FINAL_MS))

    def _drain_partials(self, kind: str) -> None:
        partials = self.out.partials
        for (tenant, window), share in partials.items():
            self.rollup.update(tenant, window, kind, 0, share)
        partials.clear()

    def _forward(self, now_ms: int) -> None:
        out = self.out
        step = self.sources.step
        for forwarded in out.forwards:
            step(forwarded, now_ms, out)
        out.forwards.clear()
        if out.partials:
            self._drain_partials("s")
        if out.unknown_partials:
            self._drain_unknown()

    def step_batch(self, attempts: Iterable[Attempt]) -> list[Verdict | None]:
        """The batch form: each attempt's own time is the watermark (monotone max).

        ``step`` inlined, with everything it reads bound to locals once per batch.
        """
        verdicts: list[Verdict | None] = []
        append = verdicts.append
        step = self.accounts.step
        source_step = self.sources.step
        out = self.out
        partials, forwards = out.partials, out.forwards
        now = self.accounts.watermark_ms
        for a in attempts:
            if a.occurred_ms > now:
                now = a.occurred_ms
            if now >= self._next_advance_ms:
                self.advance(now)
            append(step(a, now, out))
            if partials:
                self._drain_partials("a")
            if forwards:
                for forwarded in forwards:
                    source_step(forwarded, now, out)
                forwards.clear()
                if partials:
                    self._drain_partials("s")
                if out.unknown_partials:
                    self._drain_unknown()
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
