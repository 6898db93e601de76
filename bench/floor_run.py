"""The floor parts of ``bench.run`` (issue 28): B1's traffic measured, the floors run on
it, their figures against the ceiling and B1 of the same run.

``b1_traffic`` (added when a floor part and ``b1`` both run) reads back the topics the B1
worker wrote (``bench.floor_traffic.measure``); without it the floors use the committed
``B1_COUNTS``. Each floor part runs its shell as a subprocess on the B1 topic.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from bench.floor_traffic import B1_COUNTS, Counts, Traffic, measure, per_event
from bench.peers import run_peer

FLOORS = {
    "floor_faust": ("bench.floor_faust", False),
    "floor_faust_batched": ("bench.floor_faust", True),
    "floor_aiokafka": ("bench.floor_aiokafka", False),
    "floor_aiokafka_batched": ("bench.floor_aiokafka", True),
}
LABELS = {
    "floor_faust": "faust, the worker's app and agents; outputs sent as the worker sends them",
    "floor_faust_batched": "faust, every output as record batches",
    "floor_aiokafka": "plain aiokafka, outputs sent as the worker sends them",
    "floor_aiokafka_batched": "plain aiokafka, every output as record batches",
}
ENGINE_US = (1.8, 3.0)
"""The pyo3 sketch's decode and keyed counting, us per event (issue 28)."""


def b1_traffic(bootstrap: str, names: Any, events: int) -> dict[str, Any]:
    """The B1 worker's messages per topic, read back from the broker after its run."""
    outputs = {
        "decisions": names.decisions,
        "alerts": names.alerts,
        "notices": names.notices,
        "audit": names.audit,
    }
    counts = measure(bootstrap, names.app_id, outputs)
    return {"source": "measured after b1 in this run", "events": events, "counts": counts}


def traffic_file(workdir: Path, measured: dict[str, Any] | None) -> tuple[Path, dict[str, Any]]:
    """The traffic the floors send (this run's B1, else ``B1_COUNTS``), as a file."""
    if measured and "counts" in measured:
        counts: Counts = measured["counts"]
        events, source = measured["events"], measured["source"]
    else:
        counts, events, source = B1_COUNTS["counts"], B1_COUNTS["events"], B1_COUNTS["source"]
    traffic = Traffic.of(counts)
    path = workdir / "floor-traffic.json"
    path.write_bytes(orjson.dumps(asdict(traffic)))
    shape = {"source": source, "b1_per_event": per_event(counts, events), **asdict(traffic)}
    return path, shape


def run_floor(
    name: str, bootstrap: str, topic: str, events: int, traffic: Path, log: Path
) -> dict[str, Any]:
    module, batched = FLOORS[name]
    command = [sys.executable, "-m", module, bootstrap, topic, str(events), str(traffic)]
    return run_peer([*command, *(["batched"] if batched else [])], 900, log)


def _ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    return round(a / b, 3)


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per floor: us of CPU per event, its rates over the ceiling's, and B1's over its;
    and the ratio to the ceiling an engine would reach on the lowest floor."""
    ceiling, b1 = results.get("ceiling") or {}, results.get("b1") or {}
    ceiling_us = _ratio(1e6, ceiling.get("events_per_cpu_s"))
    b1_us = _ratio(1e6, b1.get("events_per_cpu_s"))
    out: dict[str, Any] = {"ceiling_us_per_event": ceiling_us, "b1_us_per_event": b1_us}
    lowest = None
    for name in FLOORS:
        part = results.get(name) or {}
        if "events_per_cpu_s" not in part:
            continue
        us = part["cpu_us_per_event"]
        out[name] = {
            "us_per_event": us,
            "events_per_s": part["events_per_s"],
            "vs_ceiling": _ratio(part["events_per_s"], ceiling.get("events_per_s")),
            "vs_ceiling_cpu": _ratio(part["events_per_cpu_s"], ceiling.get("events_per_cpu_s")),
            "b1_vs_this_cpu": _ratio(b1.get("events_per_cpu_s"), part["events_per_cpu_s"]),
        }
        lowest = us if lowest is None else min(lowest, us)
    if lowest is not None and ceiling_us:
        out["engine_vs_ceiling_cpu"] = [
            round(ceiling_us / (lowest + engine), 3) for engine in ENGINE_US
        ]
        out["lowest_floor_us"] = lowest
    return out


def _x(value: Any) -> str:
    return "n/a" if value is None else f"{value}x"


def markdown(results: dict[str, Any], floor: dict[str, Any]) -> list[str]:
    """The floor section of the run's markdown."""
    if not any(name in results for name in FLOORS):
        return []
    lines = [
        "",
        "## The shell's floor (issue 28): B1's messages, no stage work",
        "",
        f"Traffic: {(results.get('floor_traffic') or {}).get('source', 'n/a')}. "
        f"Ceiling {floor.get('ceiling_us_per_event')} us of CPU per event, B1 "
        f"{floor.get('b1_us_per_event')}.",
        "",
        "| floor | us of CPU per event | events/s | / ceiling (wall) | / ceiling (CPU) | B1 / this (CPU) |",
        "|---|---|---|---|---|---|",
    ]
    for name in FLOORS:
        part = results.get(name)
        if part is None:
            continue
        row = floor.get(name)
        if row is None:
            why = part.get("error", "not run")
            lines.append(f"| {LABELS[name]} | n/a | n/a | {why} | | |")
            continue
        lines.append(
            f"| {LABELS[name]} | {row['us_per_event']} | {row['events_per_s']:,} "
            f"| {_x(row['vs_ceiling'])} | {_x(row['vs_ceiling_cpu'])} | {_x(row['b1_vs_this_cpu'])} |"
        )
    if "engine_vs_ceiling_cpu" in floor:
        low, high = floor["engine_vs_ceiling_cpu"]
        lines += [
            "",
            f"The lowest floor ({floor['lowest_floor_us']} us) plus a compiled engine's "
            f"{ENGINE_US[0]}-{ENGINE_US[1]} us per event: {high}-{low}x the ceiling per "
            "CPU-second (target 0.3x).",
        ]
    return lines
