"""A crash mid-way through a message's changelog: the restore counts whole messages only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple, replace
from typing import Any

import pytest

from pipeline.settings import Settings
from pipeline.stream.envelopes import StageOutput, commit_key
from pipeline.stream.memory import MemoryPipeline
from pipeline.stream.restore import ChangelogFold
from pipeline.stream.rollup_stage import RollupStage
from pipeline.stream.stages import AccountStage, SourceStage
from tests.unit.test_stream_memory import NOW_MS
from tests.unit.test_stream_order import POLICY, RECORDS

PARTITIONS = Settings().kafka.partitions
Changelog = list[tuple[bytes, bytes | None]]


def test_the_fold_keeps_records_up_to_the_last_commit_and_drops_the_torn_tail() -> None:
    """Records after the last commit record (values and tombstones) reach nothing; before it, all do."""
    fold = ChangelogFold(commit_key(3))
    for key, value in [
        (b"a", b"1"),
        (b"b", b"2"),
        (commit_key(3), b"10"),
        (b"a", None),
        (b"c", b"3"),
        (commit_key(3), b"11"),
        (b"c", b"4"),
        (b"b", None),
        (commit_key(4), b"99"),  # another partition's commit key is an ordinary record
    ]:
        fold.add(key, value)
    assert fold.live == {b"b": b"2", commit_key(3): b"11", b"c": b"3"}
    assert fold.torn == 3


def test_without_a_commit_key_every_record_counts() -> None:
    """The fold of a changelog with no commit record keeps the last value per key, minus tombstones."""
    fold = ChangelogFold(None)
    for key, value in [(b"a", b"1"), (b"b", b"2"), (b"a", None), (b"b", b"3")]:
        fold.add(key, value)
    assert (fold.live, fold.torn) == ({b"b": b"3"}, 0)


Call = tuple[int, tuple[Any, ...], StageOutput]


def recorded_calls() -> dict[str, list[Call]]:
    """Every message each stage of the twin applied (partition, arguments, output)."""
    twin = MemoryPipeline(Settings(), POLICY)
    calls: dict[str, list[Call]] = {"account": [], "source": [], "rollup": []}
    for name, stage in (
        ("account", twin.accounts),
        ("source", twin.sources),
        ("rollup", twin.rollup),
    ):
        original = stage.process

        def process(
            partition: int,
            *args: Any,
            _run: Callable[..., StageOutput] = original,
            _name: str = name,
        ) -> StageOutput:
            result = _run(partition, *args)
            calls[_name].append((partition, args, result))
            return result

        stage.process = process  # type: ignore[method-assign,assignment]
    for start in range(0, len(RECORDS), 400):
        twin.feed(RECORDS[start : start + 400], NOW_MS)
    twin.finish()
    return calls


CALLS = recorded_calls()


def fresh(name: str) -> AccountStage | SourceStage | RollupStage:
    if name == "account":
        return AccountStage(POLICY, PARTITIONS, input_topic=Settings().kafka.input_topic)
    if name == "source":
        return SourceStage(POLICY, PARTITIONS)
    return RollupStage(POLICY, PARTITIONS)


def offset_of(name: str, args: tuple[Any, ...]) -> int:
    offset: int = args[1] if name == "rollup" else args[0]
    return offset


def restored_then_applied(
    name: str, partition: int, changelog: Changelog, args: tuple[Any, ...], commit: bool
) -> tuple[Any, ...]:
    """A fresh stage rebuilt from ``changelog`` (folded as the restore does), its input read
    again from the offset it expects (the message holding its oldest held row), then the
    message applied: everything it sends and writes."""
    fold = ChangelogFold(commit_key(partition) if commit else None)
    for key, value in changelog:
        fold.add(key, value)
    stage = fresh(name)
    stage.rebuild(partition, fold.live.items())
    target = offset_of(name, args)
    for p, earlier, _ in CALLS[name]:
        offset = offset_of(name, earlier)
        if p == partition and (stage.expected(partition) or 0) <= offset < target:
            stage.process(partition, *earlier)
    return astuple(stage.process(partition, *args))


def sent(output: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a stage's output sends and writes, without its mark (a restored stage sends its
    watermark again) and counters of held rows."""
    result = StageOutput(*output)
    return astuple(replace(result, mark_ms=None, held=0, held_records=0))


@pytest.mark.parametrize("name", ["account", "source", "rollup"])
def test_a_message_whose_changelog_was_cut_anywhere_is_applied_again_as_if_never_written(
    name: str,
) -> None:
    """For every cut of the largest message's changelog, restore + re-apply sends and writes what restoring before it does."""
    calls = CALLS[name]
    at = max(range(len(calls)), key=lambda i: len(calls[i][2].changelog))
    partition, args, result = calls[at]
    before: Changelog = [
        record for p, _, earlier in calls[:at] if p == partition for record in earlier.changelog
    ]
    assert len(result.changelog) >= 20
    expected = restored_then_applied(name, partition, before, args, commit=True)
    # Read again from where its changelog says, the stage holds what it held: it does what
    # the stage that never stopped did.
    assert sent(expected) == sent(astuple(result))
    cuts = range(len(result.changelog))
    for cut in cuts:
        torn = before + result.changelog[:cut]
        assert restored_then_applied(name, partition, torn, args, commit=True) == expected, cut
    # Counting the torn records as state (no commit record) changes what the stage does.
    assert any(
        restored_then_applied(name, partition, before + result.changelog[:cut], args, commit=False)
        != expected
        for cut in cuts
    )
