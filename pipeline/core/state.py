"""Per-key state records of the core's tables and their compact serialised form.

Every record has ``keep_until_ms`` (when the bounded table may drop it) and ``seq``
(the position in its input stream of the last event applied to it). ``seq`` makes
replays idempotent per key: after a crash, an event at or below a key's ``seq`` was
already applied to that key and is skipped for it, even if the state was flushed
only partly before the crash.
"""

from __future__ import annotations

import struct

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
        "_challenges",
        "_distinct",
        "_failures",
        "_successes",
        "_unknown",
        "block_rule",
        "blocked_until_ms",
        "challenge_size",
        "decision_id",
        "keep_until_ms",
        "redeemed_until_ms",
        "seq",
        "spray_alerted_until_ms",
        "spray_size",
        "stranger_account",
        "stranger_since_ms",
        "stranger_window",
        "stuffing_alerted_until_ms",
        "stuffing_size",
        "successes_size",
        "tenant_window",
        "unknown_size",
        "vouch_count",
        "vouch_period",
        "vouch_prev",
    )

    def __init__(self, spray_ring: int, stuffing_ring: int, challenge_ring: int = 1) -> None:
        # The rings are made on first use (a failure, a challenge): most sources a worker
        # knows only ever saw successes (a familiar place), and five empty rings were 320
        # of its 512 bytes. Until then a ring dumps as the empty ring of its size.
        self._distinct: Ring | None = None
        self._failures: Ring | None = None
        self._unknown: Ring | None = None
        self._successes: Ring | None = None
        self._challenges: Ring | None = None
        self.spray_size = spray_ring
        self.stuffing_size = stuffing_ring
        self.unknown_size = stuffing_ring
        self.successes_size = stuffing_ring
        self.challenge_size = challenge_ring
        self.spray_alerted_until_ms = 0
        self.stuffing_alerted_until_ms = 0
        self.blocked_until_ms = 0
        self.decision_id = ""
        self.keep_until_ms = 0
        self.seq = -1
        self.tenant_window = -1
        self.redeemed_until_ms = 0
        self.block_rule = ""
        self.vouch_period = -1
        self.vouch_count = 0
        self.vouch_prev = 0
        self.stranger_window = -1
        self.stranger_since_ms = 0
        self.stranger_account = ""

    @property
    def distinct(self) -> Ring:
        """Distinct failing accounts per spray bucket (made on first use)."""
        ring = self._distinct
        if ring is None:
            ring = self._distinct = Ring(self.spray_size)
        return ring

    @property
    def failures(self) -> Ring:
        """Failures per stuffing bucket (made on first use)."""
        ring = self._failures
        if ring is None:
            ring = self._failures = Ring(self.stuffing_size)
        return ring

    @property
    def unknown(self) -> Ring:
        """Unknown-account failures of new pairs per stuffing bucket (made on first use)."""
        ring = self._unknown
        if ring is None:
            ring = self._unknown = Ring(self.unknown_size)
        return ring

    @property
    def successes(self) -> Ring:
        """The removed per-source stuffing block's successes (no rule writes it)."""
        ring = self._successes
        if ring is None:
            ring = self._successes = Ring(self.successes_size)
        return ring

    @property
    def challenges(self) -> Ring:
        """Failed challenges per bucket (made on first use)."""
        ring = self._challenges
        if ring is None:
            ring = self._challenges = Ring(self.challenge_size)
        return ring

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
            _ring_dump(self._distinct, self.spray_size),
            _ring_dump(self._failures, self.stuffing_size),
            _ring_dump(self._unknown, self.unknown_size),
            self.spray_alerted_until_ms,
            self.stuffing_alerted_until_ms,
            self.blocked_until_ms,
            self.decision_id,
            self.keep_until_ms,
            self.seq,
            self.tenant_window,
            self.redeemed_until_ms,
            self.block_rule,
            _ring_dump(self._successes, self.successes_size),
            _ring_dump(self._challenges, self.challenge_size),
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
        state._distinct, state.spray_size = _ring_load(data[0])  # type: ignore[arg-type]
        state._failures, state.stuffing_size = _ring_load(data[1])  # type: ignore[arg-type]
        state._unknown, state.unknown_size = _ring_load(data[2])  # type: ignore[arg-type]
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
            state._successes, state.successes_size = _ring_load(data[12])  # type: ignore[arg-type]
            if len(data) >= 17:  # records written before challenges and vouches have 13
                state._challenges, state.challenge_size = _ring_load(data[13])  # type: ignore[arg-type]
                state.vouch_period, state.vouch_count, state.vouch_prev = data[14:17]  # type: ignore[assignment]
            if len(data) >= 20:  # records written before the strangers tier have 17
                pending = data[17:20]
                state.stranger_window = pending[0]  # type: ignore[assignment]
                state.stranger_since_ms = pending[1]  # type: ignore[assignment]
                state.stranger_account = pending[2]  # type: ignore[assignment]
        elif state.blocked_until_ms:
            state.block_rule = "source"
        return state


