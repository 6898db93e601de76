"""Ingest's event-time marks: newest per partition, idle partitions released, the tail flushed."""

from __future__ import annotations

from pipeline.stream.marks import InputMarks, MarkRounds


def test_a_partition_being_read_marks_its_newest_event_and_holds_the_others() -> None:
    """Each partition marks the newest event read there; one not read yet has no mark."""
    marks = InputMarks(idle_ms=500, slack_ms=1000)
    marks.observe(0, 10_000, 0)
    marks.observe(1, 7_000, 0)
    assert marks.marks([0, 1, 2], [], 0) == [[0, 10_000], [1, 7_000]]


def test_a_partition_idles_only_after_being_read_to_its_end_for_idle_ms() -> None:
    """An empty partition is not idle the moment it is seen at its end (its first events may be in
    flight): only after idle_ms in a row; then it marks slack_ms below the oldest event that
    reached any partition in the last idle_ms, so a backlog starting elsewhere is not overtaken."""
    marks = InputMarks(idle_ms=500, slack_ms=1000)
    assert marks.marks([0, 1], [1], 0) == []
    marks.observe(0, 10_000, 550)
    marks.observe(0, 12_000, 560)
    assert marks.marks([0, 1], [1], 100) == [[0, 12_000]]
    assert marks.marks([0, 1], [1], 599) == [[0, 12_000], [1, 9_000]]
    marks.observe(0, 14_000, 1_000)
    assert marks.marks([0, 1], [1], 1_100) == [
        [0, 14_000],
        [1, 13_000],
    ]  # 10 s and 12 s left the window
    assert marks.marks([0, 1], [], 1_200) == [[0, 14_000]]  # data again: no longer idle
    assert marks.marks([0, 1], [1], 1_300) == [[0, 14_000]]


def test_everything_read_is_released_once_every_partition_idles() -> None:
    """Every partition at its end for idle_ms: the marks pass the newest event (the backlog's tail)."""
    marks = InputMarks(idle_ms=500, slack_ms=1000)
    marks.observe(0, 10_000, 0)
    marks.observe(1, 9_000, 0)
    assert marks.marks([0, 1], [0, 1], 100) == [[0, 10_000], [1, 9_000]]
    assert marks.marks([0, 1], [0, 1], 600) == [[0, 10_001], [1, 10_001]]


def test_the_flush_is_no_lower_than_the_wall_clock_less_the_slack() -> None:
    """While live (the newest event arrived within slack_ms of occurring), a flush passes events
    another ingest read (or this one before a restart): wall - slack."""
    marks = InputMarks(idle_ms=500, slack_ms=1000)
    marks.observe(0, 10_000, 0)
    marks.marks([0], [0], 50_000)
    assert marks.marks([0], [0], 50_500) == [[0, 49_500]]
    assert marks.marks([0], [0], 90_000) == [
        [0, 49_500]
    ]  # once per quiet period: no heartbeat storm


def test_a_producer_writing_the_past_is_flushed_to_its_newest_event_not_the_wall_clock() -> None:
    """A backfill (newest event read 40 s after it occurred) that pauses past idle_ms: the flush
    stops just past the newest event read, so what the producer writes next is not late."""
    marks = InputMarks(idle_ms=500, slack_ms=1000)
    marks.observe(0, 10_000, 50_000)
    marks.marks([0], [0], 50_000)
    assert marks.marks([0], [0], 50_500) == [[0, 10_001]]
    marks.observe(0, 10_200, 51_000)  # the producer goes on: not late
    assert marks.marks([0], [], 51_000) == [[0, 10_200]]


def test_a_quiet_replay_of_history_is_not_overtaken_by_the_wall_clock() -> None:
    """A backlog an hour old read, then quiet (a producer pause, the next replay starting): the
    marks pass its newest event and stay there, whatever the wall clock says, so the next
    events (the replay resuming, or the demo's mixed hour after its patient day) are not late."""
    hour_ms = 3_600_000
    marks = InputMarks(idle_ms=500, slack_ms=1000)
    marks.observe(0, 10_000, 10 * hour_ms)
    marks.observe(1, 9_000, 10 * hour_ms)
    marks.marks([0, 1], [0, 1], 10 * hour_ms)
    assert marks.marks([0, 1], [0, 1], 10 * hour_ms + 500) == [[0, 10_001], [1, 10_001]]
    assert marks.marks([0, 1], [0, 1], 11 * hour_ms) == [[0, 10_001], [1, 10_001]]
    marks.observe(1, 10_001, 11 * hour_ms)  # the replay resumes at its newest event + 1 ms
    assert marks.marks([0, 1], [0], 11 * hour_ms) == [[0, 10_000], [1, 10_001]]


