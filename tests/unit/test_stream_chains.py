"""Changelog writes wait for their envelope's acknowledgements, in envelope order, bounded."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.stream.chains import ChangelogChains


def test_writes_follow_acknowledgements_in_envelope_order() -> None:
    """A later envelope acknowledged first still has its changelog written after the earlier one."""

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        written: list[str] = []
        first, second = loop.create_future(), loop.create_future()
        chains = ChangelogChains(max_inflight=4)

        async def write(name: str) -> None:
            written.append(name)

        await chains.add("p0", [first], lambda: write("first"))
        await chains.add("p0", [second], lambda: write("second"))
        second.set_result(None)
        await asyncio.sleep(0.01)
        assert written == []
        first.set_result(None)
        await chains.drain()
        return written

    assert asyncio.run(scenario()) == ["first", "second"]


def test_the_agent_waits_once_max_inflight_envelopes_are_pending() -> None:
    """With max_inflight=2 the third add waits until the oldest is written."""

    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        acks = [loop.create_future() for _ in range(3)]
        chains = ChangelogChains(max_inflight=2)

        async def nothing() -> None:
            return None

        await chains.add("p0", [acks[0]], nothing)
        await chains.add("p0", [acks[1]], nothing)
        third = asyncio.ensure_future(chains.add("p0", [acks[2]], nothing))
        await asyncio.sleep(0.01)
        blocked = not third.done()
        acks[0].set_result(None)
        await asyncio.wait_for(third, 1)
        for ack in acks[1:]:
            ack.set_result(None)
        await chains.drain()
        return blocked, chains.inflight() == 0

    assert asyncio.run(scenario()) == (True, True)


def test_a_failed_send_is_raised_to_the_agent_and_nothing_after_it_is_written() -> None:
    """A failed acknowledgement surfaces at the next add of its partition; later writes never happen."""

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        written: list[str] = []
        failed, fine = loop.create_future(), loop.create_future()
        chains = ChangelogChains(max_inflight=1)

        async def write(name: str) -> None:
            written.append(name)

        await chains.add("p0", [failed], lambda: write("failed"))
        failed.set_exception(RuntimeError("broker said no"))
        fine.set_result(None)
        with pytest.raises(RuntimeError, match="broker said no"):
            await chains.add("p0", [fine], lambda: write("after"))
        return written

    assert asyncio.run(scenario()) == []
