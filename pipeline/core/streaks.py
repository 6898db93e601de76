"""The account shard's consecutive-failure rules: seed 002's lock (and the lifetime bound
it becomes), seed 004's mfa curve, and the owner's notices (seed 001).

A streak has no window: only the order of an account's attempts matters (which the stream
keeps), so a failure too late for the windows still counts here. A streak entry is bounded
by the table's cap, never by time. Every change is recorded in the shard's ``dirty``
record (when it tracks changes) so the changelog carries it.
"""

from __future__ import annotations

from pipeline.core.attempt import PASSWORD_FLOWS, Attempt
from pipeline.core.decisions import lock_key, mfa_account_key, mfa_key
from pipeline.core.keys import Key
from pipeline.core.lockout import StreakState, lock_ms, wait_ms
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


def streak_entry(rules: TenantRules, key: Key) -> StreakState:
    """The streak of ``key``, created if missing, moved to the newest end."""
    entry = rules.streaks.mapping.get(key)
    if entry is None:
        return rules.streaks.create(key, StreakState)
    rules.streaks.mapping.move_to_end(key)
    return entry


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
    streak = streak_entry(rules, key)
    if seq >= 0 and streak.seq >= seq:
        return
    now = attempt.occurred_ms
    held = now < streak.blocked_until_ms
    lock = rules.policy.lockout
    in_flight = held and now < streak.held_since_ms + lock.in_flight_ms
    if held and not in_flight and rules.streak_cfg[streak.rule].mode == "enforce":
        return  # the lock refused it (seed 002 refuses before counting): not counted
    streak.count += 1
    n = streak.count
    longer = False
    if n >= rules.lifetime_threshold:
        rule, expires = "lifetime_bound", now + rules.lifetime_block_ms
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
        _hold(shard, attempt, rules, key, streak, rule, expires, None, None, out)
        if rules.streak_cfg[rule].mode == "enforce":
            reason = "consecutive_lock" if rule == "lockout" else rule
            notify_owner(shard, attempt, rules, streak, reason, expires, out)
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
    streak = streak_entry(rules, key)
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
    are refused for the window (``device|t|a|-|-``, rule ``device_bound``): a login
    service that marks a fresh device id trusted on every guess (a bug, or a forged
    event) gets as many guesses as that, not unlimited ones. The owner's few real
    devices never reach it."""
    key = ("device", attempt.tenant, attempt.account, None, None)
    streak = streak_entry(rules, key)
    if seq >= 0 and streak.seq >= seq:
        return
    now = attempt.occurred_ms
    if now >= streak.notice_until_ms:  # the field ends the current window here
        streak.count = 0
        streak.notice_until_ms = now + rules.device.cfg.window_ms
    streak.count += 1
    if streak.count > rules.trusted_devices_per_account and now >= streak.blocked_until_ms:
        expires = now + rules.device.cfg.window_ms
        _hold(shard, attempt, rules, key, streak, "device_bound", expires, None, None, out)
    mark_streak(shard, key, streak, seq)


def mfa_bound_failure(
    shard: Shard, attempt: Attempt, rules: TenantRules, out: Outbox, seq: int
) -> None:
    """NIST SP 800-63B for one-time codes, per account: one more consecutive second-factor
    failure of the account, whatever its device, cookie or session; at the bound the
    account's second-factor checks are refused until a success (or ``lifetime.block_ms``).
    A fresh cookie per guess resets the per-device curve, never this count."""
    key = mfa_account_key(attempt.tenant, attempt.account)
    streak = streak_entry(rules, key)
    if seq >= 0 and streak.seq >= seq:
        return
    now = attempt.occurred_ms
    if now < streak.blocked_until_ms and rules.streak_cfg["mfa_bound"].mode == "enforce":
        return  # refused by the bound: not a check of the factor
    streak.count += 1
    if streak.count >= rules.mfa_bound_threshold and now >= streak.blocked_until_ms:
        expires = now + rules.lifetime_block_ms
        _hold(shard, attempt, rules, key, streak, "mfa_bound", expires, None, None, out)
    mark_streak(shard, key, streak, seq)


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
    streak.rule = rule
    streak.blocked_until_ms = expires
    streak.decision_id = shard.issue(
        out,
        rule,
        key[0],
        key,
        attempt.tenant,
        attempt.account,
        source,
        device,
        rules.streak_cfg[rule],
        streak.count,
        attempt.occurred_ms,
        expires,
    )


def clear_streak(shard: Shard, key: Key, streak: StreakState, out: Outbox, seq: int) -> None:
    """A success ends the run and lifts the lock it holds (seed 002: same step)."""
    if seq >= 0 and streak.seq >= seq:
        return
    streak.count = 0
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