def test_a_live_partition_read_to_its_end_marks_its_fetch_time_less_the_live_slack() -> None:
    """Live (events handed over within live_slack_ms of occurring): a partition at its end marks
    the time of the fetch that showed its end less live_slack_ms, never past the newest event +
    1, without waiting idle_ms; a partition not at its end keeps its newest event."""
    marks = InputMarks(idle_ms=500, slack_ms=1000, live_slack_ms=50)
    marks.observe(0, 10_000, 10_030, 10_010)
    assert marks.marks([0, 1, 2], [1, 2], 10_030, {1: 10_030, 2: 10_020}) == [
        [0, 10_000],
        [1, 9_980],
        [2, 9_970],
    ]
    assert marks.marks([0, 1, 2], [0, 1, 2], 10_080, {0: 10_080, 1: 10_080, 2: 10_075}) == [
        [0, 10_001],
        [1, 10_001],
        [2, 10_001],
    ]


def test_an_event_handed_over_later_than_the_live_slack_turns_live_marks_off_for_idle_ms() -> None:
    """One event 80 ms old when handed over (slack 50): no live marks until idle_ms has passed
    without such an event; the idle rules still apply."""
    marks = InputMarks(idle_ms=500, slack_ms=1000, live_slack_ms=50)
    marks.observe(0, 10_000, 10_090, 10_080)
    assert marks.marks([0, 1], [0, 1], 10_100, {0: 10_100, 1: 10_100}) == [[0, 10_000]]
    marks.observe(0, 10_550, 10_560, 10_560)
    assert marks.marks([0, 1], [1], 10_580, {1: 10_580}) == [[0, 10_550]]  # 490 ms later
    marks.observe(0, 10_580, 10_595, 10_590)
    assert marks.marks([0, 1], [0, 1], 10_600, {0: 10_600, 1: 10_600}) == [
        [0, 10_580],
        [1, 10_550],
    ]
    assert marks.slow_arrivals == 1  # the shell exports it, authpipe_ingest_slow_arrivals_total


def test_a_backfill_gets_no_live_marks() -> None:
    """Events an hour old when handed over: the live marks stay off (the wall clock must not
    pass what a producer writing the past sends next)."""
    hour_ms = 3_600_000
    marks = InputMarks(idle_ms=500, slack_ms=1000, live_slack_ms=50)
    marks.observe(0, 10_000, 10_000 + hour_ms, 10_000 + hour_ms)
    assert marks.marks(
        [0, 1], [0, 1], 10_010 + hour_ms, {0: 10_010 + hour_ms, 1: 10_010 + hour_ms}
    ) == [[0, 10_000]]


def test_without_fetch_times_or_with_live_slack_0_there_are_no_live_marks() -> None:
    """live_slack_ms 0 (off), or no fetch times given: the marks are the idle rules' alone."""
    for marks, fetched in (
        (InputMarks(idle_ms=500, slack_ms=1000, live_slack_ms=0), {0: 10_100, 1: 10_100}),
        (InputMarks(idle_ms=500, slack_ms=1000, live_slack_ms=50), None),
    ):
        marks.observe(0, 10_000, 10_010, 10_005)
        assert marks.marks([0, 1], [0, 1], 10_100, fetched) == [[0, 10_000]]


def test_the_live_slack_grows_to_the_slowest_hand_over_of_the_last_idle_ms() -> None:
    """live_slack_max_ms 300: an event handed over 120 ms after it occurred makes the live
    mark F - 120 for idle_ms (not off, not a slow arrival), then F - 50 again; one 301 ms late
    turns it off (a slow arrival)."""
    marks = InputMarks(idle_ms=500, slack_ms=1000, live_slack_ms=50, live_slack_max_ms=300)
    marks.observe(0, 10_000, 10_020, fetched_ms=10_020)
    assert marks.marks([0, 1], [1], 10_030, {1: 10_030}) == [[0, 10_000], [1, 9_980]]
    marks.observe(0, 10_100, 10_220, fetched_ms=10_220)
    assert marks.marks([0, 1], [1], 10_230, {1: 10_230}) == [[0, 10_100], [1, 10_101]]
    assert marks.marks([0, 1], [1], 10_240, {1: 10_200}) == [[0, 10_100], [1, 10_080]]
    marks.observe(0, 10_700, 10_710, fetched_ms=10_710)  # the 120 ms left the last idle_ms
    assert marks.marks([0, 1], [1], 10_721, {1: 10_721}) == [[0, 10_700], [1, 10_671]]
    marks.observe(0, 10_800, 10_830, fetched_ms=10_830)
    assert marks.marks([0, 1], [1], 10_840, {1: 10_840}) == [[0, 10_800], [1, 10_790]]
    marks.observe(0, 10_900, 11_201, fetched_ms=11_201)
    # off: partition 1 falls back to the idle rule (oldest recent event less slack_ms)
    assert marks.marks([0, 1], [1], 11_210, {1: 11_210}) == [[0, 10_900], [1, 9_700]]
    assert marks.slow_arrivals == 1


