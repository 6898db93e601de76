"""Envelopes are applied in offset order per partition, whatever order faust delivers them in."""

from __future__ import annotations

from pipeline.core.policy import DEFAULT_POLICY
from pipeline.stream.progress import Admit, InputOrder
from pipeline.stream.stages import AccountStage

TP = ("attempts-by-account", 1)


def test_the_expected_offset_is_applied_and_older_ones_are_replays() -> None:
    """offset == expected applies; offset < expected is a replay."""
    order = InputOrder()
    assert order.admit(TP, 7, 7, now_s=0.0) is Admit.APPLY
    assert order.admit(TP, 6, 7, now_s=0.0) is Admit.REPLAY


def test_a_hole_seeks_back_once_per_retry_interval() -> None:
    """Offsets past a hole seek back once, then wait, then seek again after retry_s."""
    order = InputOrder(retry_s=2.0)
    assert order.admit(TP, 9, 7, now_s=10.0) is Admit.SEEK
    assert order.admit(TP, 10, 7, now_s=11.0) is Admit.WAIT
    assert order.admit(TP, 11, 7, now_s=12.5) is Admit.SEEK
    assert order.admit(TP, 7, 7, now_s=12.6) is Admit.APPLY
    assert order.admit(TP, 9, 8, now_s=12.7) is Admit.SEEK


def test_an_idle_partition_behind_its_highwater_is_stranded_after_stranded_after_s() -> None:
    """Idle with messages past the expected offset for stranded_after_s: stranded, then again."""
    order = InputOrder(retry_s=1.0, stranded_after_s=2.0)
    assert order.stranded(TP, expected=3, highwater=5, idle=True, now_s=0.0) is False
    assert order.stranded(TP, expected=3, highwater=5, idle=True, now_s=1.9) is False
    assert order.stranded(TP, expected=3, highwater=5, idle=True, now_s=2.0) is True
    assert order.stranded(TP, expected=3, highwater=5, idle=True, now_s=3.0) is False
    assert order.stranded(TP, expected=3, highwater=5, idle=True, now_s=4.0) is True


def test_a_busy_or_caught_up_partition_is_never_stranded() -> None:
    """A busy agent, progress, or no message past the expected offset restarts the clock."""
    order = InputOrder(retry_s=1.0, stranded_after_s=2.0)
    assert order.stranded(TP, expected=3, highwater=5, idle=True, now_s=0.0) is False
    assert order.stranded(TP, expected=3, highwater=5, idle=False, now_s=5.0) is False
    assert order.stranded(TP, expected=3, highwater=5, idle=True, now_s=6.0) is False
    assert order.stranded(TP, expected=4, highwater=5, idle=True, now_s=7.9) is False
    assert order.stranded(TP, expected=4, highwater=5, idle=True, now_s=9.9) is True
    assert order.stranded(TP, expected=5, highwater=5, idle=True, now_s=20.0) is False
    assert order.stranded(TP, expected=5, highwater=None, idle=True, now_s=30.0) is False


def test_the_next_envelope_offset_survives_a_rebuild_from_the_changelog() -> None:
    """A stage persists the offset after its last envelope and gets it back on rebuild."""
    stage = AccountStage(DEFAULT_POLICY, 4, input_topic="in")
    stage.rebuild(2, [])
    assert stage.expected(2) is None
    result = stage.process(2, 41, [])
    assert stage.expected(2) == 42
    again = AccountStage(DEFAULT_POLICY, 4, input_topic="in")
    again.rebuild(2, [(k, v) for k, v in result.changelog if v is not None])
    assert again.expected(2) == 42
    again.drop(2)
    assert again.expected(2) is None


def test_by_default_a_partition_is_stranded_only_after_ten_idle_seconds() -> None:
    """faust's delivery loop blocked on another agent's full queue looks idle for seconds: 10 s."""
    order = InputOrder()
    assert order.stranded(TP, expected=3, highwater=5, idle=True, now_s=0.0) is False
    assert order.stranded(TP, expected=3, highwater=5, idle=True, now_s=9.9) is False
    assert order.stranded(TP, expected=3, highwater=5, idle=True, now_s=10.0) is True
