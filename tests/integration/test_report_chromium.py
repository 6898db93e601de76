"""The HTML report in headless Chromium (Debian's chromium): charts render, no JS errors.

Chromium must be installed (``apt-get install chromium``; ``scripts/setup`` does it). A
missing browser fails this test with that advice: it never skips.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.core.policy import DEFAULT_POLICY
from pipeline.settings import load_settings
from pipeline.sim.outputs import run_engine
from pipeline.sim.report import ReportInputs, write_report
from pipeline.sim.scenarios import MIXED_SCENARIOS, SimConfig
from pipeline.sim.scoring import score
from pipeline.sim.simulate import SimulateOptions, dry_run
from pipeline.sim.truth import load_truth
from pipeline.wiring import build_normaliser

BROWSER_TIMEOUT_S = 90
CHARTS = ("traffic", "timeline", "sources", "accounts", "alerts")


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(
            "chromium is not installed: run `apt-get install chromium` (Debian package; "
            "scripts/setup installs it) to run the report test",
            pytrace=False,
        )
    return path


HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
"""Headless Chromium on this closed network (root, no GPU; without the background-networking
flags it keeps trying Google's hosts): every browser test's flags, with its own profile."""


def headless(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium(),
            *HEADLESS_FLAGS,
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            *extra,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=BROWSER_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report of a small mixed run decided by the core Engine."""
    tmp = tmp_path_factory.mktemp("report")
    config = SimConfig(MIXED_SCENARIOS, 5.0, 300_000, 5, 1_790_000_123_000)
    dry_run(SimulateOptions(config, 0, tmp / "truth.jsonl", tmp / "events.jsonl"))
    events = load_truth(tmp / "truth.jsonl", build_normaliser(load_settings()))
    outputs = run_engine(events, DEFAULT_POLICY)
    card = score(events, outputs).as_json()
    return write_report(ReportInputs(events, outputs, card, "test report"), tmp / "report.html")


def test_report_renders_every_chart_without_errors(report: Path, tmp_path: Path) -> None:
    """The dumped DOM has the success marker for 6 sections, an SVG per chart with its marks,
    the scorecard rows with their statuses and closing line, the role legend, the overlap
    note, alerts clustered (every alert counted once per timeline it falls on), each busy
    run's zoom with its range, round-minute ticks (round 10 s on a zoom), no error element,
    and Chromium logged no console error."""
    done = headless(report, tmp_path / "profile", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-charts-rendered="6"' in dom, dom[:2000]
    assert 'data-js-error="1"' not in dom, re.findall(r'data-js-error="1">[^<]*', dom)
    for chart in CHARTS:
        assert f'data-chart="{chart}"' in dom, chart
    assert 'data-series="attempts"' in dom and 'data-series="refused"' in dom
    assert dom.count("data-decision=") >= 5
    assert dom.count("data-alert=") >= 5
    statuses = re.findall(r'class="status-([a-z_]+)"', dom)
    assert len(statuses) == 7 and set(statuses) <= {"stopped", "slowed", "detected_only", "missed"}
    assert 'data-summary="1"' in dom and "all attacks caught" not in dom
    assert 'data-legend="roles"' in dom and "mostly attacker" in dom
    assert 'data-note="overlap"' in dom
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', report.read_text(), re.S)[1])
    marks = [int(n) for n in re.findall(r'data-alerts="(\d+)"', dom)]
    # Each alert counted once on the whole run's timeline and once more on the zoom of the
    # busy run it falls in (a second chart, issue 46 item 8).
    zoomed = sum(len(zoom["alerts"]) for zoom in data.get("zooms", []))
    assert sum(marks) == len(data["alerts"]) + zoomed
    assert len(marks) < len(data["alerts"]) + zoomed  # clustered
    for i, zoom in enumerate(data.get("zooms", [])):
        start, end = zoom["range"]["start_ms"], zoom["range"]["end_ms"]
        assert f'data-zoom="{i}" data-zoom-start="{start}" data-zoom-end="{end}"' in dom
    whole, _, zooms = dom.partition('id="zooms"')
    ticks = [int(t) for t in re.findall(r'data-tick="(\d+)"', whole)]
    assert ticks and all(t % 60_000 == 0 for t in ticks), ticks  # round minutes
    zoom_ticks = [int(t) for t in re.findall(r'data-tick="(\d+)"', zooms)]
    assert all(t % 10_000 == 0 for t in zoom_ticks), zoom_ticks  # round 10 s on a zoom
    assert not re.search(r"CONSOLE|Uncaught|SyntaxError", done.stderr), done.stderr[-2000:]


def test_report_screenshot(report: Path, tmp_path: Path) -> None:
    """A full-page screenshot is written (a PNG of the requested size) with no console error."""
    shot = tmp_path / "report.png"
    done = headless(report, tmp_path / "profile", "--window-size=1280,2400", f"--screenshot={shot}")
    assert done.returncode == 0, done.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (1280, 2400)
    assert not re.search(r"CONSOLE|Uncaught|SyntaxError", done.stderr), done.stderr[-2000:]
