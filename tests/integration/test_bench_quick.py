"""The benchmark harness runs in ``--quick`` mode and writes well-formed results.

Not a performance test: figures are not judged, only that every selected part produced
its figures and that the JSON and markdown files hold what the README promises (machine,
load, versions, ratios). The session broker is reused and the slower parts are left out
so this stays well under two minutes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


# The harness bounds each part itself (the naive faust peer: a watchdog and one retry);
# these limits only stop a hung harness, above pytest's default 300 s.
@pytest.mark.timeout(660)
def test_quick_run_writes_json_and_markdown(kafka_bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "results"
    command = [
        sys.executable,
        "-m",
        "bench.run",
        "--quick",
        "--bootstrap",
        kafka_bootstrap,
        "--out",
        str(out),
        "--parts",
        "ceiling,b1,naive",
        "--events",
        "20000",
    ]
    # About 35 s here; a loaded CI machine is slower.
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    (json_path,) = out.glob("*-quick.json")
    report = orjson.loads(json_path.read_bytes())
    assert {
        "date",
        "machine",
        "load_before",
        "load_after",
        "versions",
        "results",
        "summary",
    } <= set(report)
    assert {"nproc", "memory_mb", "cpu_model"} <= set(report["machine"])
    assert report["versions"]["faust-streaming"] and report["versions"]["kafka_broker"]
    results = report["results"]
    for part in ("ceiling", "b1", "naive"):
        assert "error" not in results[part], results[part]
        assert results[part]["events_per_s"] > 0
    assert results["b1"]["rows"] == 20_000
    # the peer ran to completion on the same topic: every event seen and counted
    assert (results["naive"]["events_seen"], results["naive"]["events_counted"]) == (20_000, 20_000)
    assert results["naive"]["complete"] is True
    assert summary_peer(report, "naive") == {
        "seen": 20_000,
        "counted": 20_000,
        "complete": True,
        "agree": True,
    }
    summary = report["summary"]
    assert summary["b1_vs_ceiling"] is not None and summary["b1_vs_naive"] is not None
    assert set(summary["met"]) >= {"b1_events_per_s", "b1_vs_naive", "b2_p99_ms", "b6_s"}

    markdown = json_path.with_suffix(".md").read_text()
    for needle in (
        "| B1 |",
        "| B6 |",
        "ceiling:",
        "naive faust:",
        "## Versions",
        "load average",
        "events seen / counted",
        "| 20,000 / 20,000 |",
    ):
        assert needle in markdown
    assert "peer naive: events seen 20000, counted 20000, complete True, agree True" in done.stdout


def summary_peer(report: dict[str, object], name: str) -> object:
    summary = report["summary"]
    assert isinstance(summary, dict)
    return summary["peers_seen_counted"][name]


@pytest.mark.timeout(300)
def test_floor_parts_run(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The floor parts (issue 28) on B1's committed traffic: each shell sends what B1's
    worker sent per event and reports its CPU per event."""
    out = tmp_path / "results"
    parts = "floor_faust,floor_faust_batched,floor_aiokafka,floor_aiokafka_batched"
    command = [sys.executable, "-m", "bench.run", "--quick", "--bootstrap", kafka_bootstrap]
    command += ["--out", str(out), "--parts", parts, "--events", "4000"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    (json_path,) = out.glob("*-quick.json")
    report = orjson.loads(json_path.read_bytes())
    results, floor = report["results"], report["summary"]["floor"]
    shape = results["floor_traffic"]
    for name in parts.split(","):
        assert "error" not in results[name], results[name]
        assert results[name]["events"] == 4000 and floor[name]["us_per_event"] > 0
        sent = results[name]["sent_per_event"]
        # as many decisions and changelog records per event as B1 (within a batch's rounding)
        b1 = shape["b1_per_event"]
        for role in ("decisions", "account_changelog", "source_changelog"):
            assert sent[role] == pytest.approx(b1[role]["messages"], rel=0.05), (name, role)
    assert "## The shell's floor" in json_path.with_suffix(".md").read_text()
