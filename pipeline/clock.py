"""The wall clock, read only by the I/O shell: the core takes time as an epoch-ms
parameter and never calls this."""

from __future__ import annotations

import time


def wall_ms() -> int:
    """Wall-clock epoch milliseconds (UTC)."""
    return time.time_ns() // 1_000_000
