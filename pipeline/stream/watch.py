"""The worker restarts itself when a partition has stopped moving with input waiting.

Invariant: every assigned stage partition either makes progress or has nothing waiting
for it; one that has had messages waiting past its stage's expected offset (or has not
been restored) and made no progress at all for ``worker.stuck_after_s`` ends the worker
with exit status ``EX_STUCK`` (75, EX_TEMPFAIL: try again) after writing what it can, and
its supervisor (compose's ``restart: unless-stopped``, systemd's ``Restart=on-failure``)
starts it again. Nothing is lost or doubled: a restart is a crash the changelogs are made
for (the kill tests), and the new worker reads each partition afresh.

Why a restart and not a repair: the one case seen (docs/operations.md, "A partition, a
full disk, two brokers down") left a partition unread after a seek back during a broker's
restart, with no error anywhere; the shell cannot tell which of faust's or aiokafka's
states holds it, and a new consumer holds none of them. The stranded-partition seek
(``pipeline.stream.progress``) remains the first remedy; this is the last.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.logs import get_logger
from pipeline.stream.progress import Watchdog

log = get_logger("worker")

EX_STUCK = 75
"""The worker's exit status when it restarts itself (EX_TEMPFAIL)."""
DRAIN_TIMEOUT_S = 10.0
"""How long the worker writes its waiting changelogs before it exits stuck."""


class Stage(Protocol):
    def owns(self, partition: int) -> bool: ...

    def expected(self, partition: int) -> int | None: ...


@dataclass(frozen=True)
class Progress:
    """One assigned stage partition's progress ``mark`` and whether input waits for it."""

    mark: int
    waiting: bool


def progress(
    stage: Stage, partition: int, highwater: int | None, restore_read: int
) -> Progress | None:
    """Where ``partition`` stands: restored, the offset its stage expects next and whether
    messages exist from there on; not yet restored, the records the restores have read
    (any read is progress) and always waiting. None: nothing to watch (a partition whose
    stage has applied nothing yet expects whatever comes first)."""
    if not stage.owns(partition):
        return Progress(mark=-1 - restore_read, waiting=True)
    expected = stage.expected(partition)
    if expected is None:
        return None
    return Progress(mark=expected, waiting=highwater is not None and highwater > expected)


def exit_stuck() -> None:
    """Exit now with ``EX_STUCK`` (faust's own shutdown would wait on what is stuck)."""
    logging.shutdown()
    os._exit(EX_STUCK)


class StuckWatch:
    """Looks at every assigned stage partition; ends the worker when one is stuck."""

    def __init__(
        self,
        stuck_after_s: float,
        drain: Callable[[], Awaitable[None]],
        on_stuck: Callable[[], None] = exit_stuck,
    ) -> None:
        self.watchdog = Watchdog(stuck_after_s=stuck_after_s)
        self.drain = drain
        self.on_stuck = on_stuck

    async def tick(
        self,
        assignment: Iterable[Any],
        stages: Mapping[str, Stage],
        highwater: Callable[[Any], int | None],
        restore_read: int,
        now_s: float | None = None,
    ) -> bool:
        """Observe each assigned partition; True (after ``on_stuck``) if one is stuck."""
        now_s = time.monotonic() if now_s is None else now_s
        for tp in assignment:
            stage = stages.get(tp.topic)
            if stage is None:
                continue
            where = progress(stage, tp.partition, highwater(tp), restore_read)
            if where is None:
                self.watchdog.forget(tp)
                continue
            stuck_s = self.watchdog.observe(tp, mark=where.mark, waiting=where.waiting, now_s=now_s)
            if stuck_s >= self.watchdog.stuck_after_s:
                await self._restart(tp, where, highwater(tp), stuck_s)
                return True
        return False

    def forget(self, tps: Iterable[Any]) -> None:
        for tp in tps:
            self.watchdog.forget(tp)

    async def _restart(
        self, tp: Any, where: Progress, highwater: int | None, stuck_s: float
    ) -> None:
        log.error(
            "worker_stuck",
            topic=tp.topic,
            partition=tp.partition,
            restored=where.mark >= 0,
            expected=where.mark if where.mark >= 0 else None,
            highwater=highwater,
            stuck_s=round(stuck_s, 1),
            action=f"exiting with status {EX_STUCK}; the supervisor restarts the worker",
        )
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.drain(), DRAIN_TIMEOUT_S)
        self.on_stuck()
