"""Ingest's watermarks: how far in event time each input partition has been read.

The account stage releases a row only once every input partition has marked a later
event time (``pipeline.core.sequence``), so ingest sends, with every envelope and to
every account partition, a mark per input partition it reads: "nothing earlier than
this will come from that partition". Pure apart from ``wall_ms``, which the shell
passes in; the wall clock only decides when a partition counts as idle.

* a partition being read marks the newest event time it delivered (producers write each
  partition in event-time order; a row that breaks it is applied late, and counted);
* a partition read to its end (and silent) for ``idle_ms`` of wall time in a row must
  not hold the others back: it marks ``slack_ms`` of event time below the oldest event
  that reached any partition in the last ``idle_ms`` (a producer's next event there is
  about as new as what the others receive now, live or replaying a backlog);
* when every partition is read to its end and silent for ``idle_ms``, everything read is
  released (mark = newest + 1): the tail of a replayed backlog, or a quiet moment. While
  the stream is live (its newest event arrived within ``slack_ms`` of occurring) the
  mark is the wall clock less ``slack_ms`` if that is later, so another worker's input
  partitions are not held back by this one's quiet ones. A producer writing the past
  (a backfill, ``simulate --speedup 0``) that pauses longer than ``idle_ms`` is not
  live: the wall clock would pass the events it writes next and make them late.

The reordering therefore costs a live event at most the time until every input
partition has delivered a later event, and at most ``idle_ms`` of wall time plus
``slack_ms`` of event time when one of them is quiet. With several workers, a worker
whose partitions all went quiet holds the others' rows newer than its newest event until
its partitions receive input again (delayed, never reordered).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from pipeline.core.sequence import NO_MARK

DEFAULT_IDLE_MS = 500
DEFAULT_SLACK_MS = 1000


class InputMarks:
    """Per input partition: newest event time read, and when a record last arrived."""

    def __init__(self, idle_ms: int = DEFAULT_IDLE_MS, slack_ms: int = DEFAULT_SLACK_MS) -> None:
        self.idle_ms = idle_ms
        self.slack_ms = slack_ms
        self.latest: dict[int, int] = {}
        self.arrived_ms: dict[int, int] = {}
        self.caught_up_ms: dict[int, int] = {}
        self.flush_ms: int | None = None
        # The newest event time read on any partition, and wall time minus it when it was
        # read (None: nothing read yet).
        self.newest_ms = NO_MARK
        self.newest_lag_ms: int | None = None
        # (wall_ms, oldest event time) of recent arrivals, for the idle partitions' marks.
        self.recent: deque[tuple[int, int]] = deque()

    def observe(self, partition: int, occurred_ms: int | None, wall_ms: int) -> None:
        """A record of ``partition`` was read (``occurred_ms`` None: it was invalid)."""
        self.arrived_ms[partition] = wall_ms
        if occurred_ms is None:
            return
        if occurred_ms > self.latest.get(partition, NO_MARK):
            self.latest[partition] = occurred_ms
            if occurred_ms >= self.newest_ms:
                self.newest_ms = occurred_ms
                self.newest_lag_ms = wall_ms - occurred_ms
        recent = self.recent
        if recent and recent[-1][0] == wall_ms:
            if occurred_ms < recent[-1][1]:
                recent[-1] = (wall_ms, occurred_ms)
        else:
            recent.append((wall_ms, occurred_ms))

    def marks(
        self, assigned: Iterable[int], caught_up: Iterable[int], wall_ms: int
    ) -> list[list[int]]:
        """``[partition, mark_ms]`` for every assigned partition that has one."""
        parts = sorted(assigned)
        done = set(caught_up)
        for p in parts:
            if p in done:
                self.caught_up_ms.setdefault(p, wall_ms)
            else:
                self.caught_up_ms.pop(p, None)
        if not self.latest:
            return []
        top = self.newest_ms
        idle = {
            p
            for p in parts
            if p in done
            and wall_ms - max(self.caught_up_ms[p], self.arrived_ms.get(p, NO_MARK)) >= self.idle_ms
        }
        if len(idle) == len(parts):
            # Past the newest event this ingest read, and while live no lower than the wall
            # clock less the slack: what another worker's ingest (or this one before a
            # restart) read later than that is released too, and a live producer's next
            # event is newer.
            # Taken once per quiet period: marks that follow the wall clock would send
            # envelopes through every stage every batch while nothing happens.
            if self.flush_ms is None:
                live = self.newest_lag_ms is not None and self.newest_lag_ms <= self.slack_ms
                self.flush_ms = max(top + 1, wall_ms - self.slack_ms) if live else top + 1
            return [[p, self.flush_ms] for p in parts]
        self.flush_ms = None
        recent = self.recent
        while recent and recent[0][0] < wall_ms - self.idle_ms:
            recent.popleft()
        floor = min(t for _, t in recent) - self.slack_ms if recent else NO_MARK
        out = []
        for p in parts:
            mark = self.latest.get(p, NO_MARK)
            if p in idle:
                mark = max(mark, floor)
            if mark > NO_MARK:
                out.append([p, mark])
        return out
