"""Changelog writes that wait for their envelope's outputs without stalling the agent.

A stage's changelog for an envelope may only be written once the envelope's outputs
(decisions, alerts, audit batches, forwards) are acknowledged: a replay skips rows whose
state shows them applied, so their outputs must be durable first. Waiting inline costs a
broker round trip per envelope, which under light load (many small envelopes) is most of
the agent's time. ``ChangelogChains`` waits in the background instead: per changelog
partition, one task per envelope awaits the previous envelope's task, then its own
outputs' acknowledgements, then writes its changelog records, so a partition's changelog
stays in envelope order. The agent goes on to the next envelope at once, unless
``max_inflight`` envelopes of that partition are already waiting (then it waits for the
oldest: memory stays bounded when the broker is slow).

A failed send fails its task and every later one of the partition; the next ``add`` or
``drain`` for that partition raises the error, so the agent crashes as an inline send
would have made it. If the process dies with envelopes still waiting, their changelog
was never written: the stage's persisted next-envelope offset is behind, and the
envelopes are applied again after the restart (``pipeline.stream.progress``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any

DEFAULT_MAX_INFLIGHT = 4

Write = Callable[[], Awaitable[None]]


class ChangelogChains:
    """Per changelog partition, the envelopes whose changelog waits for acknowledgements."""

    def __init__(self, max_inflight: int = DEFAULT_MAX_INFLIGHT) -> None:
        self.max_inflight = max_inflight
        self.tails: dict[Hashable, deque[asyncio.Future[None]]] = {}

    async def add(self, key: Hashable, pending: list[Awaitable[Any]], write: Write) -> None:
        """Write ``write()`` after ``pending`` and after every earlier envelope of ``key``."""
        queue = self.tails.setdefault(key, deque())
        while queue and (queue[0].done() or len(queue) >= self.max_inflight):
            oldest = queue.popleft()
            await oldest  # raises the failure of a send, as an inline wait would
        previous = queue[-1] if queue else None
        queue.append(asyncio.ensure_future(_after(previous, pending, write)))

    async def drain(self, keys: Iterable[Hashable] | None = None) -> None:
        """Wait until every waiting envelope of ``keys`` (default: all) is written."""
        for key in list(self.tails) if keys is None else list(keys):
            queue = self.tails.pop(key, None)
            while queue:
                await queue.popleft()

    def inflight(self) -> int:
        return sum(len(queue) for queue in self.tails.values())


async def _after(
    previous: asyncio.Future[None] | None, pending: list[Awaitable[Any]], write: Write
) -> None:
    if previous is not None:
        await previous
    if pending:
        await asyncio.gather(*pending)
    await write()
