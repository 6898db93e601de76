"""A change signal: a version number whose waiters wake at its next bump. The view bumps
one per change of its decisions and one per change of its block-list; long polls and
event streams wait on them."""

from __future__ import annotations

import asyncio


class ChangeSignal:
    """A version number whose waiters wake at the next bump (no event until one waits)."""

    __slots__ = ("_event", "version")

    def __init__(self) -> None:
        self.version = 0
        self._event: asyncio.Event | None = None

    def bump(self) -> None:
        self.version += 1
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, version: int, timeout_s: float) -> bool:
        """True once the version differs from ``version``; False after ``timeout_s``."""
        if self.version != version:
            return True
        if self._event is None:
            self._event = asyncio.Event()
        event = self._event
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass
        return self.version != version
