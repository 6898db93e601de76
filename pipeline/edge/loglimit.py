"""A budget of log lines per second, so a flood of refused checks cannot flood the log."""

from __future__ import annotations

import time
from collections.abc import Callable

REFUSAL_LOG_LINES_PER_S = 20
"""Refusal (and observe-only match) lines the edge writes per second at most."""


class LineBudget:
    """At most ``per_second`` lines in each one-second window (of ``clock``, monotonic
    seconds); ``allow()`` says whether the next line may be written and counts the ones
    that may not. ``take_suppressed()`` returns (and resets) how many were held back since
    the last call, for one summary line when the next window opens."""

    __slots__ = ("_clock", "_left", "_suppressed", "_window_s", "per_second", "suppressed_total")

    def __init__(
        self, per_second: int = REFUSAL_LOG_LINES_PER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_second = per_second
        self._clock = clock
        self._window_s = -1.0
        self._left = 0
        self._suppressed = 0
        self.suppressed_total = 0

    def allow(self) -> bool:
        now_s = self._clock()
        if now_s - self._window_s >= 1.0:
            self._window_s = now_s
            self._left = self.per_second
        if self._left > 0:
            self._left -= 1
            return True
        self._suppressed += 1
        self.suppressed_total += 1
        return False

    def take_suppressed(self) -> int:
        count, self._suppressed = self._suppressed, 0
        return count
