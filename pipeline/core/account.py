"""The account shard: every attempt of its accounts (the stream partitions by account
digest). Rules 1-4 and mfa, escalation (6), the lifetime bound (7), the consecutive-failure
rules (``pipeline.core.streaks``), the ceiling alert and the owner's notices, and its share
of the tenant-wide count of distinct failing accounts (exact when summed, because accounts
are disjoint across shards). It forwards untrusted password failures and successes to the
source shard (a source's real users, and redemptions: typo then success from the same
source).
"""

from __future__ import annotations

from pipeline.core.attempt import FAMILIAR, PASSWORD_FLOWS, UNCOUNTED, Attempt, repeat_of
from pipeline.core.decision_keys import (
    keys_for,
    lock_key,
    mfa_account_key,
    mfa_key,
    reset_key,
    uia_device_key,
    uia_key,
)
from pipeline.core.decisions import ALLOWED, Verdict
from pipeline.core.keys import Key
from pipeline.core.outbox import Outbox
from pipeline.core.records import build_alert
from pipeline.core.rules import CounterRule, TenantRules
from pipeline.core.shard import Shard
from pipeline.core.state import KeyState
from pipeline.core.streaks import (
    clear_lock,
    device_bound_failure,
    device_bound_key,
    device_bound_success,
    late_failure,
    lock_failure,
    mark_streak,
    mfa_bound_failure,
    mfa_failure,
    notify_owner,
    renew_holds,
    streak_entry,
)


