"""Progress of a long step, on stderr: a bar redrawn in place on a terminal, a plain line
every ``every_s`` seconds otherwise (log files, a parent process reading the lines).

Lines read ``<label>: <percent> % <detail>``; the last one (``done``) always comes.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 30


class Progress:
    """``update(fraction, detail)`` as often as convenient; ``done(detail)`` once."""

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        every_s: float = 5.0,
        tty: bool | None = None,
    ) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_s = every_s
        self._last = time.monotonic()
        self._drawn_at = 0.0

    def update(self, fraction: float, detail: str = "") -> None:
        now = time.monotonic()
        if self.tty:
            if now - self._drawn_at >= 0.1:
                self._drawn_at = now
                self._draw(fraction, detail)
        elif now - self._last >= self.every_s:
            self._last = now
            self._line(fraction, detail)

    def done(self, detail: str = "") -> None:
        if self.tty:
            self._draw(1.0, detail)
            self.stream.write("\n")
            self.stream.flush()
        else:
            self._line(1.0, detail)

    def _draw(self, fraction: float, detail: str) -> None:
        fraction = min(max(fraction, 0.0), 1.0)
        filled = round(fraction * BAR_WIDTH)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        self.stream.write(f"\r{self.label}: [{bar}] {fraction * 100:3.0f} % {detail}\x1b[K")
        self.stream.flush()

    def _line(self, fraction: float, detail: str) -> None:
        percent = min(max(fraction, 0.0), 1.0) * 100
        self.stream.write(f"{self.label}: {percent:.0f} % {detail}".rstrip() + "\n")
        self.stream.flush()
