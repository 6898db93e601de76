"""``simulate --history-s``: the deployment's past before the run (``pipeline.sim.history``)."""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest

from pipeline.sim.history import HISTORY
from pipeline.sim.scenarios import (
    BASELINE,
    HOLDOUT_SCENARIOS,
    ScenarioError,
    SimConfig,
    SimEvent,
    generate,
)

T0 = 1_789_999_200_000
HOUR_MS = 3_600_000
SCENARIOS = (BASELINE, *HOLDOUT_SCENARIOS)


@cache
def run(history_ms: int) -> tuple[SimEvent, ...]:
    return tuple(generate(SimConfig(SCENARIOS, 2.0, HOUR_MS, 5, T0, history_ms)))


def test_no_history_is_the_run_as_before() -> None:
    """history_ms = 0 adds nothing: the run's events are those of a config without it."""
    plain = tuple(generate(SimConfig(SCENARIOS, 2.0, HOUR_MS, 5, T0)))
    assert [e.wire for e in run(0)] == [e.wire for e in plain]


def test_history_is_legitimate_and_before_the_start_and_the_run_is_unchanged() -> None:
    """Every event before the start is the history's (role legit), none after; the run's
    own events after the start are those of the run without history."""
    events = run(2 * HOUR_MS)
    before = [e for e in events if e.occurred_ms < T0]
    after = [e for e in events if e.occurred_ms >= T0]
    assert before and {(e.label.scenario, e.label.role) for e in before} == {(HISTORY, "legit")}
    assert min(e.occurred_ms for e in before) >= T0 - 2 * HOUR_MS
    assert HISTORY not in {e.label.scenario for e in after}
    assert [e.wire | {"event_id": ""} for e in after] == [e.wire | {"event_id": ""} for e in run(0)]


def test_history_has_the_apps_syncs_and_the_returning_people_but_no_attacker() -> None:
    """Each phone app syncs once (a token success with its install id), the held-out people
    at home return at their stated shares, and no attacker address appears."""
    history = [e for e in run(2 * HOUR_MS) if e.label.scenario == HISTORY]
    apps = [e for e in history if str(e.wire.get("device_id", "")).endswith("-app")]
    syncs = [e for e in apps if e.wire["outcome"] == "success"]
    assert {e.wire["flow"] for e in apps} == {"token"}  # stale apps of the history fail too
    synced = {e.wire["device_id"] for e in syncs if e.wire["peer_ip"].startswith("172.")}
    assert len(synced) > 3000  # every phone of both tenants (and stale apps' last tries)
    cohorts = Counter(e.label.cohort for e in history)
    assert {"identifier_tryer", "stale_username", "forgot_password", "library_regular"} <= set(
        cohorts
    )
    run_addresses = {e.wire["peer_ip"] for e in run(0) if e.label.role == "attacker"}
    assert run_addresses.isdisjoint({e.wire["peer_ip"] for e in history})


def test_negative_history_is_refused() -> None:
    """A negative history is a clear error, not an empty one."""
    with pytest.raises(ScenarioError, match="history -1 ms must be 0 or more"):
        list(generate(SimConfig(SCENARIOS, 2.0, HOUR_MS, 5, T0, -1)))
