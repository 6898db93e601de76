"""One command for every benchmark: ``python -m bench.run [--quick] [--out bench/results]``.

Starts a local Kafka broker (jars from ``.state/kafka/libs``; or uses ``--bootstrap``),
pre-loads the mixed topic once, and measures in one run, on one machine:

* the ceiling (``bench.peers.ceiling``), the worker (B1), the naive faust peer and the
  Quix Streams peer over that same topic;
* B2 latency, B3 flood, B6 restart (``bench.stream``);
* the core (``bench.bench_core``), the edge (``bench.bench_edge``: B4) and the audit sink
  (``bench.bench_sink``: B5), as subprocesses; a module that does not exist is reported
  as ``missing``.

Writes ``<out>/<UTC date>[-quick].json`` and ``.md``: figures, ratios to the ceiling and
to each peer, targets, the machine (nproc, memory, CPU model, load before and after) and
versions. ``--quick`` scales everything down (under two minutes on an idle machine; the
Quix peer runs only if its virtualenv already exists, see ``bench.peers.quix``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench import floor_run, latency, stream
from bench.peers import REPO_ROOT, run_peer, tail
from bench.peers import quix as quix_env
from pipeline.logs import configure_logging, get_logger

log = get_logger("bench")

PARTS = (
    "ceiling",
    "b1",
    "b1_3m",
    "b1_peers",
    "b1_group",
    "naive",
    "quix",
    *floor_run.FLOORS,
    "b2",
    "b2_unsaturated",
    "b3",
    "b6",
    "b7",
    "core",
    "edge",
    "sink",
    "b8",
)
B1_SEGMENTS = 2
"""B1 (1M) in two stretches of account rows, as b1_3m's six (bench.stream.B1_3M_SEGMENTS)."""
TARGETS = {
    "b1_events_per_s": 50_000,
    "b1_vs_naive": 10.0,
    "b1_vs_ceiling": 0.3,
    "b1_vs_quix_cpu": 10.0,
    "b1_3m_vs_b1_cpu": 0.9,
    "b2_p99_ms": 100.0,
    "b2_edge_p99_ms": 150.0,
    "b3_rss_mb": 512.0,
    "b3_vs_b1": 0.8,
    "b6_s": 15.0,
    "b7_p99_ms": 150.0,
}


@dataclass(frozen=True)
class Plan:
    """Sizes of one run."""

    quick: bool
    scale: stream.Scale
    peer_events: int
    peer_timeout_s: float
    external: dict[str, list[str]]

    @classmethod
    def of(cls, quick: bool) -> Plan:
        if quick:
            external = {
                "core": ["--events", "50000", "--repeat", "1", "--no-memory"],
                "edge": [
                    "--decisions",
                    "10000",
                    "--calls",
                    "100000",
                    "--duration-s",
                    "2",
                    "--visible-samples",
                    "20",
                    "--familiar",
                    "20000",
                ],
                "sink": ["--rows", "20000", "--backend", "chdb"],
                "b8": ["--records", "3000000", "--python-records", "50000"],
            }
            return cls(True, stream.Scale.of(True), 20_000, 300.0, external)
        external = {"core": [], "edge": [], "sink": [], "b8": []}
        return cls(False, stream.Scale.of(False), 300_000, 900.0, external)


