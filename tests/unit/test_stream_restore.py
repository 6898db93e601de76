"""ChangelogRestore: installs each partition once read, and lets a revoked partition go."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from pipeline.stream import restore
from pipeline.stream.restore import ChangelogRestore, LiveRecords

A, B = (
    TopicPartition("app-account-state-changelog", 0),
    TopicPartition("app-account-state-changelog", 1),
)


def fake_reader(release: asyncio.Event) -> Any:
    async def read(
        bootstrap: str,
        tps: Collection[TopicPartition],
        security: Any = None,
        commit: Any = None,
        on_read: Any = None,
    ) -> AsyncIterator[tuple[TopicPartition, LiveRecords]]:
        for tp in tps:
            await release.wait()
            if on_read is not None:
                on_read(1)
            yield tp, {b"key-%d" % tp.partition: b"value"}

    return read


async def test_waiters_return_once_their_partition_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both partitions of one assignment are installed with their records, then waits return."""
    release = asyncio.Event()
    monkeypatch.setattr(restore, "read_changelogs", fake_reader(release))
    installed: list[tuple[int, LiveRecords]] = []

    async def install(tp: TopicPartition, live: LiveRecords) -> None:
        installed.append((tp.partition, live))

    restorer = ChangelogRestore("unused:9092", install)
    restorer.start([A, B])
    assert restorer.restoring() == 2
    release.set()
    await asyncio.wait_for(asyncio.gather(restorer.wait(A), restorer.wait(B)), 5)
    assert installed == [(0, {b"key-0": b"value"}), (1, {b"key-1": b"value"})]
    assert restorer.restoring() == 0


async def test_a_partition_revoked_while_waited_for_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cancel() releases the waiter at once, and the reader installs nothing for it later."""
    release = asyncio.Event()
    monkeypatch.setattr(restore, "read_changelogs", fake_reader(release))
    installed: list[int] = []

    async def install(tp: TopicPartition, live: LiveRecords) -> None:
        installed.append(tp.partition)

    restorer = ChangelogRestore("unused:9092", install)
    restorer.start([A])
    waiter = asyncio.ensure_future(restorer.wait(A))
    await asyncio.sleep(0)
    restorer.cancel([A])
    await asyncio.wait_for(waiter, 5)
    release.set()
    await asyncio.wait_for(asyncio.gather(*restorer.tasks), 5)
    assert installed == []
