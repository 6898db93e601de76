"""The report gives a busy run its own time axis: the mixed hour after a patient attacker's
day is not squeezed into the last pixels of the day (issue 46, item 8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from pipeline.core.policy import DEFAULT_POLICY
from pipeline.sim.outputs import run_engine
from pipeline.sim.report import ReportInputs, build_data, busy_spans, render_html
from tests.unit.test_sim_scorecard import SEC, T0, load, row

HOUR = 3600 * SEC
DAY = 24 * HOUR


def day_then_busy_hour() -> list[dict[str, Any]]:
    """A patient attacker guesses every 4 min for a day from T0 (360 events); then, from
    T0 + 24 h, people sign in every 2 s for an hour (1,800 events)."""
    rows = [
        row(
            k,
            T0 + k * 240 * SEC,
            "victim",
            "203.0.113.9",
            role="attacker",
            scenario="low_and_slow_bruteforce",
            cohort="attacker",
        )
        for k in range(360)
    ]
    rows += [
        row(1000 + k, T0 + DAY + 2 * SEC * k, f"user{k % 40}", "198.18.0.9", ok=True)
        for k in range(1800)
    ]
    return rows


def test_the_busy_hour_gets_its_own_chart_covering_only_it(tmp_path: Path) -> None:
    """One zoom, from the busy hour's first event to its end, in 30 s buckets (the last one,
    which the hour covers in part, left out); the page carries exactly that range."""
    events = load(tmp_path, day_then_busy_hour())
    data = build_data(ReportInputs(events, run_engine(events, DEFAULT_POLICY), None))
    assert data["series"]["bucket_ms"] == 900_000  # the whole day and hour: 15 min buckets
    (zoom,) = data["zooms"]
    assert zoom["range"] == {"start_ms": T0 + DAY, "end_ms": T0 + DAY + HOUR}
    assert zoom["events"] == 1800
    series = zoom["series"]
    assert (series["start_ms"], series["bucket_ms"], series["bucket_label"]) == (
        T0 + DAY,
        30 * SEC,
        "30 s",
    )
    assert len(series["attempts"]) == 119
    assert series["attempts"][:2] == [15, 15]
    assert series["trimmed"] == {"first": False, "last": True, "events": 15}
    page = render_html(data)
    payload = page.split('<script type="application/json" id="report-data">')[1]
    shown = orjson.loads(payload.split("</script>")[0].replace("<\\/", "</"))
    assert shown["zooms"][0]["range"] == {"start_ms": T0 + DAY, "end_ms": T0 + DAY + HOUR}
    assert '<section class="wide" id="zooms"' in page


def test_even_traffic_gets_no_zoom() -> None:
    """A steady run has no stretch the whole-span chart squeezes: no zoom."""
    assert busy_spans([T0 + k * 2 * SEC for k in range(3000)]) == []


def test_two_busy_hours_a_day_apart_get_one_zoom_each() -> None:
    """Two busy hours separated by a quiet day are two runs, each with its own range."""
    quiet = [T0 + k * 600 * SEC for k in range(150)]
    first = [T0 + HOUR + k * SEC for k in range(3600)]
    second = [T0 + 2 * DAY + k * SEC for k in range(3600)]
    times = sorted(quiet + first + second)
    assert busy_spans(times) == [
        (T0 + HOUR, T0 + 2 * HOUR),
        (T0 + 2 * DAY, T0 + 2 * DAY + HOUR),
    ]