# -- the machine -------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"nproc": os.cpu_count(), "platform": platform.platform()}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                info["memory_mb"] = int(line.split()[1]) // 1024
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    return info


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def dict_counting_us() -> float:
    """Machine-speed yardstick: microseconds per event of counting 500k keys in a dict."""
    keys = [f"k{i % 50_000}" for i in range(500_000)]
    counts: dict[str, int] = {}
    started = time.process_time()
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return round((time.process_time() - started) / len(keys) * 1e6, 3)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("faust-streaming", "aiokafka", "orjson", "pydantic", "mode-streaming", "chdb"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    from pipeline.dev.jars import POM_PATH, kafka_version

    out["kafka_broker"] = kafka_version(POM_PATH.read_text())
    out["quixstreams"] = quix_env.REQUIREMENT.split("==")[1] if quix_env.env_ready() else "absent"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    out["authpipe_commit"] = commit
    return out


# -- parts -------------------------------------------------------------------------------


class Runner:
    """Runs the selected parts, each guarded: one failure is recorded, the rest go on."""

    def __init__(self, plan: Plan, ctx: stream.Context, parts: set[str]) -> None:
        self.plan = plan
        self.ctx = ctx
        self.parts = parts
        self.results: dict[str, Any] = {}
        self.b1_names: stream.Names | None = None
        self.peer_names: stream.Names | None = None
        self.floors = self.parts & set(floor_run.FLOORS)
        self.traffic_path: Path | None = None

    def guarded(self, name: str, step: Callable[[], dict[str, Any]]) -> None:
        if name not in self.parts:
            return
        started = time.perf_counter()
        log.info("bench_part_started", part=name)
        try:
            result = step()
        except Exception as exc:  # a benchmark part failing must not lose the others
            result = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        result["wall_s"] = round(time.perf_counter() - started, 1)
        self.results[name] = result
        log.info("bench_part_done", part=name, wall_s=result["wall_s"], error=result.get("error"))

    def run(self) -> dict[str, Any]:
        scale = self.plan.scale
        if "b1_3m" in self.parts:
            self.parts.add("b1")  # its ratio is to this run's B1
        if self.parts & {"ceiling", "b1", "naive", "quix"} or self.floors:
            self.parts.add("preload")
            self.guarded("preload", self.preload)
        if self.parts & {"naive", "quix"} and self.plan.peer_events < scale.b1_events:
            # the peers run to completion on a topic of their own (the first peer_events
            # events of the same traffic); the worker runs on it too, for same-topic ratios
            self.parts |= {"preload_peers", "b1_peers"}
            self.guarded("preload_peers", self.preload_peers)
        self.guarded("ceiling", self.ceiling)
        self.guarded("b1", self.b1)
        self.guarded("b1_3m", self.b1_3m)
        if self.floors:
            # the floors send what this run's B1 worker sent (bench.floor_run)
            if "b1" in self.parts and "error" not in self.results.get("b1", {}):
                self.parts.add("b1_traffic")
                self.guarded("b1_traffic", self.b1_traffic)
            self.parts.add("floor_traffic")
            self.guarded("floor_traffic", self.floor_traffic)
            for name in floor_run.FLOORS:
                self.guarded(name, lambda name=name: self.floor(name))  # type: ignore[misc]
        self.guarded("b1_peers", self.b1_peers)
        self.guarded("naive", self.naive)
        self.guarded("quix", self.quix)
        self.guarded(
            "b1_group", lambda: stream.bench_b1_group(self.ctx, scale.b1_events, workers=2)
        )
        self.guarded("b2", lambda: stream.bench_b2(self.ctx, scale.b2_rate_per_s, scale.b2_probes))
        # the same probes under a load the worker sustains: the latency of the design
        # itself, apart from the queueing of a saturated worker
        self.guarded(
            "b2_unsaturated",
            lambda: stream.bench_b2(self.ctx, scale.b2_unsaturated_rate_per_s, scale.b2_probes),
        )
        self.guarded(
            "b3",
            lambda: stream.bench_b3(
                self.ctx, scale.b3_events, scale.b3_sources, scale.b3_entry_cap
            ),
        )
        self.guarded("b6", lambda: stream.bench_b6(self.ctx, scale.b6_accounts))
        # B7: the tripping failure's acknowledgement to the edge refusing, per load
        # (the quick plan probes a cold worker: 3 s of load first, not the steady state's 90)
        b7_loads, b7_probes, b7_warmup_s = (
            ((0, 1000), 10, latency.WARMUP_S)
            if self.plan.quick
            else (latency.LOADS, latency.PROBES, latency.LOAD_WARMUP_S)
        )
        self.guarded(
            "b7",
            lambda: latency.bench_b7(self.ctx, b7_loads, b7_probes, warmup_s=b7_warmup_s),
        )
        for name in ("core", "edge", "sink"):
            self.guarded(name, lambda name=name: self.external(name))  # type: ignore[misc]
        # B8 (issue 45): one edge's familiar records, the compiled store against the index
        self.guarded("b8", self.b8)
        return self.results

    def preload(self) -> dict[str, Any]:
        names, seconds = stream.prepare_b1(self.ctx, self.plan.scale.b1_events)
        self.b1_names = names
        return {
            "topic": names.input,
            "events": self.plan.scale.b1_events,
            "seconds": round(seconds, 1),
        }

    def preload_peers(self) -> dict[str, Any]:
        names, seconds = stream.prepare_b1(self.ctx, self.plan.peer_events)
        self.peer_names = names
        return {"topic": names.input, "events": self.plan.peer_events, "seconds": round(seconds, 1)}

    def _topic(self) -> str:
        if self.b1_names is None:
            raise RuntimeError("the B1 topic was not pre-loaded")
        return self.b1_names.input

    def _peer_topic(self) -> tuple[str, int]:
        """The topic the peers run to completion on, and how many events it holds."""
        if self.peer_names is not None:
            return self.peer_names.input, self.plan.peer_events
        return self._topic(), self.plan.scale.b1_events

    def _log(self, name: str) -> Path:
        return self.ctx.workdir / f"{name}.log"

    def ceiling(self) -> dict[str, Any]:
        command = [
            sys.executable,
            "-m",
            "bench.peers.ceiling",
            self.ctx.bootstrap,
            self._topic(),
            str(self.plan.scale.b1_events),
        ]
        return run_peer(command, 600, self._log("ceiling"))

    def b1(self) -> dict[str, Any]:
        if self.b1_names is None:
            raise RuntimeError("the B1 topic was not pre-loaded")
        return stream.bench_b1(
            self.ctx, self.b1_names, self.plan.scale.b1_events, segments=B1_SEGMENTS
        )

    def b1_3m(self) -> dict[str, Any]:
        return stream.bench_b1_3m(self.ctx, self.plan.scale.b1_3m_events, self.results.get("b1"))

    def b1_traffic(self) -> dict[str, Any]:
        assert self.b1_names is not None
        return floor_run.b1_traffic(self.ctx.bootstrap, self.b1_names, self.plan.scale.b1_events)

    def floor_traffic(self) -> dict[str, Any]:
        path, shape = floor_run.traffic_file(self.ctx.workdir, self.results.get("b1_traffic"))
        self.traffic_path = path
        return shape

    def floor(self, name: str) -> dict[str, Any]:
        assert self.traffic_path is not None
        return floor_run.run_floor(
            name,
            self.ctx.bootstrap,
            self._topic(),
            self.plan.scale.b1_events,
            self.traffic_path,
            self._log(name),
        )

    def b1_peers(self) -> dict[str, Any]:
        if self.peer_names is None:
            raise RuntimeError("the peers' topic was not pre-loaded")
        return stream.bench_b1(self.ctx, self.peer_names, self.plan.peer_events)

    def naive(self) -> dict[str, Any]:
        topic, events = self._peer_topic()
        state = self.ctx.workdir / "naive-faust"
        stall_s = 60.0
        command = [
            sys.executable,
            "-m",
            "bench.peers.naive_faust",
            self.ctx.bootstrap,
            topic,
            str(events),
            str(state),
            str(self.plan.peer_timeout_s),
            str(stall_s),
        ]
        timeout_s = self.plan.peer_timeout_s + 2 * stall_s + 120
        result = run_peer(command, timeout_s, self._log("naive"))
        if "error" in result:
            # faust-streaming can drop every message fetched before its recovery ends (see
            # bench/README.md); a second run is a new consumer group over the same topic.
            log.warning("naive_peer_retry", error=result["error"])
            result = run_peer(command, timeout_s, self._log("naive")) | {
                "first_error": result["error"]
            }
        return result

    def quix(self) -> dict[str, Any]:
        if self.plan.quick and not quix_env.env_ready():
            return {
                "skipped": "no Quix virtualenv yet (the full run creates it, or run "
                "`python -c 'from bench.peers.quix import ensure_env; ensure_env()'`)"
            }
        python = quix_env.ensure_env()
        topic, events = self._peer_topic()
        state = self.ctx.workdir / "quix-state"
        command = quix_env.command(
            python, self.ctx.bootstrap, topic, events, state, self.plan.peer_timeout_s
        )
        return run_peer(command, self.plan.peer_timeout_s + 300, self._log("quix"))

    def b8(self) -> dict[str, Any]:
        command = [sys.executable, "-m", "bench.b8_familiar", *self.plan.external["b8"]]
        return run_peer(command, 1800, self._log("b8"))

    def external(self, name: str) -> dict[str, Any]:
        module = f"bench.bench_{name}"
        if not (REPO_ROOT / "bench" / f"bench_{name}.py").exists():
            return {"missing": f"{module} does not exist yet"}
        args = list(self.plan.external[name])
        if name == "edge":
            args += ["--bootstrap", self.ctx.bootstrap]
        result = run_peer([sys.executable, "-m", module, *args], 1800, self._log(name))
        if "error" in result:
            result["log_tail"] = tail(self._log(name))
        return result


# -- summary -----------------------------------------------------------------------------


def _get(results: dict[str, Any], *path: str) -> Any:
    value: Any = results
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    return round(a / b, 2)


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Headline figures, ratios to the ceiling and peers, and each target met or not."""
    b1 = _get(results, "b1", "events_per_s")
    b1_cpu = _get(results, "b1", "events_per_cpu_s")
    # the peers are compared with the worker on the topic they ran on (b1_peers when the
    # peers had a smaller topic of their own, else the B1 topic)
    same = "b1_peers" if _get(results, "b1_peers", "events_per_s") is not None else "b1"
    b1_same, b1_same_cpu = (
        _get(results, same, "events_per_s"),
        _get(results, same, "events_per_cpu_s"),
    )
    peers = {name: _get(results, name, "events_per_s") for name in ("ceiling", "naive", "quix")}
    peers_cpu = {
        name: _get(results, name, "events_per_cpu_s") for name in ("ceiling", "naive", "quix")
    }
    b2_p99 = _get(results, "b2", "to_topic", "p99_ms")
    b2_edge = _get(results, "b2", "to_edge", "p99_ms")
    b3_rss = _get(results, "b3", "peak_rss_mb_sampled", "VmHWM")
    b3_rate = _get(results, "b3", "events_per_s")
    b6 = _get(results, "b6", "ready_and_correct_s")
    b7 = {
        rate: _get(part, "to_edge", "p99_ms")
        for rate, part in (_get(results, "b7", "by_load") or {}).items()
    }
    summary: dict[str, Any] = {
        "b1_events_per_s": b1,
        "b1_events_per_cpu_s": b1_cpu,
        "b1_vs_ceiling": ratio(b1, peers["ceiling"]),
        "b1_vs_ceiling_cpu": ratio(b1_cpu, peers_cpu["ceiling"]),
        "peers_compared_with": same,
        "b1_vs_naive": ratio(b1_same, peers["naive"]),
        "b1_vs_quix": ratio(b1_same, peers["quix"]),
        "b1_vs_naive_cpu": ratio(b1_same_cpu, peers_cpu["naive"]),
        "b1_vs_quix_cpu": ratio(b1_same_cpu, peers_cpu["quix"]),
        "b1_3m_events_per_cpu_s": _get(results, "b1_3m", "events_per_cpu_s"),
        "b1_3m_vs_b1_cpu": _get(results, "b1_3m", "vs_b1_cpu"),
        "peers_seen_counted": {
            name: {
                "seen": _get(results, name, "events_seen"),
                "counted": _get(results, name, "events_counted"),
                "complete": _get(results, name, "complete"),
                "agree": _get(results, name, "events_seen") == _get(results, name, "events_counted")
                and _get(results, name, "events_seen") is not None,
            }
            for name in ("naive", "quix")
            if name in results
        },
        "b1_group": {
            key: _get(results, "b1_group", key)
            for key in (
                "one_worker_events_per_cpu_s",
                "two_workers_events_per_cpu_s",
                "cpu_efficiency_ratio",
            )
        }
        if "b1_group" in results
        else None,
        "b2_p99_ms": b2_p99,
        "b2_edge_p99_ms": b2_edge,
        "b3_rss_mb": b3_rss,
        "b3_vs_b1": ratio(b3_rate, b1),
        "b6_s": b6,
        "b7_p99_ms": b7 or None,
        "floor": floor_run.summarize(results),
    }
    met = {
        "b1_events_per_s": b1 is not None and b1 >= TARGETS["b1_events_per_s"],
        "b1_vs_naive": (summary["b1_vs_naive"] or 0) >= TARGETS["b1_vs_naive"],
        "b1_vs_ceiling": (summary["b1_vs_ceiling"] or 0) >= TARGETS["b1_vs_ceiling"],
        "b1_vs_quix_cpu": (summary["b1_vs_quix_cpu"] or 0) >= TARGETS["b1_vs_quix_cpu"],
        "b1_3m_vs_b1_cpu": (summary["b1_3m_vs_b1_cpu"] or 0) >= TARGETS["b1_3m_vs_b1_cpu"],
        "b2_p99_ms": b2_p99 is not None and b2_p99 <= TARGETS["b2_p99_ms"],
        "b2_edge_p99_ms": b2_edge is not None and b2_edge <= TARGETS["b2_edge_p99_ms"],
        "b3_rss_mb": b3_rss is not None and b3_rss <= TARGETS["b3_rss_mb"],
        "b3_vs_b1": (summary["b3_vs_b1"] or 0) >= TARGETS["b3_vs_b1"],
        "b6_s": b6 is not None and b6 <= TARGETS["b6_s"] and bool(_get(results, "b6", "correct")),
        "b7_p99_ms": bool(b7)
        and all(p99 is not None and p99 <= TARGETS["b7_p99_ms"] for p99 in b7.values()),
    }
    summary["met"] = met
    return summary


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}{unit}"
    return f"{int(value):,}{unit}"


def mark(ok: bool) -> str:
    return "yes" if ok else "**no**"


def b1_3m_markdown(r: dict[str, Any]) -> list[str]:
    """The b1_3m section: 3M against this run's 1M, changelog records per event, and the
    runs in stretches of account rows."""
    part = r.get("b1_3m")
    if part is None:
        return []
    lines = ["", "## B1 on 3M events, caps that do not bite, against this run's 1M", ""]
    if "error" in part:
        return [*lines, f"- **error** {part['error']}"]
    b1 = r.get("b1") or {}
    lines += [
        f"Caps: `entry_cap` {fmt(part.get('entry_cap'))} for every tenant, "
        f"`ingest.dedupe_capacity` {fmt(part.get('dedupe_capacity'))} (the 1M B1: the defaults).",
        "",
        "| topic | events/s | events per CPU-second | per CPU-second / 1M | changelog records per event "
        "(account values + tombstones, source values + tombstones, all) | evictions (account, source) "
        "| peak RSS | collector s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, run, ratio_text in (
        ("1M", b1, "-"),
        ("3M", part, fmt(part.get("vs_b1_cpu"), "x")),
    ):
        if "events_per_s" not in run:
            lines.append(f"| {label} | n/a | | | | | | |")
            continue
        c = run.get("changelog_per_event") or {}
        counts = run.get("counts") or {}
        lines.append(
            f"| {label} | {fmt(run.get('events_per_s'))} | {fmt(run.get('events_per_cpu_s'))} | {ratio_text} "
            f"| {c.get('account_values')} + {c.get('account_tombstones')}, "
            f"{c.get('source_values')} + {c.get('source_tombstones')}, {c.get('all_records')} "
            f"| {fmt(counts.get('account_table_evictions'))}, {fmt(counts.get('source_table_evictions'))} "
            f"| {fmt(_get(run, 'peak_rss_mb_sampled', 'VmHWM'), ' MB')} | {fmt(counts.get('gc_s'))} |"
        )
    lines += [
        "",
        "In stretches of account rows applied (received less held for event-time order; CPU us per row; changelog records per row, account "
        "and source; account tombstones per event; table entries at the stretch's end; the "
        "collector's seconds per 1,000 events):",
        "",
        "| run | account rows applied at end | CPU us / row applied | changelog / event (account, source) | account tombstones / event "
        "| entries (account, source) | collector ms / 1,000 events |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, run in (("1M", b1), ("3M", part)):
        for seg in run.get("segments") or []:
            lines.append(
                f"| {label} | {fmt(seg['rows_at_end'])} | {seg['cpu_us_per_event']} "
                f"| {seg['account_changelog_records_per_event']:.3f}, {seg['source_changelog_records_per_event']:.3f} "
                f"| {seg['account_changelog_tombstones_per_event']:.3f} "
                f"| {fmt(seg['account_table_entries'])}, {fmt(seg['source_table_entries'])} "
                f"| {seg['gc_s_per_event'] * 1e6:.1f} |"
            )
    return lines


def markdown(report: dict[str, Any]) -> str:
    r, s, m = report["results"], report["summary"], report["summary"]["met"]
    lines = [
        f"# Benchmarks {report['date']}{' (quick)' if report['quick'] else ''}",
        "",
        f"Command: `{report['command']}`. Machine: {report['machine'].get('cpu_model')}, "
        f"{report['machine'].get('nproc')} cores, {fmt(report['machine'].get('memory_mb'))} MB; "
        f"load average {report['load_before']} before, {report['load_after']} after; "
        f"dict-counting yardstick {report['yardstick_us']} us/event (about 1 us on an idle "
        "machine of this kind: larger means a busier or slower machine). Broker on the same host.",
        "",
        "## Targets",
        "",
        "| # | what | measured | target | met |",
        "|---|---|---|---|---|",
        f"| B1 | mixed topic through the worker | {fmt(s['b1_events_per_s'], ' events/s')} "
        f"({fmt(s['b1_events_per_cpu_s'])} per CPU-second) | >= 50,000 events/s | {mark(m['b1_events_per_s'])} |",
        f"| B1 | worker / ceiling (same run) | {fmt(s['b1_vs_ceiling'], 'x')} (CPU: {fmt(s['b1_vs_ceiling_cpu'], 'x')}) "
        f"| >= 0.3x | {mark(m.get('b1_vs_ceiling', False))} |",
        f"| B1 | worker / naive faust (same topic: {s.get('peers_compared_with', 'b1')}) | {fmt(s['b1_vs_naive'], 'x')} "
        f"(CPU: {fmt(s['b1_vs_naive_cpu'], 'x')}) | >= 10x | {mark(m['b1_vs_naive'])} |",
        f"| B1 | worker / Quix Streams per CPU-second (same topic) | {fmt(s['b1_vs_quix_cpu'], 'x')} "
        f"(wall: {fmt(s['b1_vs_quix'], 'x')}) | >= 10x | {mark(m.get('b1_vs_quix_cpu', False))} |",
        f"| B1 | 3M events, caps raised, per CPU-second / 1M B1 (same run) | {fmt(s.get('b1_3m_vs_b1_cpu'), 'x')} "
        f"({fmt(s.get('b1_3m_events_per_cpu_s'))} per CPU-second) | >= 0.9x | {mark(m.get('b1_3m_vs_b1_cpu', False))} |",
        f"| B2 | tripping event to decision on the topic, p99 | {fmt(s['b2_p99_ms'], ' ms')} "
        f"(p50 {fmt(_get(r, 'b2', 'to_topic', 'p50_ms'), ' ms')}) | <= 100 ms | {mark(m['b2_p99_ms'])} |",
        f"| B2 | tripping event to edge view refusing, p99 | {fmt(s['b2_edge_p99_ms'], ' ms')} "
        f"(p50 {fmt(_get(r, 'b2', 'to_edge', 'p50_ms'), ' ms')}) | <= 150 ms | {mark(m['b2_edge_p99_ms'])} |",
        f"| B2 | the same at {fmt(_get(r, 'b2_unsaturated', 'background_rate_per_s'))} events/s (unsaturated), p99 "
        f"| topic {fmt(_get(r, 'b2_unsaturated', 'to_topic', 'p99_ms'), ' ms')}, edge {fmt(_get(r, 'b2_unsaturated', 'to_edge', 'p99_ms'), ' ms')} "
        f"(p50 {fmt(_get(r, 'b2_unsaturated', 'to_topic', 'p50_ms'), ' ms')}, {fmt(_get(r, 'b2_unsaturated', 'to_edge', 'p50_ms'), ' ms')}) | for reference | - |",
        f"| B3 | flood: worker peak RSS | {fmt(s['b3_rss_mb'], ' MB')} | <= 512 MB | {mark(m['b3_rss_mb'])} |",
        f"| B3 | flood throughput / B1 | {fmt(s['b3_vs_b1'], 'x')} ({fmt(_get(r, 'b3', 'events_per_s'), ' events/s')}) "
        f"| >= 0.8x | {mark(m['b3_vs_b1'])} |",
        f"| B6 | restart: ready and correct | {fmt(s['b6_s'], ' s')} (ready {fmt(_get(r, 'b6', 'ready_s'), ' s')}) "
        f"| <= 15 s | {mark(m['b6_s'])} |",
        "",
        "## Throughput against the ceiling and the peers (same topic, same run)",
        "",
        "Peers run to completion (every event of their topic seen at the input and counted at the far end "
        "of their topology); the worker's ratios to a peer use the worker's run on the same topic.",
        "",
        "| implementation | events seen / counted | events/s | events per CPU-second | worker / this (wall) | worker / this (CPU) |",
        "|---|---|---|---|---|---|",
    ]
    rows = (
        ("ceiling: aiokafka getmany + orjson, nothing else", "ceiling", "b1_vs_ceiling"),
        ("authpipe worker: full pipeline (B1)", "b1", None),
        ("authpipe worker on the peers' topic", "b1_peers", None),
        ("naive faust: per-event windowed tables", "naive", "b1_vs_naive"),
        ("Quix Streams: windowed counts only", "quix", "b1_vs_quix"),
    )
    for label, key, ratio_key in rows:
        part = r.get(key)
        if part is None and key == "b1_peers":
            continue
        part = part or {}
        if "events_per_s" not in part:
            why = part.get("error") or part.get("skipped") or part.get("missing") or "not run"
            lines.append(f"| {label} | n/a | n/a | n/a | {why} | |")
            continue
        if key.startswith("b1"):
            events = f"{fmt(part.get('events'))} / {fmt(part.get('rows'))}"
        elif key == "ceiling":
            events = f"{fmt(part.get('events'))} / -"
        else:
            events = f"{fmt(part.get('events_seen'))} / {fmt(part.get('events_counted'))}"
            if not part.get("complete", False):
                events += " (**incomplete**)"
        cpu_ratio = s.get(f"{ratio_key}_cpu") if ratio_key else None
        lines.append(
            f"| {label} | {events} | {fmt(part['events_per_s'])} | {fmt(part.get('events_per_cpu_s'))} "
            f"| {fmt(s.get(ratio_key)) + 'x' if ratio_key and s.get(ratio_key) else '-'} "
            f"| {fmt(cpu_ratio) + 'x' if cpu_ratio else '-'} |"
        )
    lines += b1_3m_markdown(r)
    lines += floor_run.markdown(r, s.get("floor") or {})
    if "b7" in r:
        lines += [
            "",
            "## B7: the tripping failure's acknowledgement to the edge refusing (target p99 <= 150 ms at every load)",
            "",
        ]
        if "error" in r["b7"]:
            lines.append(f"- **error** {r['b7']['error']}")
        else:
            lines += latency.table(r["b7"])
            lines.append("")
            lines.append(f"Met at every load: {mark(m.get('b7_p99_ms', False))}.")
    group = r.get("b1_group")
    if group is not None:
        lines += ["", "## More than one worker (one consumer group)", ""]
        if "error" in group:
            lines.append(f"- **error** {group['error']}")
        else:
            for n_key, label in (("one", "one worker"), ("two", "two workers")):
                g = group.get(n_key, {})
                lines.append(
                    f"- {label}: {fmt(g.get('rows'))} events in {fmt(g.get('seconds'), ' s')}, "
                    f"{fmt(g.get('events_per_s'))} events/s, {fmt(g.get('cpu_s'), ' CPU-s')} "
                    f"(all workers): {fmt(g.get('events_per_cpu_s'))} events per CPU-second"
                )
            lines.append(
                f"- two / one, events per CPU-second of all workers: {fmt(group.get('cpu_efficiency_ratio'), 'x')}"
            )
    lines += ["", "## Other components", ""]
    for key, label in (
        ("core", "core (bench_core)"),
        ("edge", "edge (bench_edge, B4)"),
        ("sink", "sink (bench_sink, B5)"),
        ("b8", "B8 familiar records (b8_familiar)"),
    ):
        part = r.get(key)
        if part is None:
            lines.append(f"- {label}: not run")
        elif "missing" in part:
            lines.append(f"- {label}: **missing** ({part['missing']})")
        elif "error" in part:
            lines.append(f"- {label}: **error** {part['error']}")
        else:
            shown = {k: v for k, v in part.items() if not isinstance(v, dict | list)}
            lines.append(f"- {label}: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    for rerun in report.get("reruns", []):
        lines += [
            "",
            f"Re-run at {rerun['started_at']} (`{rerun['command']}`, load average "
            f"{rerun['load_before']} before, {rerun['load_after']} after): {', '.join(rerun['parts'])}.",
        ]
    lines += ["", "## Versions", ""]
    lines += [f"- {k}: {v}" for k, v in report["versions"].items()]
    lines += ["", "Raw figures: the JSON file of the same name.", ""]
    return "\n".join(lines)


def merged(path: Path, rerun: dict[str, Any]) -> dict[str, Any]:
    """The report at ``path`` with the parts of ``rerun`` replaced, the re-run noted."""
    report: dict[str, Any] = orjson.loads(path.read_bytes())
    parts = sorted(set(rerun["results"]) - {"preload"})
    report["results"].update({k: v for k, v in rerun["results"].items() if k in parts})
    report.setdefault("reruns", []).append(
        {
            "parts": parts,
            "started_at": rerun["started_at"],
            "command": rerun["command"],
            "load_before": rerun["load_before"],
            "load_after": rerun["load_after"],
            "yardstick_us": rerun["yardstick_us"],
            "commit": rerun["versions"]["authpipe_commit"],
        }
    )
    return report


def write(report: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = report["date"] + ("-quick" if report["quick"] else "")
    (out_dir / f"{stem}.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    (out_dir / f"{stem}.md").write_text(markdown(report))
    return out_dir / f"{stem}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="everything scaled down")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS)
    )
    parser.add_argument("--events", type=int, help="events of the B1 topic (default 1M, quick 50k)")
    parser.add_argument(
        "--b3-events", type=int, help="events of the B3 flood (default 1M, quick 50k)"
    )
    parser.add_argument(
        "--b1-3m-events", type=int, help="events of part b1_3m's topic (default 3M, quick 150k)"
    )
    parser.add_argument(
        "--peer-events",
        type=int,
        help="events of the topic the peers run to completion on (default 300k, quick 20k; "
        "at least --events: the peers use the B1 topic itself)",
    )
    parser.add_argument(
        "--merge-into", type=Path, help="re-run --parts and replace them in this report"
    )
    parser.add_argument(
        "--keep-workdir",
        action="store_true",
        help="keep the temporary directory with the workers' and peers' logs",
    )
    args = parser.parse_args(argv)
    configure_logging("info", "console")
    parts = set(args.parts.split(","))
    unknown = parts - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}")
    plan = Plan.of(args.quick)
    if args.events:
        plan = replace(plan, scale=replace(plan.scale, b1_events=args.events))
    if args.b1_3m_events:
        plan = replace(plan, scale=replace(plan.scale, b1_3m_events=args.b1_3m_events))
    if args.b3_events:
        plan = replace(plan, scale=replace(plan.scale, b3_events=args.b3_events))
    if args.peer_events:
        plan = replace(plan, peer_events=args.peer_events)
    report: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "command": " ".join(["python -m bench.run", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "load_before": load_average(),
        "yardstick_us": dict_counting_us(),
        "versions": versions(),
        "parts": sorted(parts),
    }
    workdir = Path(tempfile.mkdtemp(prefix="authpipe-bench-run-"))
    started = time.perf_counter()
    try:
        with stream.broker(args.bootstrap) as bootstrap:
            ctx = stream.Context(bootstrap, workdir)
            try:
                report["results"] = Runner(plan, ctx, parts).run()
            finally:
                ctx.stop_all()
    finally:
        report["load_after"] = load_average()
        report["wall_s"] = round(time.perf_counter() - started, 1)
        report["versions"]["quixstreams"] = (
            quix_env.REQUIREMENT.split("==")[1] if quix_env.env_ready() else "absent"
        )
        report.setdefault("results", {})
        if args.merge_into:
            report = merged(args.merge_into, report)
        report["summary"] = summarize(report["results"])
        path = write(report, args.merge_into.parent if args.merge_into else args.out)
        if args.keep_workdir:
            log.info("bench_workdir_kept", path=str(workdir))
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    for name, seen in report["summary"].get("peers_seen_counted", {}).items():
        sys.stdout.write(
            f"peer {name}: events seen {seen['seen']}, counted {seen['counted']}, "
            f"complete {seen['complete']}, agree {seen['agree']}\n"
        )
    sys.stdout.write(
        orjson.dumps({"written": str(path), "summary": report["summary"]}).decode() + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
