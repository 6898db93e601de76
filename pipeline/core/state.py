"""Per-key state records of the core's tables and their compact serialised form.

Every record has ``keep_until_ms`` (when the bounded table may drop it) and ``seq``
(the position in its input stream of the last event applied to it). ``seq`` makes
replays idempotent per key: after a crash, an event at or below a key's ``seq`` was
already applied to that key and is skipped for it, even if the state was flushed
only partly before the crash.
"""

from __future__ import annotations

from pipeline.core.window import Ring


class KeyState(Ring):
    """A rule's counter for one key: a sliding-window ring (the entry *is* its ring, so a
    key costs one object and one list, not three objects) plus escalation state.

    ``level`` is the number of consecutive trips without a success (rule 6);
    ``blocked_until_ms`` and ``decision_id`` describe the active decision, if any.
    On the account table the record also carries the failure streak of rule 7 and the
    tenant-spray window the account was last counted in.
    """

    __slots__ = (
        "blocked_until_ms",
        "decision_id",
        "keep_until_ms",
        "level",
        "lifetime_alerted",
        "seq",
        "spray_window",
        "streak",
    )

    def __init__(self, ring_size: int) -> None:
        # Ring.__init__ inlined: a new key on a flood path should cost one frame.
        self.head = -1
        self.total = 0
        self.size = ring_size
        self.slots = None
        self.level = 0
        self.blocked_until_ms = 0
        self.decision_id = ""
        self.keep_until_ms = 0
        self.seq = -1
        self.streak = 0
        self.lifetime_alerted = False
        self.spray_window = -1

    @property
    def ring(self) -> Ring:
        """The window counts (this record itself)."""
        return self

    def dump(self) -> list[object]:  # type: ignore[override]
        return [
            Ring.dump(self),
            self.level,
            self.blocked_until_ms,
            self.decision_id,
            self.keep_until_ms,
            self.seq,
            self.streak,
            self.lifetime_alerted,
            self.spray_window,
        ]

    @classmethod
    def load(cls, data: list[object]) -> KeyState:  # type: ignore[override]
        ring_data, level, blocked, decision_id, keep, seq, streak, alerted, window = data
        state = cls(1)  # no cls.__new__: the module stays compilable with mypyc
        state._load(ring_data)  # type: ignore[arg-type]
        state.level = level  # type: ignore[assignment]
        state.blocked_until_ms = blocked  # type: ignore[assignment]
        state.decision_id = decision_id  # type: ignore[assignment]
        state.keep_until_ms = keep  # type: ignore[assignment]
        state.seq = seq  # type: ignore[assignment]
        state.streak = streak  # type: ignore[assignment]
        state.lifetime_alerted = alerted  # type: ignore[assignment]
        state.spray_window = window  # type: ignore[assignment]
        return state


