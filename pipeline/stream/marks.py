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
  live: the wall clock would pass the events it writes next and make them late;
* while every event read in the last ``idle_ms`` reached ingest within ``live_slack_ms``
  of occurring (a live stream, producers and clocks in step), a partition read to its end
  at a fetch answered at wall time ``F`` marks ``F - live_slack_ms`` (never past the
  newest event read + 1): an event appended to it after that fetch occurred at most
  ``live_slack_ms`` before it was appended. This releases a live event about
  ``live_slack_ms`` after it occurred, instead of after ``idle_ms`` (issue 25). An event
  that breaks the assumption is late (applied at once, counted); as soon as one arrives
  later than ``live_slack_ms`` the rule is off until ``idle_ms`` passes without such an
  arrival, so a slow producer or a lagging ingest falls back to the rules above;
* with ``live_slack_max_ms`` above ``live_slack_ms`` (``worker.input_live_slack_max_ms``)
  the slack instead grows to the largest hand-over delay of the last ``idle_ms`` while
  that is at most ``live_slack_max_ms``: a worker waiting a moment for a CPU (the
  consumer handed an event over 120 ms after it occurred) marks ``F - 120`` for
  ``idle_ms`` rather than falling back to the idle rule; only a delay past
  ``live_slack_max_ms`` turns the live marks off.

The reordering therefore costs a live event at most the time until every input
partition has delivered a later event; while the live marks hold, at most
``live_slack_ms`` plus one fetch wait after it occurred; otherwise at most ``idle_ms`` of
wall time plus ``slack_ms`` of event time when a partition is quiet. With several
workers, a worker whose partitions all went quiet holds the others' rows newer than its
newest event until its partitions receive input again (delayed, never reordered).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

from pipeline.core.sequence import NO_MARK

DEFAULT_IDLE_MS = 500
DEFAULT_SLACK_MS = 1000


class InputMarks:
    """Per input partition: newest event time read, and when a record last arrived."""

    def __init__(
        self,
        idle_ms: int = DEFAULT_IDLE_MS,
        slack_ms: int = DEFAULT_SLACK_MS,
        live_slack_ms: int = 0,
        live_slack_max_ms: int = 0,
    ) -> None:
        self.idle_ms = idle_ms
        self.slack_ms = slack_ms
        # 0: no live marks (the rule in the module docstring is off).
        self.live_slack_ms = live_slack_ms
        # The live slack may grow to this (at most: below live_slack_ms it is fixed).
        self.live_slack_max_ms = max(live_slack_ms, live_slack_max_ms)
        # (wall_ms, delay) of hand-overs slower than live_slack_ms but within the max,
        # delays decreasing: the largest of the last idle_ms is first.
        self.delays: deque[tuple[int, int]] = deque()
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
        # When an event last arrived more than live_slack_ms after it occurred (the live
        # marks are off for idle_ms after that), and the live marks last given.
        self.slow_ms = NO_MARK
        self.live_given: dict[int, int] = {}
        # Events handed over later than the live slack allows (each turns the live marks
        # off for idle_ms): the shell exports the count (authpipe_ingest_slow_arrivals_total).
        self.slow_arrivals = 0

    def observe(
        self,
        partition: int,
        occurred_ms: int | None,
        wall_ms: int,
        fetched_ms: int | None = None,
    ) -> None:
        """A record of ``partition`` was read (``occurred_ms`` None: it was invalid);
        ``fetched_ms``: when the consumer handed it over (its delay for the live marks)."""
        self.arrived_ms[partition] = wall_ms
        if occurred_ms is None:
            return
        if fetched_ms is not None and self.live_slack_ms:
            delay = fetched_ms - occurred_ms
            if delay > self.live_slack_max_ms:
                self.slow_ms = wall_ms
                self.slow_arrivals += 1
            elif delay > self.live_slack_ms:
                delays = self.delays
                while delays and delays[-1][1] <= delay:
                    delays.pop()
                delays.append((wall_ms, delay))
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
        self,
        assigned: Iterable[int],
        caught_up: Iterable[int],
        wall_ms: int,
        fetched_ms: Mapping[int, int] | None = None,
        quiet: bool = False,
    ) -> list[list[int]]:
        """``[partition, mark_ms]`` for every assigned partition that has one.

        ``fetched_ms``: per partition read to its end, the wall time of the fetch answer
        that showed its end (for the live marks; None: no live marks). ``quiet``: nothing
        was read since the last call; a live mark then moves only when it reaches the
        newest event read + 1 (a marks-only envelope per step of the wall clock would cost
        every stage an envelope every batch while nothing happens)."""
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
        by_wall = self._live_marks(parts, done, wall_ms, fetched_ms, quiet)
        out = []
        for p in parts:
            mark = self.latest.get(p, NO_MARK)
            if p in idle:
                mark = max(mark, floor)
            if p in by_wall:
                mark = max(mark, by_wall[p])
            if mark > NO_MARK:
                out.append([p, mark])
        return out

    def _live_marks(
        self,
        parts: list[int],
        done: set[int],
        wall_ms: int,
        fetched_ms: Mapping[int, int] | None,
        quiet: bool,
    ) -> dict[int, int]:
        """The live marks of the partitions read to their end (module docstring): empty
        unless every event of the last ``idle_ms`` was handed over by the consumer within
        ``live_slack_ms`` of its event time (``observe``'s ``fetched_ms``)."""
        slack = self.live_slack_ms
        if not slack or fetched_ms is None or not self.recent:
            return {}
        if wall_ms - self.slow_ms < self.idle_ms:
            return {}
        delays = self.delays
        while delays and delays[0][0] < wall_ms - self.idle_ms:
            delays.popleft()
        if delays:
            slack = delays[0][1]
        cap = self.newest_ms + 1
        given = self.live_given
        live = {}
        for p in parts:
            if p in done and p in fetched_ms:
                mark = min(fetched_ms[p] - slack, cap)
                if quiet and mark < cap:
                    mark = given.get(p, NO_MARK)
                live[p] = given[p] = mark
        return live


