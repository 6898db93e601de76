"""Keeping each agent's input in offset order with no gap, whatever faust drops.

faust-streaming 0.15 can lose fetched messages at the end of a rebalance: its recovery
resumes the stream partitions, seeks them to the committed offsets, and only then resumes
flow control, and resuming flow control clears every agent's queue. Messages the fetcher
delivered in between are dropped while the consumer position is already past them, so
they are not fetched again until the next rebalance, and the messages after them arrive
first (measured here: after a SIGKILL and restart, a quarter to a half of the pending
envelopes were stranded in most runs). faust's commit also skips such holes once later
offsets are acknowledged. The stages' upstream watermarks need envelopes in order (an
envelope applied after a later one would see its rows as replays), so the shell does not
trust delivery order and checks it here.

``InputOrder`` is the pure part: given the offset the stage expects next on a partition
(persisted with its state, so it survives restarts), each delivered message is applied,
skipped as a replay, or held back as out of order; a hole is answered by seeking the
partition back to the expected offset, at most once per ``retry_s`` while the offsets
still queued behind the hole drain. ``stranded`` covers a hole at the end of a partition
(nothing arrives to reveal it): messages exist past the expected offset while the agent
sits idle for ``stranded_after_s`` seconds. That is much longer than ``retry_s`` because
an idle agent behind its high watermark is also what faust's single delivery loop looks
like when it is blocked on another agent's full queue (seen for 2-3 s under saturation):
a needless seek only re-delivers replays, but it throws away fetched data and repeats.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

DEFAULT_RETRY_S = 2.0
DEFAULT_STRANDED_AFTER_S = 10.0


class Admit(Enum):
    """What to do with a delivered message."""

    APPLY = "apply"  # the expected offset
    REPLAY = "replay"  # already applied: skip it
    SEEK = "seek"  # out of order: skip it and seek back to the expected offset
    WAIT = "wait"  # out of order, seek already sent: skip it and let the seek work


@dataclass
class InputOrder:
    """Per input partition: when a seek back to the expected offset was last sent."""

    retry_s: float = DEFAULT_RETRY_S
    stranded_after_s: float = DEFAULT_STRANDED_AFTER_S
    sought_s: dict[Hashable, tuple[int, float]] = field(default_factory=dict)
    behind_since_s: dict[Hashable, tuple[int, float]] = field(default_factory=dict)

    def admit(self, tp: Hashable, offset: int, expected: int, now_s: float) -> Admit:
        """How to treat the message at ``offset`` when the stage expects ``expected``."""
        if offset == expected:
            self.sought_s.pop(tp, None)
            return Admit.APPLY
        if offset < expected:
            return Admit.REPLAY
        last = self.sought_s.get(tp)
        if last is not None and last[0] == expected and now_s - last[1] < self.retry_s:
            return Admit.WAIT
        self.sought_s[tp] = (expected, now_s)
        return Admit.SEEK

    def stranded(
        self, tp: Hashable, *, expected: int, highwater: int | None, idle: bool, now_s: float
    ) -> bool:
        """True when ``tp`` should be sought back to ``expected``: messages exist from
        there on, the agent is idle, and that has lasted ``stranded_after_s`` (a busy agent
        may simply not have reached ``tp`` yet)."""
        if highwater is None or highwater <= expected or not idle:
            self.behind_since_s.pop(tp, None)
            return False
        since = self.behind_since_s.get(tp)
        if since is None or since[0] != expected:
            self.behind_since_s[tp] = (expected, now_s)
            return False
        if now_s - since[1] < self.stranded_after_s:
            return False
        self.behind_since_s[tp] = (expected, now_s)
        return True

    def forget(self, tp: Hashable) -> None:
        """``tp`` was revoked."""
        self.sought_s.pop(tp, None)
        self.behind_since_s.pop(tp, None)


DEFAULT_STUCK_AFTER_S = 300.0


@dataclass
class Watchdog:
    """Per stage partition: how long it has had input waiting and made no progress.

    Invariant: ``observe`` returns 0 for a partition with nothing waiting, and otherwise
    the seconds since its progress ``mark`` last changed (the offset its stage expects
    next, or a restore's records read while it is not yet restored). Any change of the
    mark starts the count again, so a partition that moves, however slowly, or a restore
    that reads, is never stuck; only one that moves not at all for ``stuck_after_s`` while
    messages wait for it is (``stuck``). The worker restarts itself then
    (``pipeline.stream.app``): what it holds is in its changelogs, so a restart loses and
    doubles nothing, and it reads every partition afresh."""

    stuck_after_s: float = DEFAULT_STUCK_AFTER_S
    since_s: dict[Hashable, tuple[int, float]] = field(default_factory=dict)

    def observe(self, tp: Hashable, *, mark: int, waiting: bool, now_s: float) -> float:
        """Seconds ``tp`` has had input ``waiting`` with its progress ``mark`` unchanged."""
        if not waiting:
            self.since_s.pop(tp, None)
            return 0.0
        since = self.since_s.get(tp)
        if since is None or since[0] != mark:
            self.since_s[tp] = (mark, now_s)
            return 0.0
        return now_s - since[1]

    def stuck(self, tp: Hashable, *, mark: int, waiting: bool, now_s: float) -> bool:
        """True once ``tp`` has waited ``stuck_after_s`` without progress."""
        return self.observe(tp, mark=mark, waiting=waiting, now_s=now_s) >= self.stuck_after_s

    def forget(self, tp: Hashable) -> None:
        """``tp`` was revoked."""
        self.since_s.pop(tp, None)


class InputPosition:
    """Per stage partition: the offset of the next input message to apply, and after a
    restore with rows held, the offset below which messages only hold their rows again
    (``hold_from`` up to the restored ``next``: ``pipeline.stream.stages``). Both stages and
    the rollup keep their input position through this."""

    def __init__(self) -> None:
        self.next_envelope: dict[int, int | None] = {}
        self.rehold_until: dict[int, int] = {}

    def expected(self, partition: int) -> int | None:
        """Offset of the next message to apply on ``partition`` (None: not yet known)."""
        return self.next_envelope.get(partition)

    def resume(self, partition: int, next_offset: int | None, hold_from: int | None) -> None:
        """Restored: apply from ``hold_from`` on, only holding rows again below ``next``."""
        self.next_envelope[partition] = next_offset
        self.rehold_until.pop(partition, None)
        if next_offset is not None and hold_from is not None and hold_from < next_offset:
            self.next_envelope[partition] = hold_from
            self.rehold_until[partition] = next_offset

    def reholding(self, partition: int, offset: int) -> bool:
        """True while ``offset`` is below the restored commit record's next message."""
        return offset < self.rehold_until.get(partition, -1)

    def advance(self, partition: int, offset: int) -> None:
        """Message ``offset`` was applied (or its rows held again)."""
        self.next_envelope[partition] = offset + 1
        if self.rehold_until.get(partition, -1) <= offset + 1:
            self.rehold_until.pop(partition, None)

    def skip_to(self, partition: int, offset: int) -> None:
        """Apply ``partition``'s input from ``offset`` on: the messages before it are gone
        (past the topic's retention), and so are the rows they held."""
        self.next_envelope[partition] = offset
        if self.rehold_until.get(partition, -1) <= offset:
            self.rehold_until.pop(partition, None)

    def forget(self, partition: int) -> None:
        self.next_envelope.pop(partition, None)
        self.rehold_until.pop(partition, None)
