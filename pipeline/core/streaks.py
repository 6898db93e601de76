"""The account shard's consecutive-failure rules: seed 002's lock (and the lifetime bound
it becomes), seed 004's mfa curve, and the owner's notices (seed 001).

A streak has no window: only the order of an account's attempts matters (which the stream
keeps), so a failure too late for the windows still counts here. A streak entry is bounded
by the table's cap, never by time: the cap passes over entries holding a decision, and
the decision of an entry it evicts all the same is tombstoned (``drain_evicted``). A hold
until a success (the lifetime bound, the mfa bound, a device bound past the lifetime
threshold) is published for ``lifetime.publish_ms`` and renewed while it holds
(``renew_holds``); a success or a reset lifts the account's decision from the index even
when its entry is gone (``lift_lock``). Every change is recorded in the shard's ``dirty``
record (when it tracks changes) so the changelog carries it.
"""

from __future__ import annotations

from heapq import heappop, heappush

from pipeline.core.attempt import PASSWORD_FLOWS, Attempt
from pipeline.core.decision_keys import lock_key, mfa_account_key, mfa_key, reset_key
from pipeline.core.keys import Key
from pipeline.core.lockout import FOREVER_MS, StreakState, holds, lock_ms, wait_ms
from pipeline.core.outbox import Outbox
from pipeline.core.records import build_notice
from pipeline.core.rules import TenantRules
from pipeline.core.shard import Shard


def late_failure(shard: Shard, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int) -> None:
    """A failure too late for the windows still counts in its consecutive run."""
    flow = attempt.flow
    if flow in PASSWORD_FLOWS:
        if not (attempt.trusted and attempt.device):
            lock_failure(shard, attempt, rules, out, seq)
    elif flow == "mfa":
        mfa_bound_failure(shard, attempt, rules, out, seq)
        if not rules.mfa_curve:
            return
        handle = attempt.device or attempt.session
        key = mfa_key(
            attempt.tenant, attempt.account, attempt.source, attempt.device, attempt.session
        )
        mfa_failure(
            shard, attempt, rules, key, None if handle else attempt.source, handle, out, seq
        )


HOLD_RULES = frozenset({"lifetime_bound", "mfa_bound", "device_bound"})
"""Rules whose hold may last until a success: published for a bounded time, renewed."""


def device_bound_key(tenant: str, account: str) -> Key:
    """``device|t|a|-|-``: every trusted device of the account (the device bound)."""
    return ("device", tenant, account, None, None)


def streak_entry(rules: TenantRules, key: Key) -> StreakState:
    """The streak of ``key``, created if missing, moved to the newest end."""
    entry = rules.streaks.mapping.get(key)
    if entry is None:
        return rules.streaks.create(key, StreakState)
    rules.streaks.mapping.move_to_end(key)
    return entry


def counted_entry(shard: Shard, rules: TenantRules, key: Key, out: Outbox) -> StreakState:
    """``streak_entry``, and the decisions of entries the cap evicted for it lifted."""
    entry = streak_entry(rules, key)
    if rules.streaks.evicted:
        drain_evicted(shard, rules, out)
    return entry


def drain_evicted(shard: Shard, rules: TenantRules, out: Outbox) -> None:
    """Tombstone the decisions of the streak entries the cap evicted (it passes over
    entries holding one while it can: ``BoundedTable``'s ``pinned``): a lock is never
    left published without the entry that would lift it."""
    evicted = rules.streaks.evicted
    if evicted:
        for key in evicted:
            if key not in rules.streaks.mapping:
                shard.lift(out, key)
        evicted.clear()


def lift_lock(shard: Shard, out: Outbox, key: Key, trusted_only_hold: bool = False) -> None:
    """A success or a reset whose account has no streak entry at ``key`` (evicted, or a
    shard that never had it): lift the decision the index still holds there. With
    ``trusted_only_hold`` (a trusted device's success, which clears only a hold until a
    success) only a rule of ``HOLD_RULES`` is lifted."""
    active = shard.index.get(key)
    if active is not None and (not trusted_only_hold or active.rule in HOLD_RULES):
        shard.lift(out, key)


