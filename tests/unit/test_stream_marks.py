"""Ingest's event-time marks: newest per partition, idle partitions released, the tail flushed."""

from __future__ import annotations

from pipeline.stream.marks import InputMarks


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
