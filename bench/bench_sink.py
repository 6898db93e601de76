"""Benchmark of the ClickHouse sink path: audit batches → rate cap → ``attempts``.

Run as ``python -m bench.bench_sink [--rows N] [--batch-rows B] [--backend chdb|http|both]``.

What is timed, per backend, on a fresh migrated database:

* ``insert`` (the B5 figure): rows/s into ``attempts`` (and its three materialized views)
  through ``ClickHouse.insert`` from ``open_clickhouse``, the call ``authpipe sink`` makes
  (``TableWriter.insert``), in batches of ``--batch-rows`` with dedup tokens as the sink
  plans them; the rows are read back (count and sum of weight) before the figure counts;
* ``process``: decoding audit batch messages (JSON, as the worker writes them) and the
  lane's rate cap, no I/O (the same for both backends, measured once; reported apart);
* ``sink``: both, i.e. the sink's work per attempt minus Kafka.

``chdb`` is the embedded engine in this process (its CPU, engine threads included, is
this process's); ``http`` is clickhouse-connect over HTTP to the chdb-backed test endpoint
(``tests.chhttp``) in a subprocess on loopback, the production code path (a real
ClickHouse server is faster on the server side); that endpoint is a test fixture, so its
figure is reported, not judged, with the server process's CPU.
Traffic: 10 tenants, 80 % successes; half the failures come from 20 attacking sources
of one tenant, so the cap bites on them (their rows beyond 60 a minute are summarized). The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from pipeline.contracts.models import AUDIT_COLUMNS
from pipeline.runtime import tune_gc
from pipeline.settings import ClickHouseSettings
from pipeline.sinks.clickhouse import ClickHouse
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.lanes import Lane
from pipeline.sinks.migrate import apply_migrations
from pipeline.sinks.ratecap import RateCapConfig
from pipeline.sinks.rows import decode_audit
from pipeline.sinks.tables import ATTEMPTS_COLUMNS, INSERT_SETTINGS

REPO_ROOT = Path(__file__).resolve().parents[1]
T0_MS = (int(time.time()) - 3600) * 1000 // 60_000 * 60_000  # an hour ago: inside the TTL
ROWS_PER_MESSAGE = 5000  # the worker's largest audit batch
READY_TIMEOUT_S = 60.0


def make_messages(total_rows: int, seed: int) -> list[bytes]:
    """Audit batch messages (the worker's wire format), 500 events per second of event time."""
    rng = random.Random(seed)
    sources = [f"203.0.{i // 256}.{i % 256}" for i in range(5000)]
    hot = sources[:20]
    messages = []
    for start in range(0, total_rows, ROWS_PER_MESSAGE):
        rows = []
        for index in range(start, min(total_rows, start + ROWS_PER_MESSAGE)):
            success = rng.random() < 0.8
            attack = not success and rng.random() < 0.5
            source = rng.choice(hot) if attack else rng.choice(sources)
            values = {
                "ts_ms": T0_MS + index * 2,
                "tenant": "tenant-0" if attack else f"tenant-{index % 10}",
                "service": "idp",
                "flow": "login",
                "account_digest": f"{rng.getrandbits(128):032x}",
                "account": None,
                "source": source,
                "device_id": "",
                "trusted": False,
                "outcome": "success" if success else "failure",
                "failure_reason": "" if success else "bad_password",
                "decision": "allowed",
                "weight": 1,
                "summary": False,
                "policy_version": "bench",
                "event_id": f"ev-{index}",
                "kafka_topic": "auth.login-attempts",
                "kafka_partition": index % 8,
                "kafka_offset": index,
            }
            rows.append([values[name] for name in AUDIT_COLUMNS])
        messages.append(orjson.dumps({"v": 1, "columns": list(AUDIT_COLUMNS), "rows": rows}))
    return messages


def process(messages: list[bytes], batch_rows: int) -> list[tuple[str, list[list[Any]]]]:
    """The lane: decode, cap, cut into batches; (token, rows) per insert."""
    lane = Lane.start("auth.audit", 0, "audit", 0, [], RateCapConfig())
    out: list[tuple[str, list[list[Any]]]] = []
    for offset, value in enumerate(messages):
        lane.add(decode_audit(offset, value), now_ms=0)
        if lane.buffered_rows >= batch_rows:
            out += [(i.token, i.rows) for i in lane.plan_items(flush_rows=batch_rows, now_ms=0)]
    out += [
        (i.token, i.rows)
        for i in lane.plan_items(flush_rows=batch_rows, now_ms=0, closing=True)
        if i.rows
    ]
    return out


def insert_all(
    ch: ClickHouse, batches: list[tuple[str, list[list[Any]]]], encoding: str = "rows"
) -> None:
    """As ``TableWriter.insert``: rows, pivoted by the client (``rows``), or transposed here
    with ``zip`` and handed over column-oriented (``columns``; tried for B5, not kept)."""
    for token, rows in batches:
        if encoding == "rows":
            ch.insert(
                "attempts", ATTEMPTS_COLUMNS, rows, dedup_token=token, settings=INSERT_SETTINGS
            )
            continue
        ch.insert(
            "attempts",
            ATTEMPTS_COLUMNS,
            list(zip(*rows, strict=True)),
            dedup_token=token,
            settings=INSERT_SETTINGS,
            column_oriented=True,
        )


@contextmanager
def http_endpoint(data: Path) -> Iterator[tuple[str, int]]:
    """The chdb-backed HTTP endpoint of the tests, in a subprocess; yields its URL and pid."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.chhttp", "--port", str(port), "--path", str(data)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the chhttp test endpoint did not start") from None
                time.sleep(0.1)
        yield f"http://bench:bench@127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


def _cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) of ``pid``, or of this process."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_backend(
    name: str,
    settings: ClickHouseSettings,
    batches: list[tuple[str, list[list[Any]]]],
    server_pid: int | None = None,
    encoding: str = "rows",
) -> dict[str, Any]:
    with open_clickhouse(settings, create_database=True) as ch:
        apply_migrations(ch, settings)
        rows = sum(len(r) for _, r in batches)
        server_started = _cpu_s(server_pid) if server_pid else 0.0
        started, cpu_started = time.perf_counter(), time.process_time()
        insert_all(ch, batches, encoding)
        elapsed = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
        server_cpu_s = _cpu_s(server_pid) - server_started if server_pid else None
        stored = ch.query("SELECT count(), sum(weight) FROM attempts")[0]
    figures: dict[str, Any] = {
        "backend": name,
        "rows": rows,
        "inserts": len(batches),
        "insert_s": round(elapsed, 3),
        "insert_rows_per_s": round(rows / elapsed),
        "insert_cpu_s_this_process": round(cpu_s, 3),
        "stored_rows": int(stored[0]),
        "stored_weight": int(stored[1]),
    }
    if server_cpu_s is not None:
        figures["insert_cpu_s_server"] = round(server_cpu_s, 3)
    total_cpu_s = cpu_s + (server_cpu_s or 0.0)
    figures["insert_rows_per_cpu_s"] = round(rows / max(total_cpu_s, 1e-9))
    return figures


def dict_counting_per_s(ops: int = 1_000_000) -> float:
    """Plain dict counting on this machine now: a yardstick for a shared, busy machine."""
    counts: dict[int, int] = {}
    started = time.perf_counter()
    for i in range(ops):
        key = i & 1023
        counts[key] = counts.get(key, 0) + 1
    return ops / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_sink", description=__doc__)
    parser.add_argument("--rows", type=int, default=500_000, help="attempts to write")
    parser.add_argument("--batch-rows", type=int, default=50_000, help="rows per insert")
    parser.add_argument("--backend", choices=["chdb", "http", "both"], default="both")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--encoding",
        choices=["rows", "columns"],
        default="rows",
        help="hand the client rows (as the sink does) or columns (zip here; tried, not kept)",
    )
    args = parser.parse_args(argv)

    tune_gc()  # as `authpipe sink` does (run_sink)
    baseline = dict_counting_per_s()
    messages = make_messages(args.rows, args.seed)
    started, cpu_started = time.perf_counter(), time.process_time()
    batches = process(messages, args.batch_rows)
    process_s = time.perf_counter() - started
    process_cpu_s = time.process_time() - cpu_started
    written = sum(len(rows) for _, rows in batches)
    weight = sum(row[12] for _, rows in batches for row in rows)
    assert weight == args.rows, f"sum(weight) {weight} != {args.rows}"
    print(f"dict counting on this machine: {baseline:,.0f} ops/s (a scale for the figures)")
    print(
        f"process (decode + rate cap): {args.rows / process_s:,.0f} attempts/s wall, "
        f"{args.rows / process_cpu_s:,.0f} per CPU second "
        f"({args.rows:,} attempts -> {written:,} rows, {len(batches)} inserts)"
    )
    result: dict[str, Any] = {
        "attempts": args.rows,
        "rows": written,
        "encoding": args.encoding,
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
        "dict_counting_per_s": round(baseline),
        "process_s": round(process_s, 3),
        "process_attempts_per_s": round(args.rows / process_s),
        "process_attempts_per_cpu_s": round(args.rows / process_cpu_s),
        "backends": [],
    }
    backends = ["chdb", "http"] if args.backend == "both" else [args.backend]
    with tempfile.TemporaryDirectory(prefix="bench-sink-") as tmp:
        for backend in backends:
            data = Path(tmp) / backend
            if backend == "chdb":
                figures = run_backend(
                    backend, ClickHouseSettings(path=data), batches, encoding=args.encoding
                )
            else:
                with http_endpoint(data) as (url, pid):
                    figures = run_backend(
                        backend,
                        ClickHouseSettings(url=url, path=Path(tmp) / "unused"),
                        batches,
                        server_pid=pid,
                        encoding=args.encoding,
                    )
            assert figures["stored_weight"] == args.rows, figures
            sink_rows_per_s = args.rows / (process_s + figures["insert_s"])
            figures["sink_attempts_per_s"] = round(sink_rows_per_s)
            print(
                f"{backend}: insert {figures['insert_rows_per_s']:,} rows/s "
                f"({figures['insert_rows_per_cpu_s']:,} per CPU second) "
                f"({figures['rows']:,} rows in {figures['inserts']} inserts, "
                f"{figures['insert_s']:.2f} s); sink path {sink_rows_per_s:,.0f} attempts/s"
            )
            result["backends"].append(figures)
            # flat copies: the summary of bench.run shows scalar figures only
            result[f"{backend}_insert_rows_per_s"] = figures["insert_rows_per_s"]
            result[f"{backend}_insert_rows_per_cpu_s"] = figures["insert_rows_per_cpu_s"]
            result[f"{backend}_sink_attempts_per_s"] = figures["sink_attempts_per_s"]
    result["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
