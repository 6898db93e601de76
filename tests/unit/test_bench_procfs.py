"""bench.procfs reads a process's memory fields from /proc, and nothing for a gone one."""

from __future__ import annotations

from bench.procfs import status_kb


def test_own_resident_size_is_read_in_kb() -> None:
    """This process reports VmRSS and VmHWM, in kB, the peak no lower than now."""
    fields = status_kb("self", ("VmRSS", "VmHWM"))
    assert sorted(fields) == ["VmHWM", "VmRSS"]
    assert 0 < fields["VmRSS"] <= fields["VmHWM"]


def test_a_process_that_is_gone_reports_no_fields() -> None:
    """No such pid: an empty answer, not an error."""
    assert status_kb(2**30, ("VmRSS",)) == {}
