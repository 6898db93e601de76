"""What both shards share (``Shard``): the policy compiled per tenant, the decision
index, dedupe, the watermark, issuing and lifting decisions, and the durable state the
stream writes to a changelog and restores from it (``take_dirty`` / ``restore``).

Windows use event time; the watermark (the newest event time seen) decides expiry and
lateness. An entry past its ``keep_until_ms`` is dead whether or not ``expire`` has
popped it yet, so what the tables hold never changes a decision, only memory.
"""

from __future__ import annotations

from typing import Any

from pipeline.contracts.codec import dumps
from pipeline.core.attempt import Attempt
from pipeline.core.decision_keys import reset_key
from pipeline.core.decisions import Active, DecisionIndex
from pipeline.core.dedupe import DEDUPE_CAPACITY, DEDUPE_HORIZON_MS, Deduper
from pipeline.core.keys import Key, format_key, stable_id
from pipeline.core.lockout import StreakState
from pipeline.core.outbox import Metrics, Outbox, Shares, add_share
from pipeline.core.policy import DEFAULT_POLICY, Policy
from pipeline.core.policy_rules import DAY_MS, RuleConfig
from pipeline.core.records import build_decision, decision_value
from pipeline.core.rules import Dirty, TenantRules
from pipeline.core.state import KeyState, PairState, SourceState
from pipeline.core.table import BoundedTable