def lock_failure(shard: Shard, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int) -> None:
    """One more consecutive untrusted password failure of the account (never one the
    gateway reported ``refused``: the caller drops those): lock it on seed 002's curve,
    or until a success once the lifetime bound is reached.

    Seed 002 counts every failure that passed its lock check. Inside a lock in force, a
    failure within ``lockout.in_flight_ms`` of the lock coming into force passed the
    gateway's check while the decision was in flight: it is counted, and re-issues the
    lock when its own lock is longer on the curve or is the lifetime bound (so the
    allowance is the seed's at any decision latency up to ``in_flight_ms``). A later one
    is taken as refused but not reported (the simulator models no gateway): not
    counted. A lock in force is never shortened. Event time only: replay = live."""
    key = lock_key(attempt.tenant, attempt.account)
    streak = counted_entry(shard, rules, key, out)
    if seq >= 0 and streak.seq >= seq:
        return
    now = attempt.occurred_ms
    held = now < streak.blocked_until_ms or now < streak.hold_until_ms
    lock = rules.policy.lockout
    in_flight = (
        held
        and now < streak.held_since_ms + lock.in_flight_ms
        and streak.in_flight < rules.in_flight_max
    )
    if held and not in_flight and rules.streak_cfg[streak.rule].mode == "enforce":
        return  # the lock refused it (seed 002 refuses before counting): not counted
    if in_flight:
        streak.in_flight += 1
    streak.count += 1
    n = streak.count
    longer = False
    if n >= rules.lifetime_threshold:
        rule, expires = "lifetime_bound", _hold_end(rules, now)
    else:
        length = lock_ms(n, lock.threshold, lock.base_ms, lock.step, lock.cap_ms)
        rule, expires = "lockout", now + length if length else 0
        longer = length > lock_ms(n - 1, lock.threshold, lock.base_ms, lock.step, lock.cap_ms)
    if expires and (
        not held
        or rule != streak.rule
        or (in_flight and longer and expires > streak.blocked_until_ms)
    ):
        if not held:
            streak.held_since_ms = now
            streak.in_flight = 0
        _hold(shard, attempt, rules, key, streak, rule, expires, None, None, out)
        if rules.streak_cfg[rule].mode == "enforce":
            reason = "consecutive_lock" if rule == "lockout" else rule
            notify_owner(shard, attempt, rules, streak, reason, streak.blocked_until_ms, out)
    mark_streak(shard, key, streak, seq)


def mfa_failure(
    shard: Shard,
    attempt: Attempt,
    rules: TenantRules,
    key: Key,
    source: str | None,
    device: str | None,
    out: Outbox,
    seq: int,
) -> None:
    """Seed 004: the n-th consecutive second-factor failure makes the next attempt
    wait ``factor * 2**(n-1)`` (capped)."""
    streak = counted_entry(shard, rules, key, out)
    if seq >= 0 and streak.seq >= seq:
        return
    if (
        attempt.occurred_ms < streak.blocked_until_ms
        and rules.streak_cfg["mfa_curve"].mode == "enforce"
    ):
        return  # refused by the wait, not a failure of the factor (seed 004)
    streak.count += 1
    curve = rules.policy.mfa_curve
    expires = attempt.occurred_ms + wait_ms(streak.count, curve.factor_ms, curve.cap_ms)
    if expires > streak.blocked_until_ms:
        _hold(shard, attempt, rules, key, streak, "mfa_curve", expires, source, device, out)
    mark_streak(shard, key, streak, seq)


def device_bound_failure(
    shard: Shard, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int
) -> None:
    """One more distinct trusted device failing for the account within the device
    window. Past ``trusted_devices_per_account`` of them the account's trusted devices
    are refused (``device|t|a|-|-``, rule ``device_bound``) for rule 6's backoff at its
    level (15, 30, 60 min ...: each trip before a success is longer): a login service
    that marks a fresh device id trusted on every guess (a bug, or a forged event) gets
    that many guesses per block, not unlimited ones. Each such device also counts in the
    bound's ``run`` (cleared by a success): at ``lifetime.threshold`` the bound holds the
    trusted devices like the lifetime bound (until a success or a reset, published for
    ``lifetime.publish_ms`` and renewed).

    For ``familiar.after_reset_ms`` after a new password the account's trusted
    failures are its owner's stale clients (``stale``): they count in the run, never
    towards the window's trip. The owner's few real devices never reach it."""
    key = device_bound_key(attempt.tenant, attempt.account)
    streak = counted_entry(shard, rules, key, out)
    if seq >= 0 and streak.seq >= seq:
        return
    now = attempt.occurred_ms
    if now < streak.hold_until_ms and rules.streak_cfg["device_bound"].mode == "enforce":
        return  # refused by the hold: not a check of the password
    streak.run += 1
    if streak.run >= rules.lifetime_threshold and not streak.hold_until_ms:
        _hold(
            shard,
            attempt,
            rules,
            key,
            streak,
            "device_bound",
            _hold_end(rules, now),
            None,
            None,
            out,
        )
        mark_streak(shard, key, streak, seq)
        return
    if not _stale(rules, attempt):
        window_ms = rules.device.cfg.window_ms
        if now >= streak.notice_until_ms:  # the field ends the current window here
            streak.count = 0
            streak.notice_until_ms = now + window_ms
            if now >= streak.blocked_until_ms + window_ms:
                streak.level = 0  # a whole window quiet after its last block: start over
        streak.count += 1
        if streak.count > rules.trusted_devices_per_account and now >= streak.blocked_until_ms:
            streak.level += 1
            expires = now + rules.policy.backoff.block_ms(streak.level)
            _hold(shard, attempt, rules, key, streak, "device_bound", expires, None, None, out)
    mark_streak(shard, key, streak, seq)