def _ring_dump(ring: Ring | None, size: int) -> list[int]:
    """A ring's changelog form; a ring not made yet is the empty ring of ``size``."""
    if ring is None:
        return [-1, *([0] * size)]
    return ring.dump()


def _ring_load(data: list[int]) -> tuple[Ring | None, int]:
    """A dumped ring and its size; None for the empty ring never used (head -1, all 0),
    which dumps back the same."""
    if data[0] == -1 and not any(data[1:]):
        return None, len(data) - 1
    ring = Ring.load(data)
    return ring, ring.size


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


# -- the familiar tables' entries, packed (issue 45 item 2) ----------------------------------
#
# A familiar-table entry (``lockout.StreakState``: a published exempt, a known place, a
# passed CAPTCHA or a new password) uses six of its twelve fields. ``pack_streak`` keeps
# such an entry's changelog record (``StreakState.dump``) as one bytes object, about 80
# bytes instead of about 290 in objects (the record, its ints, its decision id), and
# ``unpack_streak`` gives the same record back, field for field. A record it cannot keep
# exactly (a count, a hold, another rule, an id that is not 32 lowercase hex digits, an
# int outside 64 bits) is not packed: the table keeps the object.

_SHORT = struct.Struct("<Bqqq")
"""flags, blocked_until_ms, notice_until_ms, seq (``keep_until_ms`` is ``blocked_until_ms``)."""
_LONG = struct.Struct("<Bqqqq")
"""The same and ``keep_until_ms``."""
_RULE_FAMILIAR = 1
_HAS_ID = 2
_KEEP_IS_BLOCKED = 4
_INT64 = 1 << 63
_HEX = frozenset("0123456789abcdef")


def _int64(value: object) -> bool:
    return type(value) is int and -_INT64 <= value < _INT64


def pack_streak(record: list[object]) -> bytes | None:
    """A familiar entry's record packed, or None when it cannot be kept exactly."""
    if len(record) != 12:
        return None
    count, blocked, decision_id, rule, notice, keep, seq, *rest = record
    if type(count) is not int or count != 0:
        return None
    if any(type(v) is not int or v != 0 for v in rest):
        return None
    if not (_int64(blocked) and _int64(notice) and _int64(keep) and _int64(seq)):
        return None
    if rule == "familiar":
        flags = _RULE_FAMILIAR
    elif rule == "" and type(rule) is str:
        flags = 0
    else:
        return None
    raw = b""
    if decision_id != "":
        if type(decision_id) is not str or len(decision_id) != 32:
            return None
        if not _HEX.issuperset(decision_id):
            return None
        flags |= _HAS_ID
        raw = bytes.fromhex(decision_id)
    elif type(decision_id) is not str:
        return None
    if keep == blocked:
        return _SHORT.pack(flags | _KEEP_IS_BLOCKED, blocked, notice, seq) + raw
    return _LONG.pack(flags, blocked, notice, seq, keep) + raw


def unpack_streak(packed: bytes) -> list[object]:
    """The record ``pack_streak`` packed, field for field."""
    flags = packed[0]
    if flags & _KEEP_IS_BLOCKED:
        _, blocked, notice, seq = _SHORT.unpack_from(packed)
        keep = blocked
        rest = packed[_SHORT.size :]
    else:
        _, blocked, notice, seq, keep = _LONG.unpack_from(packed)
        rest = packed[_LONG.size :]
    decision_id = rest.hex() if flags & _HAS_ID else ""
    rule = "familiar" if flags & _RULE_FAMILIAR else ""
    return [0, blocked, decision_id, rule, notice, keep, seq, 0, 0, 0, 0, 0]


def packed_keep_until(packed: bytes) -> int:
    """``keep_until_ms`` of a packed record (what the table's expiry reads)."""
    at = 1 if packed[0] & _KEEP_IS_BLOCKED else 25
    return int.from_bytes(packed[at : at + 8], "little", signed=True)
