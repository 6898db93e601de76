"""The audit rate cap: pure, deterministic, bounded; no I/O and no clock reads.

Rows are audit rows as lists in ``AUDIT_COLUMNS`` order (``ts_ms`` first, epoch ms).
Time is the rows' own event time and the ``*_ms`` arguments; nothing reads a clock.

The rule
--------
* A row is *capped* when its outcome is ``failure`` or its decision is ``block``
  (failures and refusals). Successes that were not refused, decisions and alerts are
  never capped: their rows pass through unchanged and leave no state.
* Each capped row has two keys in its event minute (``ts_ms // 60_000``): the source
  key ``(tenant, source)`` and the account key ``(tenant, account_digest)``. The row is
  written when both keys have written fewer than ``rows_per_minute`` rows this minute
  (then both counts go up by one); otherwise it is suppressed: counted, not written.
* A suppressed row is counted in exactly ONE summary: the source key's when the source
  key is at its cap, else the account key's (the source takes precedence). So no
  attempt is ever counted twice, even when both caps refused it.
* When a key's minute closes (``close_before``/``close_all``: event time passed the
  minute, the stream went quiet, shutdown), a key with suppressed rows yields one
  summary row: a copy of its first suppressed row with ``weight`` = the sum of the
  suppressed rows' weights, ``summary`` = true, ``event_id`` = ``summary:<first event
  id>``; a source summary has ``account_digest`` "" (and ``account`` null), an account
  summary has ``source`` "", both have ``device_id`` "". Hence, for any input,
  ``sum(weight)`` of everything emitted equals ``sum(weight)`` of the input (1 per
  attempt), once every minute is closed.
* Written rows per key per minute stay ``<= rows_per_minute`` (plus one summary), as
  long as the key is tracked; see the bound below.

Bounds
------
At most ``max_keys`` keys are tracked (two per distinct failing (source, account) pair
and minute at worst). When a new key would exceed that, the oldest keys (oldest minute
first, then first created) are closed early: their summaries are emitted now rather
than losing counts, and their written counts are forgotten, so an evicted key that comes
back in the same minute may write up to ``rows_per_minute`` more rows. Work per row is
O(1) amortised; a tracked key costs one dict slot and a 3-item list (~200 bytes).

Determinism: the output is a function of the input rows and the calls, in order; a
replay of the same calls yields identical rows (the sink's dedup tokens rely on it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from pipeline.contracts.models import AUDIT_COLUMNS

MINUTE_MS: Final = 60_000

_COL = {name: index for index, name in enumerate(AUDIT_COLUMNS)}
TS_MS: Final = _COL["ts_ms"]
TENANT: Final = _COL["tenant"]
ACCOUNT_DIGEST: Final = _COL["account_digest"]
ACCOUNT: Final = _COL["account"]
SOURCE: Final = _COL["source"]
DEVICE_ID: Final = _COL["device_id"]
OUTCOME: Final = _COL["outcome"]
DECISION: Final = _COL["decision"]
WEIGHT: Final = _COL["weight"]
SUMMARY: Final = _COL["summary"]
EVENT_ID: Final = _COL["event_id"]

SOURCE_KEY: Final = "s"
ACCOUNT_KEY: Final = "a"

# A tracked key: (kind, tenant, source or account digest). Its state, per minute:
# [rows written, suppressed weight, first suppressed row or None].
Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class RateCapConfig:
    """How many capped rows a key may write per minute, and how many keys to track."""

    rows_per_minute: int = 60
    max_keys: int = 100_000

    def __post_init__(self) -> None:
        if self.rows_per_minute < 1:
            raise ValueError("rows_per_minute must be at least 1")
        if self.max_keys < 2:
            raise ValueError("max_keys must be at least 2 (a row touches two keys)")


def is_capped(row: Sequence[Any]) -> bool:
    """Failures and refusals are capped; everything else passes."""
    return bool(row[OUTCOME] == "failure" or row[DECISION] == "block")


class RateCap:
    """Per-key, per-minute row cap with exact summary rows; see the module docstring."""

    __slots__ = ("_limit", "_max_keys", "_minutes", "_tracked", "evicted_keys")

    def __init__(self, config: RateCapConfig = RateCapConfig()) -> None:
        self._limit = config.rows_per_minute
        self._max_keys = config.max_keys
        # Each minute's keys in first-created order, an OrderedDict: evicting a plain
        # dict's first key leaves a hole that every later ``next(iter())`` walks over.
        self._minutes: dict[int, OrderedDict[Key, list[Any]]] = {}
        self._tracked = 0
        self.evicted_keys = 0

    @property
    def tracked_keys(self) -> int:
        """Keys held right now (both kinds, all open minutes)."""
        return self._tracked

    @property
    def pending_weight(self) -> int:
        """Suppressed weight not yet emitted in a summary."""
        return sum(e[1] for keys in self._minutes.values() for e in keys.values())

    def offer(self, row: list[Any], out: list[list[Any]]) -> None:
        """Process one row: append it to ``out`` if written, plus any evicted summaries."""
        if not is_capped(row):
            out.append(row)
            return
        minute = row[TS_MS] // MINUTE_MS
        keys = self._minutes.get(minute)
        if keys is None:
            keys = self._minutes[minute] = OrderedDict()
        tenant = row[TENANT]
        source_key = (SOURCE_KEY, tenant, row[SOURCE])
        account_key = (ACCOUNT_KEY, tenant, row[ACCOUNT_DIGEST])
        source = keys.get(source_key)
        if source is None:
            source = keys[source_key] = [0, 0, None]
            self._tracked += 1
        account = keys.get(account_key)
        if account is None:
            account = keys[account_key] = [0, 0, None]
            self._tracked += 1
        limit = self._limit
        if source[0] < limit and account[0] < limit:
            source[0] += 1
            account[0] += 1
            out.append(row)
        else:
            target = source if source[0] >= limit else account
            target[1] += row[WEIGHT]
            if target[2] is None:
                target[2] = row
        if self._tracked > self._max_keys:
            self._evict(out)

    def offer_all(self, rows: Sequence[list[Any]], out: list[list[Any]]) -> None:
        """``offer`` each row in order."""
        for row in rows:
            self.offer(row, out)

    def close_before(self, now_ms: int, out: list[list[Any]]) -> None:
        """Close every minute that ended at or before ``now_ms`` (event time)."""
        current = now_ms // MINUTE_MS
        for minute in sorted(m for m in self._minutes if m < current):
            self._close_minute(minute, out)

    def close_all(self, out: list[list[Any]]) -> None:
        """Close every open minute (quiet stream, shutdown); the cap is empty after."""
        for minute in sorted(self._minutes):
            self._close_minute(minute, out)

    def _close_minute(self, minute: int, out: list[list[Any]]) -> None:
        keys = self._minutes.pop(minute)
        self._tracked -= len(keys)
        for key, entry in keys.items():
            if entry[1]:
                out.append(_summary(key, entry))

    def _evict(self, out: list[list[Any]]) -> None:
        while self._tracked > self._max_keys:
            minute = min(self._minutes)
            keys = self._minutes[minute]
            key, entry = keys.popitem(last=False)
            if not keys:
                del self._minutes[minute]
            self._tracked -= 1
            self.evicted_keys += 1
            if entry[1]:
                out.append(_summary(key, entry))


def _summary(key: Key, entry: list[Any]) -> list[Any]:
    first: list[Any] = entry[2]
    row = list(first)
    row[WEIGHT] = entry[1]
    row[SUMMARY] = True
    row[EVENT_ID] = "summary:" + str(first[EVENT_ID])
    row[DEVICE_ID] = ""
    if key[0] == SOURCE_KEY:
        row[ACCOUNT_DIGEST] = ""
        row[ACCOUNT] = None
    else:
        row[SOURCE] = ""
    return row
