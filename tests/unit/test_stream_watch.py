"""A partition with input waiting that makes no progress at all ends the worker (status 75)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from aiokafka.structs import TopicPartition

import pipeline.stream.watch as watch_module
from pipeline.stream.progress import Watchdog
from pipeline.stream.watch import EX_STUCK, Progress, StuckWatch, progress

TP = ("tenant-shares", 3)


def test_waiting_without_progress_counts_up_to_stuck() -> None:
    """Input waiting at an unchanged mark: 0 at first sight, then the seconds since."""
    dog = Watchdog(stuck_after_s=60.0)
    assert dog.observe(TP, mark=367, waiting=True, now_s=100.0) == 0.0
    assert dog.observe(TP, mark=367, waiting=True, now_s=130.0) == 30.0
    assert dog.stuck(TP, mark=367, waiting=True, now_s=159.9) is False
    assert dog.stuck(TP, mark=367, waiting=True, now_s=160.0) is True


def test_any_progress_or_nothing_waiting_starts_the_count_again() -> None:
    """A moved mark (however little) or no input waiting resets the count to 0."""
    dog = Watchdog(stuck_after_s=60.0)
    dog.observe(TP, mark=10, waiting=True, now_s=0.0)
    assert dog.observe(TP, mark=11, waiting=True, now_s=59.0) == 0.0
    assert dog.observe(TP, mark=11, waiting=True, now_s=118.0) == 59.0
    assert dog.observe(TP, mark=11, waiting=False, now_s=119.0) == 0.0
    assert dog.observe(TP, mark=11, waiting=True, now_s=500.0) == 0.0
    dog.forget(TP)
    assert dog.since_s == {}


@dataclass
class FakeStage:
    """A stage's two answers the watch reads."""

    owned: set[int] = field(default_factory=set)
    next_offset: dict[int, int] = field(default_factory=dict)

    def owns(self, partition: int) -> bool:
        return partition in self.owned

    def expected(self, partition: int) -> int | None:
        return self.next_offset.get(partition)


def test_progress_of_restored_unrestored_and_fresh_partitions() -> None:
    """Restored: its expected offset, waiting iff highwater > it; unrestored: the restores'
    reads, always waiting; restored with nothing applied yet: not watched."""
    stage = FakeStage(owned={0, 1}, next_offset={0: 40})
    assert progress(stage, 0, highwater=41, restore_read=9) == Progress(mark=40, waiting=True)
    assert progress(stage, 0, highwater=40, restore_read=9) == Progress(mark=40, waiting=False)
    assert progress(stage, 0, highwater=None, restore_read=9) == Progress(mark=40, waiting=False)
    assert progress(stage, 2, highwater=0, restore_read=9) == Progress(mark=-10, waiting=True)
    assert progress(stage, 1, highwater=99, restore_read=9) is None


def run_ticks(watch: StuckWatch, stage: FakeStage, highwater: int, reads: list[int]) -> list[bool]:
    tps = [TopicPartition("tenant-shares", 3)]
    return [
        asyncio.run(watch.tick(tps, {"tenant-shares": stage}, lambda tp: highwater, read, now_s=t))
        for t, read in zip((0.0, 30.0, 61.0), reads, strict=True)
    ]


def test_a_stuck_partition_drains_then_ends_the_worker_once() -> None:
    """Behind and unmoved for stuck_after_s: the waiting changelogs are drained, then on_stuck."""
    calls: list[str] = []

    async def drain() -> None:
        calls.append("drain")

    watch = StuckWatch(60.0, drain, on_stuck=lambda: calls.append("exit"))
    stage = FakeStage(owned={3}, next_offset={3: 1_000})
    assert run_ticks(watch, stage, highwater=1_367, reads=[0, 0, 0]) == [False, False, True]
    assert calls == ["drain", "exit"]
    assert EX_STUCK == 75


def test_a_restore_that_reads_is_never_stuck_and_one_that_does_not_is() -> None:
    """An unrestored partition whose restores keep reading is progressing; one whose
    restores read nothing for stuck_after_s ends the worker."""
    calls: list[str] = []

    async def drain() -> None:
        calls.append("drain")

    watch = StuckWatch(60.0, drain, on_stuck=lambda: calls.append("exit"))
    assert run_ticks(watch, FakeStage(), highwater=5, reads=[0, 1_000, 2_000]) == [False] * 3
    assert calls == []
    watch = StuckWatch(60.0, drain, on_stuck=lambda: calls.append("exit"))
    assert run_ticks(watch, FakeStage(), highwater=5, reads=[7, 7, 7]) == [False, False, True]
    assert calls == ["drain", "exit"]


def test_a_drain_that_hangs_does_not_keep_the_worker_from_exiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The drain is bounded (DRAIN_TIMEOUT_S): a stuck producer still ends in on_stuck."""
    monkeypatch.setattr(watch_module, "DRAIN_TIMEOUT_S", 0.05)
    calls: list[str] = []

    async def hang() -> None:
        await asyncio.sleep(3600)

    watch = StuckWatch(60.0, hang, on_stuck=lambda: calls.append("exit"))
    stage = FakeStage(owned={3}, next_offset={3: 1})
    assert run_ticks(watch, stage, highwater=2, reads=[0, 0, 0]) == [False, False, True]
    assert calls == ["exit"]


def test_exit_stuck_ends_the_process_with_status_75() -> None:
    """exit_stuck ends the process at once with EX_STUCK, whatever threads still run."""
    code = (
        "import threading, time\n"
        "from pipeline.stream.watch import exit_stuck\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "exit_stuck()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=30, check=False)
    assert done.returncode == 75
