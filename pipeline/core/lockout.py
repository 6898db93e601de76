"""Consecutive-failure state: the seeds' curves and the records that carry them.

Two curves, both pure functions of the consecutive count ``n`` (nothing decays with time;
only a success clears ``n``):

* seed 002's account lock: ``lock_ms(n)`` is 0 below ``threshold``, else
  ``min(cap, base * 2**(n // step - 1))`` (defaults 900 s at 5-9, 1,800 s at 10-14,
  3,600 s from 15 on);
* seed 004's second-factor wait: ``wait_ms(n)`` is ``min(cap, factor * 2**(n - 1))``
  after the n-th consecutive failure (1, 2, 4, 8 ... s, capped at an hour).

``StreakState`` is one key's record in the shard's ``streaks`` table (the account lock,
keyed ``lock|t|a|-|-``, and the second-factor curve, keyed like the mfa rule). Its
``keep_until_ms`` is ``FOREVER_MS``: the table's ``entry_cap`` bounds memory, not time
(an entry holding a decision is skipped at the cap: ``holds``).
"""

from __future__ import annotations

FOREVER_MS = 1 << 62
"""``keep_until_ms`` of a record that never decays: only the table's cap evicts it."""


def lock_ms(n: int, threshold: int, base_ms: int, step: int, cap_ms: int) -> int:
    """Seed 002: how long ``n`` consecutive failures lock the account (0: no lock)."""
    if n < threshold:
        return 0
    shift = n // step - 1
    if shift <= 0:
        return min(cap_ms, base_ms)
    # base >= 1, so a shift past cap's bit length already exceeds the cap: clamping the
    # shift there keeps a huge n cheap and still exact.
    return min(cap_ms, base_ms << min(shift, cap_ms.bit_length()))


def wait_ms(n: int, factor_ms: int, cap_ms: int) -> int:
    """Seed 004: the wait after the ``n``-th consecutive failure (0 before any)."""
    if n <= 0:
        return 0
    return min(cap_ms, factor_ms << min(n - 1, cap_ms.bit_length()))


class StreakState:
    """A consecutive-failure count and the lock it holds.

    ``count`` is the run of consecutive counted failures (a success sets it to 0);
    ``blocked_until_ms``/``decision_id``/``rule`` describe the active decision, if any;
    ``notice_until_ms`` ends the window in which the owner was already sent a notice;
    ``seq`` makes a replayed event idempotent for this key (see ``state``);
    ``held_since_ms`` is when the lock in force came into force (the account lock's
    in-flight allowance is measured from it; 0 in records written before it existed);
    ``hold_until_ms`` is when a hold published for a bounded time and renewed really ends
    (``FOREVER_MS``: until a success or a reset; 0: no such hold);
    ``in_flight`` counts the failures counted inside the current lock's in-flight
    allowance (``lockout.in_flight_max`` bounds it); ``level`` is the escalation (rule 6's
    backoff) of a bound that trips again and again (``device_bound``); ``run`` counts
    the trusted devices that failed for the account since its last success (the device
    bound's feed of the lifetime bound).
    """

    __slots__ = (
        "blocked_until_ms",
        "count",
        "decision_id",
        "held_since_ms",
        "hold_until_ms",
        "in_flight",
        "keep_until_ms",
        "level",
        "notice_until_ms",
        "rule",
        "run",
        "seq",
    )

    def __init__(self) -> None:
        self.count = 0
        self.blocked_until_ms = 0
        self.decision_id = ""
        self.rule = ""
        self.notice_until_ms = 0
        self.keep_until_ms = FOREVER_MS
        self.seq = -1
        self.held_since_ms = 0
        self.hold_until_ms = 0
        self.in_flight = 0
        self.level = 0
        self.run = 0

    def dump(self) -> list[object]:
        return [
            self.count,
            self.blocked_until_ms,
            self.decision_id,
            self.rule,
            self.notice_until_ms,
            self.keep_until_ms,
            self.seq,
            self.held_since_ms,
            self.hold_until_ms,
            self.in_flight,
            self.level,
            self.run,
        ]

    @classmethod
    def load(cls, data: list[object]) -> StreakState:
        state = cls()
        if len(data) > 7:
            state.held_since_ms = data[7]  # type: ignore[assignment]
        if len(data) > 11:  # records written before bounded holds have 8 fields
            (state.hold_until_ms, state.in_flight, state.level, state.run) = data[8:12]  # type: ignore[assignment]
        (
            state.count,
            state.blocked_until_ms,
            state.decision_id,
            state.rule,
            state.notice_until_ms,
            state.keep_until_ms,
            state.seq,
        ) = data[:7]  # type: ignore[assignment]
        return state


def holds(entry: StreakState, now_ms: int) -> bool:
    """Whether the entry holds a decision at ``now_ms`` (its lock, its curve's wait or a
    renewed hold): the streaks table never evicts such an entry while it can pick
    another (``BoundedTable``'s ``pinned``)."""
    return entry.blocked_until_ms > now_ms or entry.hold_until_ms > now_ms