def test_without_a_max_the_first_slow_hand_over_turns_the_live_marks_off() -> None:
    """live_slack_max_ms 0 (a fixed slack): 51 ms late is enough to fall back."""
    marks = InputMarks(idle_ms=500, slack_ms=1000, live_slack_ms=50)
    marks.observe(0, 10_000, 10_051, fetched_ms=10_051)
    assert marks.marks([0, 1], [1], 10_060, {1: 10_060}) == [[0, 10_000]]


def row(input_partition: int, occurred_ms: int) -> list[object]:
    """An ingest row: only its input partition (field 0) and event time (field 5) matter."""
    return [input_partition, 0, "t", "a", "s", occurred_ms]


def test_mark_rounds_send_to_partitions_with_rows_or_held_rows_and_the_rest_every_interval() -> (
    None
):
    """4 account partitions, 100 ms: rows go to their partition with the marks; changed
    marks go to a partition still holding rows at once, to the others once 100 ms passed."""
    rounds = MarkRounds(4, 100)
    assert rounds.targets({}, [[0, 1_000]], 0) == {0, 1, 2, 3}
    assert rounds.targets({2: [row(0, 1_500)]}, [[0, 1_500]], 20) == {2}
    assert rounds.targets({}, [[0, 1_500]], 30) == set()  # 2 has these; the rest wait
    assert rounds.targets({}, [[0, 1_501]], 40) == {2}  # releases 2's row at 1,500
    assert rounds.targets({}, [[0, 1_600]], 60) == set()  # nothing held anywhere
    assert rounds.targets({}, [[0, 1_600]], 100) == {0, 1, 3}
    assert rounds.targets({}, [[0, 1_700]], 145) == {2}
    assert rounds.targets({}, [[0, 1_700]], 200) == {0, 1, 3}
    assert rounds.targets({}, [[0, 1_700]], 400) == set()  # unchanged: never re-sent


def test_mark_rounds_with_interval_0_send_every_changed_batch_everywhere() -> None:
    """interval_ms 0: the old rounds (every partition whenever the marks change)."""
    rounds = MarkRounds(2, 0)
    assert rounds.targets({}, [[0, 1_000]], 0) == {0, 1}
    assert rounds.targets({1: [row(0, 1_100)]}, [[0, 1_100]], 1) == {0, 1}
    assert rounds.targets({}, [[0, 1_100]], 2) == set()


def test_ingest_waits_its_fetch_wait_for_a_first_record_then_lingers() -> None:
    """A quiet input: one getmany of input_fetch_wait_ms, then the loop moves its marks; a
    record: the batch lingers up to batch_max_wait_ms for more (the consumer's fetch wait
    is input_fetch_wait_ms too)."""
    import asyncio
    from typing import Any

    from pipeline.settings import load_settings
    from pipeline.stream.ingest_loop import gather_batch, ingest_consumer_options

    settings = load_settings(worker={"input_fetch_wait_ms": 5, "batch_max_wait_ms": 30})
    asked: list[int] = []

    def getmany_returning(answers: list[dict[Any, list[Any]]]) -> Any:
        async def getmany(timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
            asked.append(timeout_ms)
            return answers.pop(0) if answers else {}

        return getmany

    assert asyncio.run(gather_batch(getmany_returning([]), settings.worker)) == {}
    assert asked == [5]
    asked.clear()
    batch = asyncio.run(gather_batch(getmany_returning([{"tp": [1]}]), settings.worker))
    assert batch == {"tp": [1]}
    assert asked[0] == 5 and len(asked) > 1 and all(0 < t <= 30 for t in asked[1:])
    assert ingest_consumer_options(settings)["fetch_max_wait_ms"] == 5