def device_bound_success(
    shard: Shard, rules: TenantRules, attempt: Attempt, out: Outbox, seq: int
) -> None:
    """A password success of the account: the device bound's ``run`` (its feed of the
    lifetime bound) starts over, and an untrusted success ends a hold until a success.
    Neither the window's count nor the backoff's level is cleared (a trusted device's
    sign-in says nothing of forged ids, as ``lockout.trusted_success_clears``); a reset
    clears everything (``clear_lock``)."""
    key = device_bound_key(attempt.tenant, attempt.account)
    streak = rules.streaks.mapping.get(key)
    trusted = bool(attempt.trusted and attempt.device)
    if streak is None:
        if not trusted:
            lift_lock(shard, out, key, trusted_only_hold=True)
        return
    if seq >= 0 and streak.seq >= seq:
        return
    streak.run = 0
    if streak.hold_until_ms and not trusted:
        streak.hold_until_ms = 0
        streak.blocked_until_ms = 0
        shard.lift(out, key)
    mark_streak(shard, key, streak, seq)


def _stale(rules: TenantRules, attempt: Attempt) -> bool:
    """The account got a new password within ``familiar.after_reset_ms`` (its owner's
    stale clients still fail: ``Shard.owner_proved``)."""
    entry = rules.familiar.mapping.get(reset_key(attempt.tenant, attempt.account))
    return entry is not None and entry.blocked_until_ms > attempt.occurred_ms


def mfa_bound_failure(
    shard: Shard, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int
) -> None:
    """NIST SP 800-63B for one-time codes, per account: one more consecutive second-factor
    failure of the account, whatever its device, cookie or session; at the bound the
    account's second-factor checks are refused until a success or a reset (or
    ``lifetime.block_ms``), published for ``lifetime.publish_ms`` and renewed. A fresh
    cookie per guess resets the per-device curve, never this count."""
    key = mfa_account_key(attempt.tenant, attempt.account)
    streak = counted_entry(shard, rules, key, out)
    if seq >= 0 and streak.seq >= seq:
        return
    now = attempt.occurred_ms
    held = now < streak.blocked_until_ms or now < streak.hold_until_ms
    if held and rules.streak_cfg["mfa_bound"].mode == "enforce":
        return  # refused by the bound: not a check of the factor
    streak.count += 1
    if streak.count >= rules.mfa_bound_threshold and not held:
        expires = _hold_end(rules, now)
        _hold(shard, attempt, rules, key, streak, "mfa_bound", expires, None, None, out)
    mark_streak(shard, key, streak, seq)


def _hold_end(rules: TenantRules, now_ms: int) -> int:
    """When a hold of the lifetime bound's kind ends: ``lifetime.block_ms`` from now, or
    ``FOREVER_MS`` (until a success or a reset)."""
    block_ms = rules.lifetime_block_ms
    return FOREVER_MS if block_ms >= FOREVER_MS else now_ms + block_ms


def _hold(
    shard: Shard,
    attempt: Attempt,
    rules: TenantRules,
    key: Key,
    streak: StreakState,
    rule: str,
    expires: int,
    source: str | None,
    device: str | None,
    out: Outbox,
) -> None:
    """Issue the decision of ``rule`` on ``key`` until ``expires``: published until then,
    or, past ``lifetime.publish_ms``, for that long and renewed (``renew_holds``)."""
    streak.rule = rule
    _publish(shard, rules, key, streak, attempt.occurred_ms, expires, source, device, out)


def _publish(
    shard: Shard,
    rules: TenantRules,
    key: Key,
    streak: StreakState,
    now: int,
    expires: int,
    source: str | None,
    device: str | None,
    out: Outbox,
) -> None:
    published = expires
    streak.hold_until_ms = 0
    if streak.rule in HOLD_RULES and expires - now > rules.hold_publish_ms:
        published = now + rules.hold_publish_ms
        streak.hold_until_ms = expires
        renew_ms = now + rules.hold_publish_ms // 2
        heappush(rules.renewals, (renew_ms, key))
        if renew_ms < shard.renew_due_ms:
            shard.renew_due_ms = renew_ms
    streak.blocked_until_ms = published
    streak.decision_id = shard.issue(
        out,
        streak.rule,
        key[0],
        key,
        key[1],
        key[2],
        source,
        device,
        rules.streak_cfg[streak.rule],
        streak.count,
        now,
        published,
    )


