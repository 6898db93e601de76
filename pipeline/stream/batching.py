"""Rows bound for one internal topic partition, gathered across envelopes before sending.

Each account envelope forwards its untrusted failures to up to ``partitions`` source
partitions, and each account or source envelope sends tenant shares: sent as they come,
one ingest batch of 8 account envelopes became up to 64 small forward envelopes and as
many shares messages, and every envelope costs the agents that read it a fixed amount
(faust's delivery, the stage loop, a changelog write, a shares message of its own).

``Batcher`` gathers rows per target partition for at most ``linger_ms`` after the first
one, or until ``max_rows`` are waiting, and sends them as one message. ``add`` returns
a future that resolves once the message holding those rows is acknowledged: the
envelope's changelog waits for it (``pipeline.stream.chains``), so state never becomes
durable before the rows it forwarded, exactly as when they were sent at once. A crash
before the flush loses the rows and the changelog together, and the envelope is
applied again after the restart.

Rows of one target are sent in the order they were added (a lock per target keeps a
later flush from overtaking an earlier one's remaining chunks): the source stage skips
rows at or below the highest (upstream partition, seq) it applied, so order matters.
``merge`` may rewrite a batch before it is sent (tenant shares keep only each
subject's latest value: they are absolute, so older ones carry nothing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline.stream.envelopes import chunks

Send = Callable[[int, list[Any]], Awaitable[Awaitable[Any]]]
Merge = Callable[[list[Any]], list[Any]]


def _keep(rows: list[Any]) -> list[Any]:
    return rows


class Batcher:
    """Per target partition: the waiting rows, the future of their acknowledgement, and
    the timer that flushes them ``linger_ms`` after the first one arrived."""

    def __init__(
        self,
        send: Send,
        *,
        linger_ms: int,
        max_rows: int,
        merge: Merge = _keep,
    ) -> None:
        self.send = send
        self.linger_s = linger_ms / 1000
        self.max_rows = max_rows
        self.merge = merge
        self.rows: dict[int, list[Any]] = {}
        self.acks: dict[int, asyncio.Future[None]] = {}
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.locks: dict[int, asyncio.Lock] = {}
        self.flushes: set[asyncio.Task[None]] = set()

    def add(self, target: int, rows: list[Any]) -> asyncio.Future[None]:
        """Queue ``rows`` for ``target``; the future resolves once they are acknowledged."""
        loop = asyncio.get_running_loop()
        waiting = self.rows.setdefault(target, [])
        waiting.extend(rows)
        ack = self.acks.get(target)
        if ack is None:
            ack = self.acks[target] = loop.create_future()
        if len(waiting) >= self.max_rows:
            self._spawn(target)
        elif target not in self.timers:
            self.timers[target] = loop.call_later(self.linger_s, self._spawn, target)
        return ack

    def waiting(self) -> int:
        return sum(len(rows) for rows in self.rows.values())

    async def flush_all(self) -> None:
        """Send everything waiting now and wait for the acknowledgements."""
        for target in list(self.rows):
            self._spawn(target)
        while self.flushes:
            await asyncio.gather(*list(self.flushes), return_exceptions=True)

    def _spawn(self, target: int) -> None:
        timer = self.timers.pop(target, None)
        if timer is not None:
            timer.cancel()
        rows = self.rows.pop(target, None)
        ack = self.acks.pop(target, None)
        if rows is None or ack is None:
            return
        task = asyncio.ensure_future(self._flush(target, rows, ack))
        self.flushes.add(task)
        task.add_done_callback(self.flushes.discard)

    async def _flush(self, target: int, rows: list[Any], ack: asyncio.Future[None]) -> None:
        try:
            async with self.locks.setdefault(target, asyncio.Lock()):
                sent = [
                    await self.send(target, part)
                    for part in chunks(self.merge(rows), self.max_rows)
                ]
            await asyncio.gather(*sent)
        except BaseException as exc:  # the envelopes waiting on ``ack`` fail with it
            if not ack.done():
                ack.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if not ack.done():
            ack.set_result(None)