class AccountShard(Shard):
    """Rules keyed by account: per (account, source), the ceiling, device, uia, mfa,
    escalation and the lifetime bound, seed 002's lock and seed 004's mfa curve
    (``pipeline.core.streaks``).

    The hot path reads the tables' dicts directly and builds only the keys it needs:
    most attempts are successes of accounts with no state and no decision, which cost a
    dedupe lookup, two subject lookups in the index and two or three dict misses.
    """

    def step(self, attempt: Attempt, now_ms: int, out: Outbox, seq: int = -1) -> Verdict | None:
        """Apply one attempt. Returns the decision that applied to it (for the audit row),
        or None for a duplicate ``event_id`` (not counted, not audited)."""
        if now_ms > self.watermark_ms:
            self.watermark_ms = now_ms
        dedupe = self.dedupe
        if dedupe is not None and dedupe.seen(attempt.event_id, self.watermark_ms, attempt.tenant):
            self.metrics.duplicates += 1
            return None
        # Holds are published for lifetime.publish_ms and renewed at half-time: on every
        # attempt, refused ones too, so a shard that sees only refused attempts renews them.
        renew_holds(self, out)
        index = self.index
        subjects = index.subjects
        # Only an account or source with an active decision can be refused: two string
        # lookups spare building the attempt's keys in the common case.
        if subjects and (
            attempt.account in subjects
            or attempt.source in subjects
            or attempt.tenant in subjects  # a wave challenge (the Engine indexes them here)
        ):
            verdict = index.check(keys_for(attempt), attempt.occurred_ms)
        elif attempt.flow in PASSWORD_FLOWS and not attempt.trusted:
            verdict = index.unfamiliar(
                attempt.tenant, attempt.account, attempt.source, attempt.device, attempt.occurred_ms
            )
        else:
            verdict = ALLOWED
        rules = self.tenants.get(attempt.tenant) or self.tenant(attempt.tenant)
        streaks = rules.streaks
        if self.watermark_ms > streaks.now_ms:
            streaks.now_ms = self.watermark_ms  # what the cap's ``pinned`` compares with
        if attempt.occurred_ms <= self.watermark_ms - rules.max_span_ms:
            self.metrics.late += 1
            if not attempt.success and attempt.failure_reason not in UNCOUNTED:
                late_failure(self, attempt, rules, out, seq)
            return verdict
        flow = attempt.flow
        if flow == "challenge":
            out.forwards.append(attempt)  # bot evidence is the source stage's
            if attempt.success:
                self.passed(attempt, rules, out, seq)
        elif flow == "reset":
            if attempt.success:
                self._reset(attempt, rules, out, seq)
            elif attempt.failure_reason not in UNCOUNTED:
                self._reset_failure(attempt, rules, out, seq)
                self.metrics.counted += 1
        elif attempt.success:
            self._success(attempt, rules, out, seq)
        elif attempt.failure_reason not in UNCOUNTED:  # refused, or a right password stepped up
            self._failure(attempt, rules, out, seq)
            self.metrics.counted += 1
        return verdict

    # -- successes ----------------------------------------------------------------------

    def _success(self, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int) -> None:
        tenant, account = attempt.tenant, attempt.account
        wm = self.watermark_ms
        acct_key: Key = ("account", tenant, account, None, None)
        acct = rules.acct.entries.get(acct_key)
        if acct is not None and acct.keep_until_ms > wm and (seq < 0 or acct.seq < seq):
            # Rule 7's streak ends; the ceiling's count and escalation are never cleared.
            acct.streak = 0
            acct.lifetime_alerted = False
            self._mark(rules.acct, acct_key, acct, seq)
        # Each success resets its own counter; most find none (a dict miss, no call).
        flow = attempt.flow
        if flow in PASSWORD_FLOWS:
            if flow == "recovery":
                self.owner_proved(attempt, rules, out, seq)  # a new password follows
            trusted = attempt.trusted and attempt.device is not None
            if self.familiar(attempt, rules, out, seq, attempt.account):
                # One more account of the source's real users (the source stage).
                out.forwards.append(attempt._replace(failure_reason=FAMILIAR))
            elif not trusted:
                out.forwards.append(attempt)  # a redemption of the pair, if it failed there
            if attempt.device is not None and not trusted:
                # A cookie (or an app's install id) that signed in: its owner's own client.
                self.familiar(attempt, rules, out, seq, attempt.account, attempt.device)
            # The lock (a trusted device's success clears only a hold until a success,
            # unless trusted_success_clears; lifted from the index when the entry is
            # gone), and the device bound's lifetime feed.
            trusted_only = bool(attempt.trusted and attempt.device) and not (
                rules.policy.lockout.trusted_success_clears
            )
            clear_lock(self, rules, lock_key(tenant, account), out, seq, trusted_only)
            device_bound_success(self, rules, attempt, out, seq)
            key: Key = ("account_source", tenant, account, attempt.source, None)
            entry = rules.pair_rule.entries.get(key)
            if entry is not None and entry.keep_until_ms > wm:
                self._clear(rules.pair_rule, key, entry, out, seq)
            if attempt.trusted and attempt.device:
                key = ("device", tenant, account, None, attempt.device)
                entry = rules.device.entries.get(key)
                if entry is not None and entry.keep_until_ms > wm:
                    self._clear(rules.device, key, entry, out, seq)
            return
        if flow == "uia":
            rule = rules.uia
            key = uia_key(tenant, account, attempt.source, attempt.session, attempt.device)
            device_key = uia_device_key(tenant, account, attempt.session, attempt.device)
            if device_key is not None:
                entry = rule.entries.get(device_key)
                if entry is not None and entry.keep_until_ms > wm:
                    self._clear(rule, device_key, entry, out, seq)
        else:
            rule = rules.mfa
            key = mfa_key(tenant, account, attempt.source, attempt.device, attempt.session)
            clear_lock(self, rules, key, out, seq)
            clear_lock(self, rules, mfa_account_key(tenant, account), out, seq)
        entry = rule.entries.get(key)
        if entry is not None and entry.keep_until_ms > wm:
            self._clear(rule, key, entry, out, seq)

    def _reset(self, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int) -> None:
        """A password reset proven through the mailbox (``flow = "reset"``): the owner
        chose a new password, so every guess at the old one is moot. It ends the run (the
        lock and the lifetime bound, the second factor's account bound, rule 7's streak),
        clears the pair's counter and the ceiling's decision, makes the pair familiar, and
        leaves the account's failures out of the wave's counts for
        ``familiar.after_reset_ms`` (its owner's stale clients). Nothing refuses it but an
        operator (``pipeline.core.decisions``). The lock, the mfa bound and the device
        bound are lifted whether or not their entries survive (the decision index knows
        their keys): an operator's ``authpipe decisions unlock`` is such a reset."""
        tenant, account = attempt.tenant, attempt.account
        for key in (
            lock_key(tenant, account),
            mfa_account_key(tenant, account),
            device_bound_key(tenant, account),
        ):
            clear_lock(self, rules, key, out, seq)
        wm = self.watermark_ms
        for rule, key in (
            (rules.acct, ("account", tenant, account, None, None)),
            (rules.pair_rule, ("account_source", tenant, account, attempt.source, None)),
        ):
            entry = rule.entries.get(key)
            if entry is not None and entry.keep_until_ms > wm:
                if rule is rules.acct:
                    entry.streak = 0
                    entry.lifetime_alerted = False
                self._clear(rule, key, entry, out, seq)
        self.owner_proved(attempt, rules, out, seq)
        if self.familiar(attempt, rules, out, seq, attempt.account):
            out.forwards.append(attempt._replace(failure_reason=FAMILIAR))

    def _clear(self, rule: CounterRule, key: Key, entry: KeyState, out: Outbox, seq: int) -> None:
        """A success clears its own live counter and escalation, and lifts its decision.
        (An entry past its time is gone even before ``expire`` pops it: never reset.)"""
        if seq >= 0 and entry.seq >= seq:
            return
        entry.clear()
        entry.level = 0
        if entry.blocked_until_ms:
            entry.blocked_until_ms = 0
            self.lift(out, key)
        self._mark(rule, key, entry, seq)

    # -- failures -----------------------------------------------------------------------

    def _reset_failure(self, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int) -> None:
        """A reset that failed (``flow = "reset"``: a wrong, spent or expired link). The
        contract admits only single-use links of at least 128 bits there
        (docs/contract.md), so its failures guess nothing findable, yet every door that
        verifies a secret counts (seed 002): the pair's counter (``account_source``, 5 in
        15 min from one source), the ceiling's (``account``, 50 in 15 min from all of
        them, rule 6's backoff, ``account_under_attack`` and the owner's notice) and
        rule 7's streak. Never the lock's run: a stream of failing links, which nothing
        refuses, would hold the owner under the lifetime bound in seconds."""
        tenant, account = attempt.tenant, attempt.account
        acct, acct_key, fresh = self._streak_of(attempt, rules, out, seq)
        key: Key = ("account_source", tenant, account, attempt.source, None)
        self._count(attempt, rules.pair_rule, key, attempt.source, None, out, seq)
        if fresh:
            if self._count_entry(attempt, rules.acct, acct_key, acct, None, None, out):
                self._under_attack(attempt, rules, acct, out)
            self._mark(rules.acct, acct_key, acct, seq)

    def _streak_of(
        self, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int
    ) -> tuple[KeyState, Key, bool]:
        """The account's ceiling entry, with rule 7's streak counted once per ``seq``
        (the alert itself is rare): the entry, its key, and whether it was fresh."""
        acct_key: Key = ("account", attempt.tenant, attempt.account, None, None)
        acct = rules.acct.table.touch(acct_key, rules.acct.factory, self.watermark_ms)
        fresh = seq < 0 or acct.seq < seq
        if fresh:
            acct.streak += 1
            memory = attempt.occurred_ms + rules.lifetime_memory_ms
            if memory > acct.keep_until_ms:
                acct.keep_until_ms = memory
            if acct.streak >= rules.lifetime_threshold and not acct.lifetime_alerted:
                self._lifetime_bound(attempt, acct, out)
        return acct, acct_key, fresh

    def _failure(self, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int) -> None:
        tenant, account, flow = attempt.tenant, attempt.account, attempt.flow
        acct_rule = rules.acct
        acct, acct_key, fresh = self._streak_of(attempt, rules, out, seq)
        if flow in PASSWORD_FLOWS:
            device = attempt.device
            if attempt.trusted and device:
                # Trusted-device failures feed only their device's counter (rule 3), and
                # a device new to failing counts towards the account's bound on them.
                key: Key = ("device", tenant, account, None, device)
                known = rules.device.entries.get(key)
                first = known is None or known.keep_until_ms <= self.watermark_ms
                self._count(attempt, rules.device, key, None, device, out, seq)
                if first:
                    device_bound_failure(self, attempt, rules, out, seq)
            else:
                key = ("account_source", tenant, account, attempt.source, None)
                self._count(attempt, rules.pair_rule, key, attempt.source, None, out, seq)
                lock_failure(self, attempt, rules, out, seq)
                if fresh:
                    if self._count_entry(attempt, acct_rule, acct_key, acct, None, None, out):
                        self._under_attack(attempt, rules, acct, out)
                    if self._familiar_here(attempt, rules):
                        # The owner's typo at its own place or client: the source stage
                        # does not count it as a stranger's (``StrangersConfig``).
                        if rules.wave_counts_familiar:
                            self._tenant_share(attempt, rules, acct, out)
                        out.forwards.append(attempt._replace(failure_reason=FAMILIAR))
                    elif self._tenant_share(attempt, rules, acct, out):
                        out.forwards.append(attempt)
                    else:
                        # The account failed unfamiliarly within recount_ms: one account,
                        # counted once, whatever addresses it fails from.
                        out.forwards.append(attempt._replace(failure_reason=repeat_of(attempt)))
        elif flow == "uia":
            handle = attempt.session or attempt.device
            key = uia_key(tenant, account, attempt.source, attempt.session, attempt.device)
            self._count(
                attempt, rules.uia, key, None if handle else attempt.source, handle, out, seq
            )
            device_key = uia_device_key(tenant, account, attempt.session, attempt.device)
            if device_key is not None:
                self._count(attempt, rules.uia, device_key, None, attempt.device, out, seq)
        else:
            handle = attempt.device or attempt.session
            key = mfa_key(tenant, account, attempt.source, attempt.device, attempt.session)
            mfa_bound_failure(self, attempt, rules, out, seq)
            if rules.mfa_curve:
                mfa_failure(
                    self, attempt, rules, key, None if handle else attempt.source, handle, out, seq
                )
            else:
                self._count(
                    attempt, rules.mfa, key, None if handle else attempt.source, handle, out, seq
                )
        if fresh:
            self._mark(acct_rule, acct_key, acct, seq)

    def _lifetime_bound(self, attempt: Attempt, acct: KeyState, out: Outbox) -> None:
        """Rule 7: the streak of consecutive failures reached the bound: alert once."""
        acct.lifetime_alerted = True
        out.alerts.append(
            build_alert(
                "lifetime_bound",
                attempt.tenant,
                None,
                attempt.account,
                acct.streak,
                0,
                attempt.occurred_ms,
                attempt.occurred_ms,
                self.version,
            )
        )
        self.metrics.alerts += 1

    def _under_attack(
        self, attempt: Attempt, rules: TenantRules, acct: KeyState, out: Outbox
    ) -> None:
        """The ceiling tripped: raise ``account_under_attack`` (and the owner's notice
        when the ceiling enforces)."""
        if rules.acct.cfg.mode == "enforce":
            key = lock_key(attempt.tenant, attempt.account)
            streak = streak_entry(rules, key)
            notify_owner(
                self, attempt, rules, streak, "account_ceiling", acct.blocked_until_ms, out
            )
            mark_streak(self, key, streak, -1)
        out.alerts.append(
            build_alert(
                "account_under_attack",
                attempt.tenant,
                None,
                attempt.account,
                acct.total,
                0,
                attempt.occurred_ms - rules.acct.cfg.window_ms,
                attempt.occurred_ms,
                self.version,
            )
        )
        self.metrics.alerts += 1

    @staticmethod
    def _familiar_here(attempt: Attempt, rules: TenantRules) -> bool:
        """The account succeeded from this source, or with this device cookie, within
        ``familiar.memory_ms``, or got a new password within ``familiar.after_reset_ms``:
        its failure here is the owner's typo or the owner's app, not a wave's (rule 8
        and the strangers tier count the others)."""
        familiar, now = rules.familiar, attempt.occurred_ms  # ``get``: a table packed or not
        tenant, account = attempt.tenant, attempt.account
        entry = familiar.get(("familiar", tenant, account, attempt.source, None))
        if entry is not None and entry.blocked_until_ms > now:
            return True
        if attempt.device is not None:
            entry = familiar.get(("familiar", tenant, account, None, attempt.device))
            if entry is not None and entry.blocked_until_ms > now:
                return True
        entry = familiar.get(reset_key(tenant, account))  # its owner's stale clients
        return entry is not None and entry.blocked_until_ms > now

    def _tenant_share(
        self, attempt: Attempt, rules: TenantRules, acct: KeyState, out: Outbox
    ) -> bool:
        """An unfamiliar failure of the account: count it in this shard's share of rule 8
        when the account had none in the ``recount_ms`` before (a stale app retrying for
        twenty minutes counts once, a spray's or a stuffing's account every time), at
        most once per tumbling window. ``spray_window`` is the window of its latest one.
        True when counted."""
        window = attempt.occurred_ms // rules.tenant_window_ms
        last = acct.spray_window
        if window == last:
            return False
        counted = last < 0 or window - last > rules.recount_windows
        if counted:
            self.add_tenant_share(attempt, rules, out)
        acct.spray_window = window
        # Keep the entry while its latest failure still silences a recount, or a
        # re-created entry would count again.
        keep = (window + rules.recount_windows + 1) * rules.tenant_window_ms
        acct.keep_until_ms = max(acct.keep_until_ms, keep)
        return counted

    def _count(
        self,
        attempt: Attempt,
        rule: CounterRule,
        key: Key,
        source: str | None,
        device: str | None,
        out: Outbox,
        seq: int,
    ) -> None:
        """Touch, count and mark one failure of ``rule`` (once per ``seq``)."""
        entry = rule.table.touch(key, rule.factory, self.watermark_ms)
        if seq >= 0 and entry.seq >= seq:
            return
        self._count_entry(attempt, rule, key, entry, source, device, out)
        self._mark(rule, key, entry, seq)

    def _count_entry(
        self,
        attempt: Attempt,
        rule: CounterRule,
        key: Key,
        entry: KeyState,
        source: str | None,
        device: str | None,
        out: Outbox,
    ) -> bool:
        """Count one failure; trip (issue a decision) when the threshold is reached with
        no decision active. Returns True on a trip."""
        now = attempt.occurred_ms
        if not entry.add(now // rule.sub_ms):
            return False
        keep = (entry.head + rule.ring_size) * rule.sub_ms
        if keep > entry.keep_until_ms:
            entry.keep_until_ms = keep
        if entry.total < rule.threshold or now < entry.blocked_until_ms:
            return False
        self._trip(attempt, rule, key, entry, source, device, out)
        return True

    def _trip(
        self,
        attempt: Attempt,
        rule: CounterRule,
        key: Key,
        entry: KeyState,
        source: str | None,
        device: str | None,
        out: Outbox,
    ) -> None:
        """Escalate (rule 6) and issue the decision."""
        rules = self.tenants[attempt.tenant]
        now = attempt.occurred_ms
        entry.level += 1
        expires = now + rules.policy.backoff.block_ms(entry.level)
        entry.blocked_until_ms = expires
        entry.decision_id = self.issue(
            out,
            rule.name,
            rule.name,
            key,
            attempt.tenant,
            attempt.account,
            source,
            device,
            rule.cfg,
            entry.total,
            now,
            expires,
        )
        entry.keep_until_ms = max(entry.keep_until_ms, expires, now + rules.streak_memory_ms)

    def _mark(self, rule: CounterRule, key: Key, entry: KeyState, seq: int) -> None:
        if seq > entry.seq:
            entry.seq = seq
        if self.track_changes:
            self.dirty[(rule.name, key)] = None
