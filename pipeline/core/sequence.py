"""Event-time order for a stage that merges several upstream partitions.

A stage partition receives rows from many upstream partitions (the account stage from
every input partition, the source stage from every account partition, the rollup from
every account and source partition), interleaved in whatever order the broker and the
batching deliver them. Rules that see rows of many keys (the source stage's spray and
stuffing signals, the tenant rollup) and everything that reads the shard's watermark
would then depend on arrival order. ``Sequencer`` removes that dependence: rows are held
and released in ``(time_ms, tiebreak)`` order (event time, then event id) once the
watermark has passed them. The watermark is the minimum over every upstream of the
latest mark it sent: "every row I send from now on has a time at or after this". A
stage that processes only released rows therefore sees the same sequence whatever the
partitioning, the batch sizes and the arrival interleaving, which is the sequence a
single-process replay sorted by ``(occurred_ms, event_id)`` sees.

Guarantees and bounds:

* exact order when every upstream keeps its marks (each upstream sends rows in time
  order at or after its last mark); a row that arrives below the released watermark
  anyway is ``late``: released at once, counted, never dropped;
* memory: at most ``cap`` rows are held; past it the oldest row is released before the
  watermark (``forced``, counted): a silent or stuck upstream can delay rows, never grow
  memory without bound;
* rows are released with a strictly increasing ``seq`` (the stage's own position of
  applied rows: per-key idempotence after a restart relies on it).

Held rows are not written anywhere: they are in the stage's input already. Each held row
remembers the ``origin`` it came in (the stage's input offset), and ``oldest_origin`` is
the first input message that still has a row held. A stage records that offset with its
state; a restart reads its input again from there and ``rehold`` holds again exactly the
rows that were held (those after the cursor, at or after the released watermark), so a
held row costs no changelog records. ``meta`` carries the release position (``seq``), the
released watermark and the sort key of the last row released (``cursor``).

Changelogs written before this (held rows as records) still restore: ``restore`` holds
such a row again, ``finish_restore`` drops those at or below the cursor, and
``take_stale`` names every restored row since released or dropped, so its record can be
deleted; such rows have no origin (their record, not the input, keeps them).
"""

from __future__ import annotations

import heapq
from typing import Any

NO_MARK = -(1 << 62)
"""The watermark of an upstream that has not sent a mark yet: nothing is released."""

HeldKey = tuple[int, int]
"""(upstream, position): identifies a held row (its upstream's own position)."""


