"""Forwards and shares gathered across envelopes: one message per target, in order, acked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.stream.batching import Batcher
from pipeline.stream.envelopes import latest_shares


class FakeTopic:
    """Records every send; each send's acknowledgement is a future the test resolves."""

    def __init__(self, fail: bool = False, delay_s: float = 0.0) -> None:
        self.sent: list[tuple[int, list[Any]]] = []
        self.acks: list[asyncio.Future[None]] = []
        self.fail = fail
        self.delay_s = delay_s

    async def send(self, target: int, rows: list[Any]) -> asyncio.Future[None]:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # a slow producer buffer, to interleave flushes
        self.sent.append((target, list(rows)))
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail:
            ack.set_exception(RuntimeError("broker said no"))
        else:
            ack.set_result(None)
        self.acks.append(ack)
        return ack


async def wait_for(condition: Any, timeout_s: float = 2.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), timeout_s)


def test_rows_of_several_envelopes_go_out_as_one_message_after_the_linger() -> None:
    """Three adds within the linger make one message per target, rows in order, one shared ack."""

    async def scenario() -> tuple[list[tuple[int, list[Any]]], bool, bool]:
        topic = FakeTopic()
        batcher = Batcher(topic.send, linger_ms=20, max_rows=100)
        first = batcher.add(3, [["a", 1]])
        second = batcher.add(3, [["b", 2], ["c", 3]])
        other = batcher.add(5, [["x", 9]])
        same_future = first is second
        early = topic.sent == []
        await asyncio.wait_for(asyncio.gather(first, other), 2)
        return sorted(topic.sent), same_future, early

    sent, same_future, early = asyncio.run(scenario())
    assert sent == [(3, [["a", 1], ["b", 2], ["c", 3]]), (5, [["x", 9]])]
    assert (same_future, early) == (True, True)


def test_max_rows_sends_at_once_in_chunks_of_max_rows() -> None:
    """Reaching max_rows flushes without waiting for the linger, cut into max_rows chunks."""

    async def scenario() -> list[tuple[int, list[Any]]]:
        topic = FakeTopic()
        batcher = Batcher(topic.send, linger_ms=60_000, max_rows=2)
        ack = batcher.add(0, [[1], [2], [3]])
        await asyncio.wait_for(ack, 2)
        return topic.sent

    assert asyncio.run(scenario()) == [(0, [[1], [2]]), (0, [[3]])]


def test_a_failed_send_fails_every_envelope_waiting_on_that_message() -> None:
    """The ack future carries the send's error, so the envelope's changelog is never written."""

    async def scenario() -> str:
        batcher = Batcher(FakeTopic(fail=True).send, linger_ms=1, max_rows=100)
        ack = batcher.add(1, [["row"]])
        with pytest.raises(RuntimeError) as caught:
            await asyncio.wait_for(ack, 2)
        return str(caught.value)

    assert asyncio.run(scenario()) == "broker said no"


def test_a_later_flush_never_overtakes_an_earlier_one_of_the_same_target() -> None:
    """With a slow producer, chunks of the first flush all go before the second flush's."""

    async def scenario() -> list[tuple[int, list[Any]]]:
        topic = FakeTopic(delay_s=0.005)
        batcher = Batcher(topic.send, linger_ms=60_000, max_rows=2)
        first = batcher.add(0, [[1], [2], [3], [4]])
        second = batcher.add(0, [[5], [6]])
        await asyncio.wait_for(asyncio.gather(first, second), 2)
        return topic.sent

    assert asyncio.run(scenario()) == [(0, [[1], [2]]), (0, [[3], [4]]), (0, [[5], [6]])]


def test_flush_all_sends_what_is_waiting_and_waits_for_the_acks() -> None:
    """Before a rebalance or shutdown nothing may stay gathered: flush_all empties the batcher."""

    async def scenario() -> tuple[list[tuple[int, list[Any]]], bool, int]:
        topic = FakeTopic()
        batcher = Batcher(topic.send, linger_ms=60_000, max_rows=100)
        ack = batcher.add(2, [["r"]])
        await batcher.flush_all()
        await wait_for(ack.done)
        return topic.sent, ack.done(), batcher.waiting()

    assert asyncio.run(scenario()) == ([(2, [["r"]])], True, 0)


def test_merge_keeps_each_subjects_latest_share_only() -> None:
    """Shares are absolute counts: of two for one (tenant, window, kind, partition) in one second
    of event time the later wins; another second is kept; of two marks of one upstream the later,
    sent after every share (a mark ahead of shares cut into a later message makes them late)."""

    async def scenario() -> list[tuple[int, list[Any]]]:
        topic = FakeTopic()
        batcher = Batcher(topic.send, linger_ms=1, max_rows=100, merge=latest_shares)
        batcher.add(
            0,
            [
                ["acme", 60, "a", 1, 3, 5_100, "e1", 0],
                ["acme", 60, "s", 1, 2, 5_100, "e1", 0],
                [None, 5_000, "a", 1],
            ],
        )
        ack = batcher.add(
            0,
            [
                ["acme", 60, "a", 1, 7, 5_900, "e2", 1],
                ["globex", 60, "a", 1, 1, 5_900, "e3", 2],
                ["acme", 60, "a", 1, 8, 6_000, "e4", 3],
                [None, 6_001, "a", 1],
            ],
        )
        await asyncio.wait_for(ack, 2)
        return topic.sent

    assert asyncio.run(scenario()) == [
        (
            0,
            [
                ["acme", 60, "a", 1, 7, 5_900, "e2", 1],
                ["acme", 60, "s", 1, 2, 5_100, "e1", 0],
                ["globex", 60, "a", 1, 1, 5_900, "e3", 2],
                ["acme", 60, "a", 1, 8, 6_000, "e4", 3],
                [None, 6_001, "a", 1],
            ],
        )
    ]
