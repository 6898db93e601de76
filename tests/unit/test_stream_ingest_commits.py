"""Ingest's input commits: in batch order, each after its batch's acknowledgements, bounded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import CommitFailedError
from aiokafka.structs import TopicPartition

from pipeline.stream.ingest_loop import Commits

TP = TopicPartition("auth.login-attempts", 0)


class Consumer:
    """What ``Commits`` uses of the aiokafka consumer: ``commit``, recorded (or refused)."""

    def __init__(self, refuse: bool = False) -> None:
        self.committed: list[dict[TopicPartition, int]] = []
        self.refuse = refuse

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.refuse:
            raise CommitFailedError("the group rebalanced")
        self.committed.append(dict(offsets))


async def settle() -> None:
    """Let every ready task run (no wall-clock wait)."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_later_batch_acknowledged_first_is_committed_after_the_earlier_one() -> None:
    """Offsets 10 then 20: the second batch's acks come first, and nothing is committed
    until the first batch's do; then both, in order, each followed by its metrics."""

    async def scenario() -> tuple[list[Any], list[Any], list[str]]:
        loop = asyncio.get_running_loop()
        consumer = Consumer()
        commits = Commits(consumer)  # type: ignore[arg-type]
        first, second = loop.create_future(), loop.create_future()
        done: list[str] = []
        await commits.add([first], {TP: 10}, lambda: done.append("first"))
        await commits.add([second], {TP: 20}, lambda: done.append("second"))
        second.set_result(None)
        await settle()
        before = list(consumer.committed)
        first.set_result(None)
        await commits.drain()
        return before, consumer.committed, done

    assert asyncio.run(scenario()) == ([], [{TP: 10}, {TP: 20}], ["first", "second"])


def test_the_loop_waits_once_the_limit_of_batches_is_waiting() -> None:
    """With limit 2, the third batch's add returns only once the oldest is committed."""

    async def scenario() -> tuple[bool, list[Any]]:
        loop = asyncio.get_running_loop()
        consumer = Consumer()
        commits = Commits(consumer, limit=2)  # type: ignore[arg-type]
        acks = [loop.create_future() for _ in range(3)]
        await commits.add([acks[0]], {TP: 1}, lambda: None)
        await commits.add([acks[1]], {TP: 2}, lambda: None)
        third = asyncio.ensure_future(commits.add([acks[2]], {TP: 3}, lambda: None))
        await settle()
        blocked = not third.done()
        acks[0].set_result(None)
        await asyncio.wait_for(third, 5)
        for ack in acks[1:]:
            ack.set_result(None)
        await commits.drain()
        return blocked, consumer.committed

    assert asyncio.run(scenario()) == (True, [{TP: 1}, {TP: 2}, {TP: 3}])


def test_a_failed_send_commits_nothing_after_it_and_is_raised_to_the_loop() -> None:
    """The first batch's send fails: neither batch is committed, and drain raises it."""

    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()
        consumer = Consumer()
        commits = Commits(consumer)  # type: ignore[arg-type]
        first, second = loop.create_future(), loop.create_future()
        await commits.add([first], {TP: 10}, lambda: None)
        await commits.add([second], {TP: 20}, lambda: None)
        second.set_result(None)
        first.set_exception(RuntimeError("broker gone"))
        with pytest.raises(RuntimeError, match="broker gone"):
            await commits.drain()
        return consumer.committed

    assert asyncio.run(scenario()) == []


def test_a_commit_the_group_refuses_after_a_rebalance_is_dropped_not_raised() -> None:
    """CommitFailedError (the partitions moved): the batch's metrics still count, no error."""

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        commits = Commits(Consumer(refuse=True))  # type: ignore[arg-type]
        ack = loop.create_future()
        done: list[str] = []
        await commits.add([ack], {TP: 10}, lambda: done.append("counted"))
        ack.set_result(None)
        await commits.drain()
        return done

    assert asyncio.run(scenario()) == ["counted"]