class Sequencer:
    """Rows from ``upstreams`` upstream partitions, released in event-time order."""

    __slots__ = (
        "_heap",
        "_held",
        "_origin_of",
        "_origins",
        "_restored",
        "_stale",
        "cap",
        "cursor",
        "forced",
        "late",
        "marks",
        "released_ms",
        "seq",
        "upstreams",
    )

    def __init__(self, upstreams: int, cap: int = 200_000) -> None:
        self.upstreams = upstreams
        self.cap = cap
        self.marks: dict[int, int] = {}
        self._heap: list[tuple[int, str, int, int]] = []
        self._held: dict[HeldKey, Any] = {}
        # Per held row, the input message it came in; per such message, its held rows.
        self._origin_of: dict[HeldKey, int] = {}
        self._origins: dict[int, int] = {}
        # Rows restored from records of an older changelog, and those since released.
        self._restored: set[HeldKey] = set()
        self._stale: list[HeldKey] = []
        self.released_ms = NO_MARK
        self.cursor: tuple[int, str, int, int] | None = None
        self.seq = 0
        self.late = 0
        self.forced = 0

    def __len__(self) -> int:
        return len(self._held)

    def mark(self, upstream: int, watermark_ms: int) -> None:
        """``upstream`` sends nothing earlier than ``watermark_ms`` from now on (monotone)."""
        if watermark_ms > self.marks.get(upstream, NO_MARK):
            self.marks[upstream] = watermark_ms

    def watermark_ms(self) -> int:
        """The minimum mark over every upstream (NO_MARK until each has sent one)."""
        if len(self.marks) < self.upstreams:
            return NO_MARK
        return min(self.marks.values())

    def push(
        self, time_ms: int, tiebreak: str, upstream: int, position: int, item: Any, origin: int
    ) -> None:
        """Hold ``item``, which came in input message ``origin``; a row already held (same
        upstream and position) is ignored."""
        key = (upstream, position)
        if key in self._held:
            return
        if time_ms < self.released_ms:
            self.late += 1
        self._held[key] = item
        heapq.heappush(self._heap, (time_ms, tiebreak, upstream, position))
        self._origin_of[key] = origin
        origins = self._origins
        origins[origin] = origins.get(origin, 0) + 1

    def rehold(
        self, time_ms: int, tiebreak: str, upstream: int, position: int, item: Any, origin: int
    ) -> bool:
        """Hold ``item`` again, read again from input message ``origin`` after a restore,
        if it was held when the state was recorded: after the cursor and at or after the
        released watermark (anything else was released, or skipped as a replay)."""
        if time_ms < self.released_ms:
            return False
        cursor = self.cursor
        if cursor is not None and (time_ms, tiebreak, upstream, position) <= cursor:
            return False
        self.push(time_ms, tiebreak, upstream, position, item, origin)
        return True

    def oldest_origin(self) -> int | None:
        """The first input message with a row still held (None: nothing held from input)."""
        return min(self._origins) if self._origins else None

    def release(self, watermark_ms: int | None = None) -> list[tuple[int, int, Any]]:
        """``(seq, time_ms, item)`` of every held row below the watermark (and of the
        oldest rows past ``cap``), in ``(time_ms, tiebreak)`` order."""
        limit = self.watermark_ms() if watermark_ms is None else watermark_ms
        heap, held = self._heap, self._held
        out: list[tuple[int, int, Any]] = []
        while heap and (heap[0][0] < limit or len(held) > self.cap):
            head = heapq.heappop(heap)
            time_ms, _tiebreak, upstream, position = head
            if self.cursor is None or head > self.cursor:
                self.cursor = head
            if time_ms >= limit:
                self.forced += 1
            key = (upstream, position)
            item = held.pop(key)
            origin = self._origin_of.pop(key, None)
            if origin is not None:
                left = self._origins[origin] - 1
                if left:
                    self._origins[origin] = left
                else:
                    del self._origins[origin]
            elif key in self._restored:
                self._restored.discard(key)
                self._stale.append(key)
            out.append((self.seq, time_ms, item))
            self.seq += 1
        if limit > self.released_ms:
            self.released_ms = limit
        return out

    def take_stale(self) -> list[HeldKey]:
        """Rows restored from an older changelog's records and since released or dropped:
        their records are to be deleted."""
        stale = self._stale
        self._stale = []
        return stale

    def restore(self, key: HeldKey, value: tuple[int, str, Any] | list[Any]) -> None:
        """Hold a row read back from an older changelog's record (see the module docstring)."""
        time_ms, tiebreak, item = value
        if key not in self._held:
            self._held[key] = item
            self._restored.add(key)
            heapq.heappush(self._heap, (time_ms, tiebreak, key[0], key[1]))

    def meta(self) -> list[Any]:
        cursor = list(self.cursor) if self.cursor is not None else None
        return [self.seq, self.released_ms, [[u, m] for u, m in sorted(self.marks.items())], cursor]

    def restore_meta(self, value: list[Any]) -> None:
        seq, released_ms, marks, cursor = value
        self.seq = max(self.seq, seq)
        self.released_ms = max(self.released_ms, released_ms)
        for upstream, mark in marks:
            self.mark(upstream, mark)
        if cursor is not None:
            restored = (cursor[0], cursor[1], cursor[2], cursor[3])
            if self.cursor is None or restored > self.cursor:
                self.cursor = restored

    def finish_restore(self) -> None:
        """Drop restored held rows the cursor shows released (see the module docstring)."""
        cursor = self.cursor
        if cursor is None:
            return
        stale = [entry for entry in self._heap if entry <= cursor]
        if not stale:
            return
        for entry in stale:
            key = (entry[2], entry[3])
            self._held.pop(key, None)
            self._restored.discard(key)
            self._stale.append(key)
        self._heap = [entry for entry in self._heap if entry > cursor]
        heapq.heapify(self._heap)