def renew_holds(shard: Shard, out: Outbox) -> None:
    """Publish again, for ``lifetime.publish_ms``, every hold whose decision has run half
    its time while the hold lasts (event time: the shard's watermark), in every tenant of
    the shard. A heap per tenant, and the shard's earliest due time: O(1) per event when
    nothing is due, whatever the number of tenants. A hold written by a version that
    published it for a century is published again for the bounded time at the first check
    after a restore."""
    now = shard.watermark_ms
    if now < shard.renew_due_ms:
        return
    due = FOREVER_MS
    for rules in shard.tenants.values():
        if not rules.renewals_ready:
            _schedule_restored(rules, now)
        renewals = rules.renewals
        while renewals and renewals[0][0] <= now:
            key = heappop(renewals)[1]
            streak = rules.streaks.mapping.get(key)
            if streak is None or not streak.hold_until_ms:
                continue  # lifted, or evicted (its decision tombstoned then)
            if streak.hold_until_ms <= now:
                streak.hold_until_ms = 0  # a hold of lifetime.block_ms ended
                mark_streak(shard, key, streak, -1)
                continue
            left = streak.blocked_until_ms - now
            if rules.hold_publish_ms // 2 < left <= rules.hold_publish_ms:
                continue  # renewed since this was scheduled: its own entry is due later
            _publish(shard, rules, key, streak, now, streak.hold_until_ms, None, None, out)
            mark_streak(shard, key, streak, -1)
        if renewals and renewals[0][0] < due:
            due = renewals[0][0]
    shard.renew_due_ms = due


def _schedule_restored(rules: TenantRules, now: int) -> None:
    """Schedule the renewal of every hold the table holds (once per tenant: a restore
    rebuilt the table, not the heap)."""
    rules.renewals_ready = True
    for key, streak in rules.streaks.items():
        if streak.rule not in HOLD_RULES or streak.blocked_until_ms <= now:
            continue
        if streak.hold_until_ms:
            heappush(rules.renewals, (streak.blocked_until_ms - rules.hold_publish_ms // 2, key))
        elif streak.blocked_until_ms - now > rules.hold_publish_ms:
            # Published for a century by an older version: renew at once, bounded.
            streak.hold_until_ms = streak.blocked_until_ms
            heappush(rules.renewals, (now, key))


def clear_lock(
    shard: Shard, rules: TenantRules, key: Key, out: Outbox, seq: int, trusted_only: bool = False
) -> None:
    """A success or a reset of the account clears the streak at ``key`` and lifts its
    decision, or, with no entry there, lifts what the index holds (``lift_lock``). With
    ``trusted_only`` (a trusted device's success) only a hold until a success is
    cleared: the lock's run is the stranger's, not the owner's device's."""
    streak = rules.streaks.mapping.get(key)
    if streak is None:
        lift_lock(shard, out, key, trusted_only)
    elif not trusted_only or (streak.rule in HOLD_RULES and holds(streak, shard.watermark_ms)):
        clear_streak(shard, key, streak, out, seq)


def clear_streak(shard: Shard, key: Key, streak: StreakState, out: Outbox, seq: int) -> None:
    """A success ends the run and lifts the lock it holds (seed 002: same step)."""
    if seq >= 0 and streak.seq >= seq:
        return
    streak.count = 0
    streak.hold_until_ms = 0
    streak.in_flight = 0
    streak.level = 0
    streak.run = 0
    if streak.blocked_until_ms:
        streak.blocked_until_ms = 0
        shard.lift(out, key)
    mark_streak(shard, key, streak, seq)


def mark_streak(shard: Shard, key: Key, streak: StreakState, seq: int) -> None:
    if seq > streak.seq:
        streak.seq = seq
    if shard.track_changes:
        shard.dirty[("streaks", key)] = None


def notify_owner(
    shard: Shard,
    attempt: Attempt,
    rules: TenantRules,
    streak: StreakState,
    reason: str,
    expires: int,
    out: Outbox,
) -> None:
    """Seed 001's unlock mail: at most one notice per account per notice window."""
    now = attempt.occurred_ms
    window_ms = rules.notice_window_ms
    if not window_ms or now < streak.notice_until_ms:
        return
    streak.notice_until_ms = now + window_ms
    out.notices.append(
        build_notice(
            attempt.tenant, attempt.account, reason, now, expires, window_ms, shard.version
        )
    )