class Shard:
    """Policy, tables per tenant, the decision index, dedupe and the change record."""

    def __init__(
        self,
        policy: Policy = DEFAULT_POLICY,
        *,
        part: int = 0,
        dedupe_horizon_ms: int = DEDUPE_HORIZON_MS,
        dedupe_capacity: int = DEDUPE_CAPACITY,
    ) -> None:
        self.policy = policy
        self.part = part
        self.version = policy.policy_version
        self.tenants: dict[str, TenantRules] = {}
        self.index = DecisionIndex(policy=policy)
        # A zero horizon turns dedupe off (the source stage of a single-process Engine is
        # fed only by the already-deduplicated account stage).
        self.dedupe = Deduper(dedupe_horizon_ms, dedupe_capacity) if dedupe_horizon_ms else None
        self.watermark_ms = 0
        self.renew_due_ms = 0
        """The earliest renewal due in any tenant's heap (``streaks.renew_holds``): below
        it an attempt looks at no tenant. 0 after a restore: the first attempt schedules
        the restored holds."""
        self.metrics = Metrics()
        # This shard's share of distinct failing subjects per (tenant, window) (rule 8).
        self.tenant_shares: Shares = {}
        # Keys whose state changed since the last ``take_dirty``: the stream flushes them.
        # A shard that is never flushed (inside Engine) turns ``track_changes`` off before
        # its first step, or the record would grow with every key ever seen.
        self.dirty: Dirty = {}
        self.track_changes = True

    def tenant(self, tenant: str) -> TenantRules:
        tables = self.tenants.get(tenant)
        if tables is None:
            dirty = self.dirty if self.track_changes else None
            tables = TenantRules(self.policy.for_tenant(tenant), dirty)
            self.tenants[tenant] = tables
        return tables

    def issue(
        self,
        out: Outbox,
        rule: str,
        scope: str,
        key: Key,
        tenant: str,
        account: str | None,
        source: str | None,
        device: str | None,
        cfg: RuleConfig,
        count: int,
        issued_ms: int,
        expires_ms: int,
        action: str | None = None,
        challenge: str | None = None,
    ) -> str:
        """Publish a decision of ``rule`` on ``key`` and index it; returns its id. The
        action is the mode's (``block`` or ``observe``) unless ``action`` names another
        for enforce mode (``challenge``, ``exempt``)."""
        if action is None or cfg.mode != "enforce":
            action = _action(cfg.mode)
        wire_key = format_key(key)
        decision_id = stable_id(wire_key, issued_ms, expires_ms, self.version)
        self.index.put(key, Active(decision_id, action, expires_ms, rule, challenge))
        self.metrics.decisions += 1
        value = decision_value(
            decision_id,
            wire_key,
            scope,
            action,
            rule,
            tenant,
            account,
            source,
            device,
            count,
            cfg.threshold,
            cfg.window_ms,
            issued_ms,
            expires_ms,
            self.version,
            challenge,
        )
        if action == "exempt":  # a first sign-in's: its bytes, no model
            out.exempts.append((wire_key, dumps(value)))
        else:
            out.decisions.append((wire_key, build_decision(value)))
        return decision_id

    def familiar(
        self,
        attempt: Attempt,
        rules: TenantRules,
        out: Outbox,
        seq: int,
        account: str | None,
        device: str | None = None,
    ) -> bool:
        """A success made ``account`` familiar at the attempt's source (the account shard's
        ``familiar|t|a|s|-``) or with its device cookie (``familiar|t|a|-|d``, ``device``
        given): publish it, or renew it at most once per ``familiar.renew_ms``; True when
        published. The source known for some account (the source shard's
        ``familiar|t|-|s|-``, ``account`` None) is kept, never published: only the
        strangers tier reads it (a known place softens no challenge, issue 44 item 7)."""
        if not rules.familiar_on:
            return False
        source = None if device else attempt.source
        key: Key = ("familiar", attempt.tenant, account, source, device)
        table = rules.familiar
        entry = table.mapping.get(key)
        now = attempt.occurred_ms
        if entry is None:
            if account is not None and not self._new_familiar(attempt, rules, account):
                self.metrics.familiar_quota_reached += 1
                return False
            entry = self._new_familiar_entry(table, key, out)
        else:
            table.mapping.move_to_end(key)
            if now < entry.notice_until_ms or (seq >= 0 and entry.seq >= seq):
                return False  # published within the renew period (the field is its end)
        publish = account is not None
        memory_ms, renew_ms = rules.familiar_memory_ms, rules.familiar_renew_ms
        self._exempt(out, rules, key, entry, seq, now, memory_ms, renew_ms, publish)
        return publish

    def passed(self, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int) -> None:
        """A client passed a CAPTCHA for the account (``WaveConfig.captcha_pass_ms``):
        publish ``passed|t|a|-|d`` (``passed|t|a|s|-`` without a cookie), an exempt from
        CAPTCHAs only, kept in the familiar table (bounded, in the changelog, lifted on
        eviction), published again once half its time has passed."""
        pass_ms = rules.captcha_pass_ms
        if not pass_ms:
            return
        device = attempt.device
        source = None if device else attempt.source
        key: Key = ("passed", attempt.tenant, attempt.account, source, device)
        table = rules.familiar
        entry = table.mapping.get(key)
        now = attempt.occurred_ms
        if entry is None:
            entry = self._new_familiar_entry(table, key, out)
        else:
            table.mapping.move_to_end(key)
            if now < entry.notice_until_ms or (seq >= 0 and entry.seq >= seq):
                return
        self._exempt(out, rules, key, entry, seq, now, pass_ms, pass_ms // 2, True)

    def _exempt(
        self,
        out: Outbox,
        rules: TenantRules,
        key: Key,
        entry: StreakState,
        seq: int,
        now: int,
        memory_ms: int,
        renew_ms: int,
        publish: bool,
    ) -> None:
        """A familiar-table entry holds for ``memory_ms`` from ``now``: publish its exempt
        (scope and rule are the key's first part; published again once ``renew_ms`` has
        passed) unless ``publish`` is False (a known place, the source stage's own)."""
        expires = now + memory_ms
        entry.blocked_until_ms = entry.keep_until_ms = expires
        entry.notice_until_ms = now + renew_ms
        entry.rule = "familiar"
        if publish:
            scope, tenant, account, source, device = key
            entry.decision_id = self.issue(
                out,
                scope,
                scope,
                key,
                tenant,
                account,
                source,
                device,
                rules.familiar_cfg,
                0,
                now,
                expires,
                action="exempt",
            )
        self._mark_familiar(key, entry, seq)

    def owner_proved(self, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int) -> None:
        """A new password was set (``FamiliarConfig.after_reset_ms``): until then the
        account's failures are its owner's old clients (``reset_key``'s entry, never
        published; kept as long as a familiar entry, so the table stays in deadline
        order)."""
        after_ms = rules.familiar_after_reset_ms
        if not after_ms:
            return
        key = reset_key(attempt.tenant, attempt.account)
        table = rules.familiar
        entry = table.mapping.get(key)
        now = attempt.occurred_ms
        keep_until_ms = now + rules.familiar_memory_ms
        if entry is None:
            entry = self._new_familiar_entry(table, key, out)
            entry.keep_until_ms = keep_until_ms  # not StreakState's default (forever)
        else:
            table.mapping.move_to_end(key)
            if seq >= 0 and entry.seq >= seq:
                return
            entry.keep_until_ms = max(entry.keep_until_ms, keep_until_ms)
        entry.blocked_until_ms = max(entry.blocked_until_ms, now + after_ms)
        self._mark_familiar(key, entry, seq)

    def _new_familiar_entry(
        self, table: BoundedTable[StreakState], key: Key, out: Outbox
    ) -> StreakState:
        """A new entry of a familiar table; the exempts of entries its cap evicted are
        lifted."""
        entry = table.create(key, StreakState)
        if table.evicted:
            self.lift_evicted(out, table)
        return entry

    def _mark_familiar(self, key: Key, entry: StreakState, seq: int) -> None:
        """The familiar entry changed: its sequence, and its changelog record."""
        if seq > entry.seq:
            entry.seq = seq
        if self.track_changes:
            self.dirty[("familiar", key)] = None

    def _new_familiar(self, attempt: Attempt, rules: TenantRules, account: str) -> bool:
        """Whether ``account`` may make one more place or client familiar today (UTC day of
        event time, ``familiar.new_per_day``); counts it when so. One success may count
        twice (a new place and a new client). A replayed event finds the entry it made
        (written to the changelog with this count, in the same flush), so it never gets
        here twice."""
        cap = rules.familiar_new_per_day
        if not cap:
            return True
        now = attempt.occurred_ms
        key: Key = ("familiar_new", attempt.tenant, account, None, None)
        today = rules.familiar_new.touch(key, StreakState, now)
        if today.count >= cap:
            return False
        today.count += 1
        today.keep_until_ms = now - now % DAY_MS + DAY_MS
        if self.track_changes:
            self.dirty[("familiar_new", key)] = None
        return True

    def lift_evicted(self, out: Outbox, table: BoundedTable[Any]) -> None:
        """Lift the exempts of the familiar entries the table's cap evicted (a tombstone
        each), so the index and every edge stay bounded by ``entry_cap``."""
        evicted = table.evicted
        if evicted:
            for key in evicted:
                self.lift(out, key)
            evicted.clear()

    def lift(self, out: Outbox, key: Key) -> None:
        if self.index.lift(key) is not None:
            out.decisions.append((format_key(key), None))
            self.metrics.lifts += 1

    def add_tenant_share(self, attempt: Attempt, rules: TenantRules, out: Outbox) -> int:
        """Count the attempt's subject once more in this shard's share of its tenant's
        rule-8 window (the caller checked it is new there); returns the window."""
        window = attempt.occurred_ms // rules.tenant_window_ms
        add_share(self.tenant_shares, attempt.tenant, window, rules.shares_bound, out.tenant_shares)
        return window

    def advance(self, now_ms: int, out: Outbox) -> None:
        """Move the watermark: expire table entries and tombstone expired decisions."""
        if now_ms > self.watermark_ms:
            self.watermark_ms = now_ms
        for key in self.index.prune(self.watermark_ms):
            if key[0] == "tenant":
                continue  # a wave challenge ends at its expiry: never tombstoned
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
        if name == "familiar":
            return tables.familiar
        if name == "familiar_new":
            return tables.familiar_new
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
        return [self.watermark_ms, share_records(self.tenant_shares)]

    def restore(self, key: list[Any], value: list[Any] | None) -> None:
        """Load one changelog record (the inverse of ``take_dirty``); None deletes."""
        if key == ["meta"]:
            if value is None:
                return
            self.watermark_ms = max(self.watermark_ms, value[0])
            restore_shares(self.tenant_shares, value[1])
            return
        name, *parts = key
        entry_key: Key = tuple(parts)
        if value is None:
            self._table(name, entry_key[1]).pop(entry_key)
            return
        loader: Any = {
            "sources": SourceState,
            "pairs": PairState,
            "streaks": StreakState,
            "familiar": StreakState,
            "familiar_new": StreakState,
        }.get(name, KeyState)
        self._table(name, entry_key[1]).put(entry_key, loader.load(value))

    def finish_restore(self, out: Outbox) -> None:
        """After loading: re-index active decisions and expire what the changelog kept
        past its time (restored windows are not expired by the framework). Tables are put
        in deadline order first, so expiry from the front reaches every dead entry."""
        self.renew_due_ms = 0  # the next attempt schedules the restored holds' renewals
        for tables in self.tenants.values():
            tables.renewals_ready = False
            for any_table in tables.tables():
                any_table.sort_by_deadline()
            self._reindex_counters(tables)
            for key, streak in tables.streaks.items():
                if streak.blocked_until_ms > self.watermark_ms and streak.decision_id:
                    action = _action(tables.streak_cfg[streak.rule].mode)
                    self.index.put(
                        key,
                        Active(streak.decision_id, action, streak.blocked_until_ms, streak.rule),
                    )
            familiar = tables.familiar
            if familiar.evicted:
                # A restore into a smaller cap (lowered, or fewer shards' worth) evicted
                # entries whose exempts are still published: lift them (not indexed yet).
                # (A new password's entry, ``reset_key``, and a known place, were never
                # published.)
                gone = dict.fromkeys(
                    k
                    for k in familiar.evicted
                    if k not in familiar and k[2] is not None and (k[3] or k[4])
                )
                out.decisions.extend((format_key(key), None) for key in gone)
                self.metrics.lifts += len(gone)
                familiar.evicted.clear()
            for key, known in familiar.items():
                if known.blocked_until_ms > self.watermark_ms and known.decision_id:
                    action = "exempt" if tables.familiar_cfg.mode == "enforce" else "observe"
                    self.index.put(
                        key, Active(known.decision_id, action, known.blocked_until_ms, "familiar")
                    )
        self.advance(self.watermark_ms, out)

    def _reindex_counters(self, tables: TenantRules) -> None:
        """Index the active decisions of the counter and source tables."""
        named: list[tuple[str, BoundedTable[Any]]] = [
            *tables.counters.items(),
            ("source", tables.sources),
        ]
        for rule, table in named:
            mode = tables.cfg[rule].mode
            for key, entry in table.items():
                if entry.blocked_until_ms > self.watermark_ms and entry.decision_id:
                    name, rule_mode = rule, mode
                    if rule == "source" and entry.block_rule == "stuffing":
                        continue  # the removed per-source stuffing block: not restored
                    if rule == "source" and entry.block_rule == "challenge_failures":
                        name, rule_mode = entry.block_rule, tables.challenge_rule.mode
                    active = Active(
                        entry.decision_id, _action(rule_mode), entry.blocked_until_ms, name
                    )
                    self.index.put(key, active)

    def evictions(self) -> int:
        return sum(table.evictions for rules in self.tenants.values() for table in rules.tables())

    def entries(self) -> int:
        return sum(len(table) for rules in self.tenants.values() for table in rules.tables())


def _action(mode: str) -> str:
    return "block" if mode == "enforce" else "observe"


def share_records(shares: Shares) -> list[list[Any]]:
    """A shard's shares as ``[tenant, window, share]`` records (its meta; ``restore_shares``
    reads them back)."""
    return [[tenant, window, share] for (tenant, window), share in shares.items()]


def restore_shares(shares: Shares, records: list[Any]) -> None:
    """Merge ``[tenant, window, share]`` records into ``shares`` (the larger wins)."""
    for tenant, window, share in records:
        slot = (tenant, window)
        shares[slot] = max(shares.get(slot, 0), share)