class SourceState:
    """One source's spray and stuffing signals.

    ``distinct`` counts each (source, account) pair once, in the bucket of its latest
    failure (the pair table remembers which bucket); ``failures`` counts failures and
    ``unknown`` the ``unknown_account`` failures of pairs new in the window (distinct
    unknown accounts) for the credential-stuffing alert. ``successes`` and
    ``redeemed_until_ms`` served the removed per-source stuffing block: no rule reads
    them, they stay in the record so changelogs of either age load alike. ``block_rule`` names the rule of the active decision (``source`` or
    ``challenge_failures``; empty for none; ``stuffing`` in records of the removed
    per-source stuffing block). ``challenges`` counts the source's failed challenges
    (bot evidence); ``vouch_*`` count the accounts that became familiar at the source in
    the current and the previous renew period (``vouch_period``): a source with enough of
    them is shared by real users. ``stranger_window`` is the rule-8 window of the source's
    pending stranger failure (-1: none; ``StrangersConfig``), ``stranger_since_ms`` its
    time and ``stranger_account`` its account: a sign-in there within ``redeem_ms`` of it
    by that account (or one that makes the place familiar) redeems it.
    """

    __slots__ = (
        "block_rule",
        "blocked_until_ms",
        "challenges",
        "decision_id",
        "distinct",
        "failures",
        "keep_until_ms",
        "redeemed_until_ms",
        "seq",
        "spray_alerted_until_ms",
        "stranger_account",
        "stranger_since_ms",
        "stranger_window",
        "stuffing_alerted_until_ms",
        "successes",
        "tenant_window",
        "unknown",
        "vouch_count",
        "vouch_period",
        "vouch_prev",
    )

    def __init__(self, spray_ring: int, stuffing_ring: int, challenge_ring: int = 1) -> None:
        self.distinct = Ring(spray_ring)
        self.failures = Ring(stuffing_ring)
        self.unknown = Ring(stuffing_ring)
        self.successes = Ring(stuffing_ring)
        self.spray_alerted_until_ms = 0
        self.stuffing_alerted_until_ms = 0
        self.blocked_until_ms = 0
        self.decision_id = ""
        self.keep_until_ms = 0
        self.seq = -1
        self.tenant_window = -1
        self.redeemed_until_ms = 0
        self.block_rule = ""
        self.challenges = Ring(challenge_ring)
        self.vouch_period = -1
        self.vouch_count = 0
        self.vouch_prev = 0
        self.stranger_window = -1
        self.stranger_since_ms = 0
        self.stranger_account = ""

    def shared(self, period: int, accounts: int) -> bool:
        """Whether at least ``accounts`` accounts became familiar here in the renew
        ``period`` or the one before it."""
        if self.vouch_period == period:
            return max(self.vouch_count, self.vouch_prev) >= accounts
        return self.vouch_period == period - 1 and self.vouch_count >= accounts

    def vouch(self, period: int) -> None:
        """One more account became familiar here in renew ``period``."""
        if self.vouch_period != period:
            self.vouch_prev = self.vouch_count if self.vouch_period == period - 1 else 0
            self.vouch_count = 0
            self.vouch_period = period
        self.vouch_count += 1

    def dump(self) -> list[object]:
        return [
            self.distinct.dump(),
            self.failures.dump(),
            self.unknown.dump(),
            self.spray_alerted_until_ms,
            self.stuffing_alerted_until_ms,
            self.blocked_until_ms,
            self.decision_id,
            self.keep_until_ms,
            self.seq,
            self.tenant_window,
            self.redeemed_until_ms,
            self.block_rule,
            self.successes.dump(),
            self.challenges.dump(),
            self.vouch_period,
            self.vouch_count,
            self.vouch_prev,
            self.stranger_window,
            self.stranger_since_ms,
            self.stranger_account,
        ]

    @classmethod
    def load(cls, data: list[object]) -> SourceState:
        state = cls(1, 1)
        state.distinct = Ring.load(data[0])  # type: ignore[arg-type]
        state.failures = Ring.load(data[1])  # type: ignore[arg-type]
        state.unknown = Ring.load(data[2])  # type: ignore[arg-type]
        (
            state.spray_alerted_until_ms,
            state.stuffing_alerted_until_ms,
            state.blocked_until_ms,
            state.decision_id,
            state.keep_until_ms,
            state.seq,
            state.tenant_window,
        ) = data[3:10]  # type: ignore[assignment]
        if len(data) >= 12:  # records written before the stuffing rule have 10 fields
            state.redeemed_until_ms, state.block_rule = data[10:12]  # type: ignore[assignment]
            state.successes = Ring.load(data[12])  # type: ignore[arg-type]
            if len(data) >= 17:  # records written before challenges and vouches have 13
                state.challenges = Ring.load(data[13])  # type: ignore[arg-type]
                state.vouch_period, state.vouch_count, state.vouch_prev = data[14:17]  # type: ignore[assignment]
            if len(data) >= 20:  # records written before the strangers tier have 17
                pending = data[17:20]
                state.stranger_window = pending[0]  # type: ignore[assignment]
                state.stranger_since_ms = pending[1]  # type: ignore[assignment]
                state.stranger_account = pending[2]  # type: ignore[assignment]
        elif state.blocked_until_ms:
            state.block_rule = "source"
        return state


class PairState:
    """A (source, account) pair: the bucket its account is counted in for the source."""

    __slots__ = ("bucket", "keep_until_ms")

    def __init__(self) -> None:
        self.bucket = -1
        self.keep_until_ms = 0

    def dump(self) -> list[object]:
        return [self.bucket, self.keep_until_ms]

    @classmethod
    def load(cls, data: list[object]) -> PairState:
        state = cls()
        state.bucket, state.keep_until_ms = data  # type: ignore[assignment]
        return state