class MarkRounds:
    """Which account partitions one ingest batch sends an envelope to (issue 25).

    Every batch used to send the marks to every account partition, rows or not: at a
    trickle that is a marks-only round of ``partitions`` envelopes per batch, each
    costing the account stage (and, through its forwarded marks, the source stage and
    the rollup) a fixed amount, which on a busy machine held ingest back for seconds.
    A partition gets an envelope when the batch has rows for it, or its marks changed
    and either it still holds rows the marks it was sent do not release (their event
    time is at or past the lowest of them), or ``interval_ms`` passed since its last
    envelope. So an account decision is never delayed by this; a partition with nothing
    held gets new marks at most every ``interval_ms`` (its forwarded marks, and what the
    source stage and rule 8 wait for, lag by that much at most: the feed's latency).
    Marks only say when rows are released, never in which order, so replay = live is
    untouched. ``interval_ms`` 0: every partition, every batch (the old rounds)."""

    def __init__(self, partitions: int, interval_ms: int) -> None:
        self.partitions = partitions
        self.interval_ms = interval_ms
        self.sent: dict[int, list[list[int]]] = {}
        self.sent_ms: dict[int, int] = {}
        # Per account partition: the newest event time of the rows sent to it.
        self.newest_ms: dict[int, int] = {}

    def targets(
        self, rows: Mapping[int, list[list[object]]], marks: list[list[int]], wall_ms: int
    ) -> set[int]:
        """The partitions to send to now (``rows``: the batch's, by account partition;
        a row's event time is its field 5), recorded as sent."""
        out = set()
        for p in range(self.partitions):
            if p in rows:
                newest = max(int(row[5]) for row in rows[p])  # type: ignore[call-overload]
                if newest > self.newest_ms.get(p, NO_MARK):
                    self.newest_ms[p] = newest
            elif self.sent.get(p) == marks:
                continue
            elif self.interval_ms and wall_ms - self.sent_ms.get(p, NO_MARK) < self.interval_ms:
                given = self.sent.get(p) or [[0, NO_MARK]]
                if self.newest_ms.get(p, NO_MARK) < min(mark for _, mark in given):
                    continue  # nothing held there: the next round takes these marks
            out.add(p)
            self.sent[p] = marks
            self.sent_ms[p] = wall_ms
        return out
