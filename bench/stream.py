"""Benchmarks of the real worker (``authpipe worker`` subprocesses on a real broker).

Run as ``python -m bench.stream [--bootstrap HOST:PORT] [--quick] [--only b1,b2,b3,b6]``;
``bench.run`` calls the same functions and adds the peers. Without ``--bootstrap`` a
local Kafka broker starts in a temp dir (jars from ``.state/kafka/libs``) and stops at
the end. The last line printed is JSON.

* B1: a pre-loaded topic of mixed traffic (``mixed_events``); throughput is the events
  counted by the account stage between the worker's ``/readyz`` and the moment both
  stages stop moving, read from ``/metrics`` polled every 100 ms (not a timed test).
* B2: background load at a fixed rate, and probes: four failures of a fresh
  (account, source), then the tripping fifth; latency from handing the fifth to the
  producer until its decision is read from the decisions topic, and until an edge
  ``DecisionView`` (following the topic) refuses the attempt.
* B3: a flood of distinct claimed accounts from a pool of sources (credential
  stuffing: every event is an untrusted failure, so it crosses both stages), with a
  lowered table cap; RSS from ``/proc/<pid>/status``, table entries and evictions.
* B6: a worker holding N tracked accounts (with probes at 4 failures) is stopped
  (SIGTERM) and a new one started; time to ready, to its tables restored, and to the
  probes' fifth failures being decided with count 5.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench.bench_core import _pick
from bench.procfs import status_kb
from pipeline.clock import wall_ms
from pipeline.logs import get_logger

log = get_logger("bench")

REPO_ROOT = Path(__file__).resolve().parents[1]
LIBS_DIR = REPO_ROOT / ".state" / "kafka" / "libs"
PARTITIONS = 8
METRICS_POLL_S = 0.25
SETTLE_S = 1.0
READY_TIMEOUT_S = 120.0
RESTART_TIMEOUT_S = 600.0  # B6 reports how long recovery takes, however long

Message = tuple[bytes, bytes, int]  # key, value, timestamp (epoch ms = occurred_at)
# bootstrap -> data dir of each broker this process started (for bytes-on-the-broker figures)
BROKER_DATA_DIRS: dict[str, Path] = {}


# -- traffic -------------------------------------------------------------------------------


def iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


UA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36"
TENANTS = (("default", 0.7), ("acme", 0.2), ("globex", 0.1))


class MixedTraffic:
    """Wire login attempts, by share of events: ordinary users 80 % (~90 % success, own
    or NAT source, device cookies mostly trusted), brute force 5 %, distributed brute
    force 5 %, password spray 5 %, credential stuffing 5 %.

    ``fresh``: every ordinary user's attempt is a new person at a new place with a new,
    untrusted cookie (an account, a /24 and a cookie never seen before), so every success
    is a first sign-in there and publishes its familiar exempts: a cold deployment, or an
    attacker signing in its own free accounts from fresh proxies (issue 45)."""

    def __init__(self, seed: int, users: int = 50_000, fresh: bool = False) -> None:
        self.rng = rng = random.Random(seed)
        self.seed = seed
        self.fresh = fresh
        self.fresh_next = 0
        nats = [f"198.51.{i // 256}.{i % 256}" for i in range(50)]
        self.users: list[tuple[str, str, str, str, bool]] = []
        for i in range(users):
            tenant = _pick(rng, TENANTS)
            if rng.random() < 0.2:
                source = rng.choice(nats)
            else:
                source = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
            self.users.append(
                (tenant, f"user{i}@example.com", source, f"dev-{i}", rng.random() < 0.7)
            )
        self.victims = [f"victim{i}@example.com" for i in range(20)]
        self.botnet = [f"203.0.{i // 250}.{i % 250}" for i in range(2000)]
        self.brute = [(f"100.64.{i}.1", f"target{i}@example.com") for i in range(10)]
        self.sprayers = [f"100.65.{i}.7" for i in range(10)]
        self.stuffers = [f"100.66.{i}.9" for i in range(20)]
        self.kinds = (
            (self.user, 0.80),
            (self.brute_force, 0.05),
            (self.distributed, 0.05),
            (self.spray, 0.05),
            (self.stuffing, 0.05),
        )

    def user(self, body: dict[str, Any]) -> None:
        rng = self.rng
        if self.fresh:
            i = self.fresh_next = self.fresh_next + 1
            tenant, _, _, _, _ = rng.choice(self.users)
            account, device, trusted = f"new{self.seed:x}-{i}@example.com", f"new-{i}", False
            source = f"{11 + (i >> 16) % 100}.{(i >> 8) & 255}.{i & 255}.9"
        else:
            tenant, account, source, device, trusted = rng.choice(self.users)
        r = rng.random()
        flow = "login" if r < 0.85 else "token" if r < 0.95 else "mfa"
        ok = rng.random() < 0.9
        body.update(
            tenant=tenant,
            account=account,
            peer_ip=source,
            flow=flow,
            device_id=device,
            device_trusted=trusted,
            user_agent=UA,
            outcome="success" if ok else "failure",
        )
        if not ok:
            body["failure_reason"] = "bad_second_factor" if flow == "mfa" else "bad_password"

    def brute_force(self, body: dict[str, Any]) -> None:
        source, account = self.rng.choice(self.brute)
        body.update(
            account=account, peer_ip=source, outcome="failure", failure_reason="bad_password"
        )

    def distributed(self, body: dict[str, Any]) -> None:
        rng = self.rng
        body.update(
            account=rng.choice(self.victims),
            peer_ip=rng.choice(self.botnet),
            outcome="failure",
            failure_reason="bad_password",
        )

    def spray(self, body: dict[str, Any]) -> None:
        rng = self.rng
        body.update(
            account=f"{rng.choice(self.users)[1]}",
            peer_ip=rng.choice(self.sprayers),
            outcome="failure",
            failure_reason="bad_password",
        )

    def stuffing(self, body: dict[str, Any]) -> None:
        rng = self.rng
        reason = "unknown_account" if rng.random() < 0.9 else "bad_password"
        body.update(
            tenant="acme",
            account=f"leak{rng.getrandbits(40):x}@example.net",
            peer_ip=rng.choice(self.stuffers),
            outcome="failure",
            failure_reason=reason,
        )

    def event(self, index: int, at_ms: int) -> Message:
        body: dict[str, Any] = {
            "event_id": f"mx{self.seed:x}-{index:08x}",
            "occurred_at": iso_ms(at_ms),
            "service": "web-login",
        }
        r = self.rng.random()
        make = self.kinds[-1][0]
        for candidate, share in self.kinds:
            r -= share
            if r < 0:
                make = candidate
                break
        make(body)
        return body["account"].encode(), orjson.dumps(body), at_ms


def mixed_events(count: int, seed: int, end_ms: int, rate_per_s: int = 1000) -> list[Message]:
    """``count`` mixed events whose event time ends at ``end_ms`` (``rate_per_s`` apart)."""
    traffic = MixedTraffic(seed)
    start_ms = end_ms - count * 1000 // rate_per_s
    return [traffic.event(i, start_ms + i * 1000 // rate_per_s) for i in range(count)]


def flood_events(count: int, sources: int, seed: int, end_ms: int) -> list[Message]:
    """Credential stuffing flood: every event a distinct claimed account, ``sources`` IPs."""
    rng = random.Random(seed)
    pool = [f"10.{100 + i // 65536}.{(i >> 8) & 255}.{i & 255}" for i in range(sources)]
    start_ms = end_ms - count // 2
    out: list[Message] = []
    for i in range(count):
        account = f"claimed-{seed:x}-{i}@example.org"
        at_ms = start_ms + i // 2
        body = {
            "event_id": f"fl{seed:x}-{i:08x}",
            "occurred_at": iso_ms(at_ms),
            "service": "web-login",
            "account": account,
            "peer_ip": rng.choice(pool),
            "outcome": "failure",
            "failure_reason": "unknown_account" if rng.random() < 0.9 else "bad_password",
        }
        out.append((account.encode(), orjson.dumps(body), at_ms))
    return out


def failure(event_id: str, account: str, source: str, at_ms: int, **fields: str) -> Message:
    """A failed password attempt (``fields`` override or add contract fields)."""
    body = {
        "event_id": event_id,
        "occurred_at": iso_ms(at_ms),
        "service": "web-login",
        "account": account,
        "peer_ip": source,
        "outcome": "failure",
        "failure_reason": "bad_password",
        **fields,
    }
    return account.encode(), orjson.dumps(body), at_ms


# -- broker and topics ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    """``bootstrap`` as is, or a LocalKafka of our own in a temp dir (stopped at exit)."""
    if bootstrap:
        yield bootstrap
        return
    from pipeline.dev.processes import port_free
    from pipeline.dev.stack import LocalKafka

    state_dir = Path(tempfile.mkdtemp(prefix="authpipe-bench-kafka-"))
    port = free_port()
    while not port_free(port + 1):
        port = free_port()
    kafka = LocalKafka(state_dir, port, port + 1, libs_dir=LIBS_DIR, heap_mb=1024)
    try:
        kafka.up()
        BROKER_DATA_DIRS[kafka.bootstrap] = kafka.data_dir
        yield kafka.bootstrap
    finally:
        kafka.down()
        shutil.rmtree(state_dir, ignore_errors=True)


@dataclass(frozen=True)
class Names:
    """A run's app id and topic names (unique per run, so runs never share state)."""

    app_id: str
    input: str
    decisions: str
    alerts: str
    dlq: str
    audit: str
    notices: str = "auth.account-notices"

    @classmethod
    def fresh(cls, label: str, input_topic: str | None = None) -> Names:
        tag = f"{label}-{uuid.uuid4().hex[:8]}"
        return cls(
            app_id=f"bench-{tag}",
            input=input_topic or f"bench-in-{tag}",
            decisions=f"bench-decisions-{tag}",
            alerts=f"bench-alerts-{tag}",
            dlq=f"bench-dlq-{tag}",
            audit=f"bench-audit-{tag}",
            notices=f"bench-notices-{tag}",
        )

    def env(self) -> dict[str, str]:
        return {
            "AUTHPIPE_KAFKA_APP_ID": self.app_id,
            "AUTHPIPE_KAFKA_INPUT_TOPIC": self.input,
            "AUTHPIPE_KAFKA_DECISIONS_TOPIC": self.decisions,
            "AUTHPIPE_KAFKA_ALERTS_TOPIC": self.alerts,
            "AUTHPIPE_KAFKA_DLQ_TOPIC": self.dlq,
            "AUTHPIPE_KAFKA_AUDIT_TOPIC": self.audit,
            "AUTHPIPE_KAFKA_NOTICES_TOPIC": self.notices,
        }


def create_topics(bootstrap: str, names: Names, partitions: int = PARTITIONS) -> None:
    """Every topic of the worker, as it creates them (so the input can be pre-loaded)."""
    from pipeline.kafka_admin import ensure_topics
    from pipeline.settings import KafkaSettings
    from pipeline.topics import Topics

    kafka = KafkaSettings(
        bootstrap_servers=bootstrap,
        partitions=partitions,
        app_id=names.app_id,
        input_topic=names.input,
        decisions_topic=names.decisions,
        alerts_topic=names.alerts,
        dlq_topic=names.dlq,
        audit_topic=names.audit,
        notices_topic=names.notices,
    )
    asyncio.run(ensure_topics(bootstrap, Topics.from_settings(kafka).specs(partitions)))


def key_partition(key: bytes, partitions: int) -> int:
    return zlib.crc32(key) % partitions


async def produce_all(bootstrap: str, topic: str, messages: list[Message], partitions: int) -> None:
    """Write ``messages`` fast: one record batch per partition at a time, keyed by account."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        linger_ms=5,
        max_batch_size=1 << 20,
        max_request_size=8 << 20,
    )
    await producer.start()
    try:
        by_partition: list[list[Message]] = [[] for _ in range(partitions)]
        for message in messages:
            by_partition[key_partition(message[0], partitions)].append(message)
        pending: list[Any] = []
        for partition, items in enumerate(by_partition):
            batch = producer.create_batch()
            for key, value, ts_ms in items:
                if batch.append(key=key, value=value, timestamp=ts_ms) is None:
                    pending.append(await producer.send_batch(batch, topic, partition=partition))
                    batch = producer.create_batch()
                    batch.append(key=key, value=value, timestamp=ts_ms)
            pending.append(await producer.send_batch(batch, topic, partition=partition))
            if len(pending) > 32:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def preload(
    bootstrap: str, topic: str, messages: list[Message], partitions: int = PARTITIONS
) -> float:
    """Produce ``messages`` to ``topic``; returns the seconds it took."""
    started = time.perf_counter()
    asyncio.run(produce_all(bootstrap, topic, messages, partitions))
    return time.perf_counter() - started


# -- the worker subprocess -------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text into {sample name with labels: value} plus {name: sum of samples}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        number = float(value)
        out[head] = number
        name = head.split("{", 1)[0]
        if name != head:
            out[name] = out.get(name, 0.0) + number
    return out


class WorkerRun:
    """One ``authpipe worker`` subprocess with its own web port; stopped by ``stop()``."""

    def __init__(self, env: dict[str, str], log_path: Path, root: Path = REPO_ROOT) -> None:
        self.port = free_port()
        self.env = {**os.environ, **env, "AUTHPIPE_WORKER_WEB_PORT": str(self.port)}
        self.log_path = log_path
        self.root = root  # the checkout whose code runs (an A/B run's other side)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> WorkerRun:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline.cli", "worker"],
                env=self.env,
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.perf_counter()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return int(r.status), r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""
        except OSError:
            return 0, b""

    def ready(self) -> bool:
        self.check_alive()
        return self._get("/readyz")[0] == 200

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Seconds from start to ``/readyz`` answering 200."""
        deadline = time.perf_counter() + timeout_s
        while not self.ready():
            if time.perf_counter() > deadline:
                raise RuntimeError(f"worker not ready in {timeout_s} s: {self.log_tail()}")
            time.sleep(0.05)
        return time.perf_counter() - self.started

    def metrics(self) -> dict[str, float]:
        status, body = self._get("/metrics")
        return parse_metrics(body.decode()) if status == 200 else {}

    def rss_mb(self) -> dict[str, float]:
        """VmRSS (now) and VmHWM (peak) of the worker process, in MB."""
        kb = status_kb(self.pid, ("VmRSS", "VmHWM"))
        return {name: round(value / 1024, 1) for name, value in kb.items()}

    def cpu_s(self) -> float:
        """User + system CPU seconds of the worker process so far."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def check_alive(self) -> None:
        """Raise with the log's tail if the worker process has exited."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker exited with {self.proc.returncode}: {self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        # faust's terminal spinner writes escape codes and carriage returns
        text = text.replace("\r", "\n").replace("\x1b[?25l", "").replace("\x1b[?25h", "")
        return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


@dataclass
class Context:
    """What every benchmark of the worker needs: the broker, a scratch dir, options."""

    bootstrap: str
    workdir: Path
    partitions: int = PARTITIONS
    extra_env: dict[str, str] = field(default_factory=dict)
    workers: list[WorkerRun] = field(default_factory=list)

    def worker(self, names: Names, label: str, root: Path = REPO_ROOT, **env: str) -> WorkerRun:
        state = self.workdir / f"state-{names.app_id}"
        state.mkdir(parents=True, exist_ok=True)
        full = {
            **names.env(),
            "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "AUTHPIPE_KAFKA_PARTITIONS": str(self.partitions),
            "AUTHPIPE_STATE_DIR": str(state),
            "AUTHPIPE_LOG_FORMAT": "json",
            "AUTHPIPE_LOG_LEVEL": "warning",
            **self.extra_env,
            **env,
        }
        run = WorkerRun(full, self.workdir / f"worker-{label}.log", root)
        self.workers.append(run)
        return run.start()

    def stop_all(self) -> None:
        for run in self.workers:
            run.stop(signal.SIGKILL)


# -- B1 / B3: throughput from /metrics ----------------------------------------------------------


# What a segment of a run records at its end (``follow_until_done``'s ``segments``).
SEGMENT_METRICS = {
    "account_changelog_records": 'authpipe_changelog_records_total{stage="account"}',
    "account_changelog_tombstones": 'authpipe_changelog_tombstones_total{stage="account"}',
    "source_changelog_records": 'authpipe_changelog_records_total{stage="source"}',
    "source_changelog_tombstones": 'authpipe_changelog_tombstones_total{stage="source"}',
    "account_table_evictions": 'authpipe_table_evictions{stage="account"}',
    "source_table_evictions": 'authpipe_table_evictions{stage="source"}',
    "gc_s": "authpipe_gc_seconds_total",
    "gc_full_collections": 'authpipe_gc_collections_total{generation="2"}',
    "gc_collected": "authpipe_gc_collected_objects_total",
    "account_stage_s": 'authpipe_stage_seconds_total{stage="account"}',
    "source_stage_s": 'authpipe_stage_seconds_total{stage="source"}',
}
# What a segment reports as it stood at its end, not per event.
SEGMENT_LEVELS = {
    "account_table_entries": 'authpipe_table_entries{stage="account"}',
    "source_table_entries": 'authpipe_table_entries{stage="source"}',
}


def applied_rows(metrics: dict[str, float]) -> float:
    """The account stage's rows applied so far: those it received less those it still
    holds for event-time order (a held row costs its work when it is released)."""
    return metrics.get('authpipe_stage_rows_total{stage="account"}', 0) - metrics.get(
        'authpipe_reorder_held_rows{stage="account"}', 0
    )


def segment_figures(marks: list[tuple[float, float, dict[str, float]]]) -> list[dict[str, Any]]:
    """Per stretch between two marks (time, CPU seconds, metrics at the mark): CPU us per
    account row applied and every SEGMENT_METRICS counter per row applied, and the levels
    at its end."""
    out = []
    for (_, cpu0, m0), (_, cpu1, m1) in itertools.pairwise(marks):
        rows = applied_rows(m1) - applied_rows(m0)
        if rows <= 0:
            continue
        figure: dict[str, Any] = {
            "rows_at_end": int(applied_rows(m1)),
            "cpu_us_per_event": round((cpu1 - cpu0) / rows * 1e6, 2),
        }
        for name, metric in SEGMENT_METRICS.items():
            figure[f"{name}_per_event"] = round((m1.get(metric, 0) - m0.get(metric, 0)) / rows, 6)
        for name, metric in SEGMENT_LEVELS.items():
            figure[name] = int(m1.get(metric, 0))
        out.append(figure)
    return out


def follow_until_done(
    run: WorkerRun, expected_rows: int, timeout_s: float, segments: int = 0
) -> dict[str, Any]:
    """Poll /metrics until the account stage counted ``expected_rows`` and neither stage
    moved for SETTLE_S. Returns counters at ready and at the end, and the span between;
    with ``segments``, also the run cut into that many stretches of account rows applied
    (``segment_figures``: CPU per event, changelog records, evictions and the collector's
    time per event in each), to see whether the cost per event grows as the run goes on.

    The end time is the last poll at which a stage counter moved (error <= one poll)."""
    ready_s = run.wait_ready()
    t_ready = time.perf_counter()
    at_ready = run.metrics()
    cpu_at_ready = run.cpu_s()
    cpu_moved = cpu_at_ready
    last: dict[str, float] = at_ready
    t_moved = t_ready
    peak_rss: dict[str, float] = {}
    deadline = t_ready + timeout_s
    watched = (
        'authpipe_stage_rows_total{stage="account"}',
        'authpipe_stage_rows_total{stage="source"}',
    )
    marks = [(t_ready, cpu_at_ready, at_ready)]
    while True:
        time.sleep(METRICS_POLL_S)
        now = time.perf_counter()
        current = run.metrics()
        if not current:
            run.check_alive()
            continue
        if any(current.get(k, 0) != last.get(k, 0) for k in watched):
            t_moved = now
            cpu_moved = run.cpu_s()
        last = current
        if segments and applied_rows(current) >= expected_rows * len(marks) / segments:
            marks.append((now, run.cpu_s(), current))
        rss = run.rss_mb()
        if rss.get("VmHWM", 0) >= peak_rss.get("VmHWM", 0):
            peak_rss = rss
        done = current.get(watched[0], 0) >= expected_rows
        if done and now - t_moved >= SETTLE_S:
            break
        if now > deadline:
            raise RuntimeError(
                f"worker did not finish {expected_rows} rows in {timeout_s} s: {current.get(watched[0])}"
            )
    if segments and applied_rows(last) > applied_rows(marks[-1][2]):
        marks.append((t_moved, cpu_moved, last))
    rows = last.get(watched[0], 0) - at_ready.get(watched[0], 0)
    span_s = max(t_moved - t_ready, 1e-9)
    cpu_s = max(cpu_moved - cpu_at_ready, 1e-9)
    return {
        "cpu_s": round(cpu_s, 2),
        "events_per_cpu_s": round(rows / cpu_s),
        "cpu_share": round(cpu_s / span_s, 2),
        "ready_s": round(ready_s, 2),
        "rows_before_ready": int(at_ready.get(watched[0], 0)),
        "rows": int(rows),
        "seconds": round(span_s, 3),
        "events_per_s": round(rows / span_s),
        "final": last,
        "rss_mb": run.rss_mb(),
        "peak_rss_mb_sampled": peak_rss,
        **({"segments": segment_figures(marks)} if segments else {}),
    }


def summary_counts(final: dict[str, float]) -> dict[str, Any]:
    pick = {
        "events_total": "authpipe_events_total",
        "dead_letters": "authpipe_dead_letters_total",
        "account_rows": 'authpipe_stage_rows_total{stage="account"}',
        "source_rows": 'authpipe_stage_rows_total{stage="source"}',
        "decisions": 'authpipe_decisions_total{kind="decision"}',
        "tombstones": 'authpipe_decisions_total{kind="tombstone"}',
        "alerts": "authpipe_alerts_total",
        "account_table_entries": 'authpipe_table_entries{stage="account"}',
        "source_table_entries": 'authpipe_table_entries{stage="source"}',
        "account_table_evictions": 'authpipe_table_evictions{stage="account"}',
        "source_table_evictions": 'authpipe_table_evictions{stage="source"}',
        "account_stage_s": 'authpipe_stage_seconds_total{stage="account"}',
        "source_stage_s": 'authpipe_stage_seconds_total{stage="source"}',
        **{
            f"{stage}_changelog_{what}": f'authpipe_changelog_{what}_total{{stage="{stage}"}}'
            for stage in ("account", "source", "rollup")
            for what in ("records", "tombstones", "held_records", "bytes")
        },
        "gc_s": "authpipe_gc_seconds_total",
        "gc_full_collections": 'authpipe_gc_collections_total{generation="2"}',
        "gc_collections": "authpipe_gc_collections_total",
        "gc_collected": "authpipe_gc_collected_objects_total",
    }
    return {name: round(final.get(metric, 0.0), 3) for name, metric in pick.items()}


def changelog_per_event(counts: dict[str, Any], events: int) -> dict[str, float]:
    """The changelog records each stage wrote per input event (``summary_counts``' counts),
    values and tombstones apart, and their sum over the stages."""
    out: dict[str, float] = {}
    total = 0.0
    for stage in ("account", "source", "rollup"):
        records = counts.get(f"{stage}_changelog_records", 0.0)
        tombstones = counts.get(f"{stage}_changelog_tombstones", 0.0)
        out[f"{stage}_values"] = round((records - tombstones) / max(events, 1), 4)
        out[f"{stage}_tombstones"] = round(tombstones / max(events, 1), 4)
        total += records
    out["all_records"] = round(total / max(events, 1), 4)
    return out


def bench_b1(
    ctx: Context,
    names: Names,
    events: int,
    timeout_s: float = 900.0,
    label: str = "b1",
    segments: int = 0,
    **env: str,
) -> dict[str, Any]:
    """B1: the worker over the pre-loaded ``names.input`` (``events`` valid events);
    ``env`` adds to the worker's environment."""
    run = ctx.worker(names, label, **env)
    try:
        result = follow_until_done(run, events, timeout_s, segments)
    finally:
        run.stop()
    final = result.pop("final")
    counts = summary_counts(final)
    return {
        **result,
        "events": events,
        "counts": counts,
        "changelog_per_event": changelog_per_event(counts, events),
    }


# B1 on 3M events with caps that do not bite (issue 28): per partition an entry cap of
# 20,000,000 / 8 and a dedupe memory of 10,000,000 event ids, against 3M events of which
# at most about 150,000 are distinct stuffing accounts and 50,000 users.
B1_3M_EVENTS = 3_000_000
UNCAPPED_ENTRY_CAP = 20_000_000
UNCAPPED_DEDUPE_CAPACITY = 10_000_000
B1_3M_SEGMENTS = 6


def uncapped_policy(path: Path, entry_cap: int = UNCAPPED_ENTRY_CAP) -> Path:
    path.write_text(f'policy_version = "bench-uncapped"\n[defaults]\nentry_cap = {entry_cap}\n')
    return path


def bench_b1_3m(
    ctx: Context,
    events: int = B1_3M_EVENTS,
    b1: dict[str, Any] | None = None,
    timeout_s: float = 3600.0,
) -> dict[str, Any]:
    """B1 on ``events`` events (a topic of its own, the same traffic) with the tables' entry
    caps and the dedupe memory raised so they do not bite; with ``b1`` (the same run's B1),
    the ratio of the two per CPU-second and both runs' changelog records per event."""
    names, preload_s = prepare_b1(ctx, events)
    policy = uncapped_policy(ctx.workdir / "uncapped-policy.toml")
    result = bench_b1(
        ctx,
        names,
        events,
        timeout_s,
        label="b1_3m",
        segments=B1_3M_SEGMENTS,
        AUTHPIPE_POLICY_PATH=str(policy),
        AUTHPIPE_INGEST_DEDUPE_CAPACITY=str(UNCAPPED_DEDUPE_CAPACITY),
    )
    counts = result["counts"]
    out: dict[str, Any] = {
        **result,
        "preload_s": round(preload_s, 1),
        "entry_cap": UNCAPPED_ENTRY_CAP,
        "dedupe_capacity": UNCAPPED_DEDUPE_CAPACITY,
        "evictions": {
            stage: counts.get(f"{stage}_table_evictions", 0) for stage in ("account", "source")
        },
    }
    if b1 is not None and "events_per_cpu_s" in b1:
        out["b1_events"] = b1.get("events")
        out["vs_b1_cpu"] = (
            round(result["events_per_cpu_s"] / b1["events_per_cpu_s"], 3)
            if b1["events_per_cpu_s"]
            else None
        )
        out["b1_changelog_per_event"] = b1.get("changelog_per_event")
        out["b1_evictions"] = {
            stage: (b1.get("counts") or {}).get(f"{stage}_table_evictions", 0)
            for stage in ("account", "source")
        }
    return out


def follow_group(runs: list[WorkerRun], expected_rows: int, timeout_s: float) -> dict[str, Any]:
    """Poll every worker of one consumer group until their account stages together counted
    ``expected_rows`` and no stage of any worker moved for SETTLE_S. The span runs from
    the call (the input is produced after it) to the last poll at which a counter moved;
    CPU is the sum over the workers over the same span."""
    watched = (
        'authpipe_stage_rows_total{stage="account"}',
        'authpipe_stage_rows_total{stage="source"}',
    )
    t0 = time.perf_counter()
    at_start = [run.metrics() for run in runs]
    cpu_start = [run.cpu_s() for run in runs]
    cpu_moved = list(cpu_start)
    last = at_start
    t_moved = t0
    deadline = t0 + timeout_s
    while True:
        time.sleep(METRICS_POLL_S)
        now = time.perf_counter()
        current = [run.metrics() for run in runs]
        for i, run in enumerate(runs):
            if not current[i]:
                run.check_alive()
                current[i] = last[i]
        moved = any(
            c.get(k, 0) != p.get(k, 0) for c, p in zip(current, last, strict=True) for k in watched
        )
        if moved:
            t_moved = now
            cpu_moved = [run.cpu_s() for run in runs]
        last = current
        rows_now = sum(
            c.get(watched[0], 0) - a.get(watched[0], 0)
            for c, a in zip(current, at_start, strict=True)
        )
        if rows_now >= expected_rows and now - t_moved >= SETTLE_S:
            break
        if now > deadline:
            raise RuntimeError(
                f"{len(runs)} workers did not finish {expected_rows} rows in {timeout_s} s: {rows_now}"
            )
    per_worker = [
        int(c.get(watched[0], 0) - a.get(watched[0], 0))
        for c, a in zip(last, at_start, strict=True)
    ]
    rows = sum(per_worker)
    span_s = max(t_moved - t0, 1e-9)
    cpu_s = max(sum(cpu_moved) - sum(cpu_start), 1e-9)
    return {
        "workers": len(runs),
        "rows": rows,
        "rows_per_worker": per_worker,
        "replayed_rows": int(
            sum(c.get('authpipe_stage_replayed_rows_total{stage="account"}', 0) for c in last)
        ),
        "seconds": round(span_s, 3),
        "events_per_s": round(rows / span_s),
        "cpu_s": round(cpu_s, 2),
        "events_per_cpu_s": round(rows / cpu_s),
        "cpu_s_per_worker": [round(m - s, 2) for m, s in zip(cpu_moved, cpu_start, strict=True)],
    }


def broker_bytes_per_event(bootstrap: str, names: Names, events: int) -> dict[str, float] | None:
    """Bytes in the broker's logs per input event, for every topic of the run (input,
    internal, changelogs, outputs; one replica), read from the data dir of a broker this
    process started (None for ``--bootstrap``). Segments are preallocated sparse files,
    so this counts allocated blocks."""
    data_dir = BROKER_DATA_DIRS.get(bootstrap)
    if data_dir is None:
        return None
    tag = names.app_id.removeprefix("bench-")
    sizes: dict[str, float] = {}
    for part_dir in data_dir.iterdir():
        if not part_dir.is_dir() or tag not in part_dir.name:
            continue
        topic = part_dir.name.rsplit("-", 1)[0]
        used = sum(f.stat().st_blocks * 512 for f in part_dir.iterdir() if f.suffix == ".log")
        sizes[topic] = sizes.get(topic, 0.0) + used
    out = {
        topic.replace(tag, "*"): round(size / events, 1) for topic, size in sorted(sizes.items())
    }
    out["total"] = round(sum(sizes.values()) / events, 1)
    return out


def bench_b1_group(
    ctx: Context,
    events: int,
    workers: int = 2,
    seed: int = 7,
    settle_s: float = 10.0,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """B1 with one worker, then ``workers`` workers in one consumer group, on the same
    mixed events: events per CPU-second of all workers together (on 2 cores the wall rate
    of two workers says little). Each run has a fresh empty input topic; its workers are
    started, ready and given ``settle_s`` for the group to settle, and only then are the
    events produced, so no measured span includes a worker joining the group."""
    messages = mixed_events(events, seed, wall_ms() - 60_000)
    out: dict[str, Any] = {"events": events, "settle_s": settle_s}
    for label, count in (("one", 1), ("two", workers)):
        names = Names.fresh(f"group{count}")
        create_topics(ctx.bootstrap, names, ctx.partitions)
        runs = [ctx.worker(names, f"group{count}-{i}") for i in range(count)]
        try:
            for run in runs:
                run.wait_ready()
            time.sleep(settle_s)
            producer = threading.Thread(
                target=preload, args=(ctx.bootstrap, names.input, messages, ctx.partitions)
            )
            producer.start()
            out[label] = follow_group(runs, events, timeout_s)
            producer.join()
            out[label]["broker_bytes_per_event"] = broker_bytes_per_event(
                ctx.bootstrap, names, events
            )
        finally:
            for run in runs:
                run.stop()
    one, two = out["one"]["events_per_cpu_s"], out["two"]["events_per_cpu_s"]
    out["one_worker_events_per_cpu_s"] = one
    out["two_workers_events_per_cpu_s"] = two
    out["cpu_efficiency_ratio"] = round(two / one, 3) if one else None
    return out


def flood_policy(path: Path, entry_cap: int) -> Path:
    path.write_text(f'policy_version = "bench-flood"\n[defaults]\nentry_cap = {entry_cap}\n')
    return path


def prepare_b3(
    ctx: Context, events: int, sources: int, entry_cap: int, seed: int = 13
) -> tuple[Names, float, Path]:
    """Create and pre-load B3's flood topic; the policy file with its lowered table cap."""
    names = Names.fresh("b3")
    create_topics(ctx.bootstrap, names, ctx.partitions)
    messages = flood_events(events, sources, seed, wall_ms() - 60_000)
    preload_s = preload(ctx.bootstrap, names.input, messages, ctx.partitions)
    del messages
    return names, preload_s, flood_policy(ctx.workdir / "flood-policy.toml", entry_cap)


def bench_b3(
    ctx: Context,
    events: int,
    sources: int,
    entry_cap: int,
    seed: int = 13,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """B3: a flood of distinct claimed accounts with a lowered table cap."""
    names, preload_s, policy = prepare_b3(ctx, events, sources, entry_cap, seed)
    run = ctx.worker(names, "b3", AUTHPIPE_POLICY_PATH=str(policy))
    try:
        result = follow_until_done(run, events, timeout_s)
    finally:
        run.stop()
    final = result.pop("final")
    return {
        **result,
        "events": events,
        "distinct_accounts": events,
        "sources": sources,
        "entry_cap": entry_cap,
        "preload_s": round(preload_s, 1),
        "counts": summary_counts(final),
    }


# -- B2: latency of decisions under load --------------------------------------------------------


def load_main(
    bootstrap: str, topic: str, rate_per_s: int, duration_s: float, seed: int, fresh: bool = False
) -> None:
    """The background load (a separate process): mixed events made now, paced in 10 ms
    ticks; ``fresh``: every ordinary user's attempt at a new place (``MixedTraffic``)."""

    async def run() -> None:
        traffic = MixedTraffic(seed, users=20_000, fresh=fresh)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=5)
        await producer.start()
        tick_s = 0.01
        per_tick = max(1, round(rate_per_s * tick_s))
        started = time.perf_counter()
        sent = 0
        try:
            while (elapsed := time.perf_counter() - started) < duration_s:
                due = int(elapsed * rate_per_s) + per_tick
                now = wall_ms()
                futures = []
                while sent < due:
                    key, value, ts_ms = traffic.event(sent, now)
                    futures.append(
                        await producer.send(topic, value=value, key=key, timestamp_ms=ts_ms)
                    )
                    sent += 1
                await asyncio.sleep(max(0.0, started + sent / rate_per_s - time.perf_counter()))
            await producer.flush()
        finally:
            await producer.stop()
        print(
            orjson.dumps(
                {"sent": sent, "seconds": round(time.perf_counter() - started, 2)}
            ).decode(),
            flush=True,
        )

    asyncio.run(run())


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def latency_summary(seconds: list[float]) -> dict[str, Any]:
    values = sorted(s * 1000 for s in seconds)
    return {
        "samples": len(values),
        "p50_ms": round(percentile(values, 0.50), 1),
        "p99_ms": round(percentile(values, 0.99), 1),
        "max_ms": round(values[-1], 1) if values else None,
    }


async def probe_latencies(ctx: Context, names: Names, probes: int, gap_s: float) -> dict[str, Any]:
    """Trip ``probes`` fresh (account, source) pairs; time to the topic and to the edge."""
    from pipeline.edge.feed import DecisionFeed, FeedConfig
    from pipeline.edge.view import DecisionView
    from pipeline.settings import load_settings
    from pipeline.wiring import build_normaliser

    view = DecisionView(build_normaliser(load_settings()))
    feed = DecisionFeed(view, FeedConfig(ctx.bootstrap, names.decisions, poll_interval_ms=100))
    consumer = AIOKafkaConsumer(
        names.decisions,
        bootstrap_servers=ctx.bootstrap,
        auto_offset_reset="latest",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    producer = AIOKafkaProducer(bootstrap_servers=ctx.bootstrap, acks=1, linger_ms=0)
    await asyncio.gather(producer.start(), consumer.start(), feed.start())
    sent_at: dict[str, float] = {}
    first_sent: list[float] = []
    to_topic: dict[str, float] = {}
    to_edge: dict[str, float] = {}
    pending_edge: dict[str, tuple[str, str]] = {}

    async def read_topic() -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=100)
            now = time.perf_counter()
            for messages in batch.values():
                for m in messages:
                    # keys hold digests, not accounts: a probe's decision is known by its
                    # source (each probe trips from an address of its own)
                    if m.value and b'"scope":"account_source"' in m.value:
                        ip = orjson.loads(m.value).get("source")
                        if ip in sent_at and ip not in to_topic:
                            to_topic[ip] = now - sent_at[ip]

    async def watch_edge() -> None:
        while True:
            version = view.changes.version
            now = time.perf_counter()
            for ip, (account, tenant) in list(pending_edge.items()):
                if not view.check(tenant, account, ip).allowed:
                    to_edge[ip] = now - sent_at[ip]
                    del pending_edge[ip]
            await view.changes.wait(version, 0.05)

    tasks = [asyncio.create_task(read_topic()), asyncio.create_task(watch_edge())]
    try:
        await feed.wait_ready(60)
        await asyncio.sleep(0.5)
        run_tag = uuid.uuid4().hex[:6]
        for i in range(probes):
            account, ip = f"probe-{run_tag}-{i}@example.com", f"172.16.{i // 250}.{i % 250 + 1}"
            now = wall_ms()
            for n in range(4):
                key, value, ts = failure(f"pr{run_tag}-{i}-{n}", account, ip, now + n)
                await producer.send(names.input, key=key, value=value, timestamp_ms=ts)
            await producer.flush()
            await asyncio.sleep(gap_s)
            key, value, ts = failure(f"pr{run_tag}-{i}-4", account, ip, wall_ms())
            pending_edge[ip] = (account, "default")
            sent_at[ip] = time.perf_counter()
            first_sent[:] = first_sent or [sent_at[ip]]
            await producer.send_and_wait(names.input, key=key, value=value, timestamp_ms=ts)
            await asyncio.sleep(gap_s)
        deadline = time.perf_counter() + 10
        while (len(to_topic) < probes or pending_edge) and time.perf_counter() < deadline:
            await asyncio.sleep(0.1)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(producer.stop(), consumer.stop(), feed.stop(), return_exceptions=True)
    return {
        "probes": probes,
        "decided": len(to_topic),
        "edge_visible": len(to_edge),
        "to_topic": latency_summary(list(to_topic.values())),
        "to_edge": latency_summary(list(to_edge.values())),
        # When the slowest were sent (seconds after the first probe): a stall at the
        # start, a saturated worker (rising to the end) or a pause mid-run.
        "slowest_to_topic": [
            {"sent_s": round(sent_at[ip] - first_sent[0], 1), "ms": round(s * 1000, 1)}
            for ip, s in sorted(to_topic.items(), key=lambda kv: -kv[1])[:5]
        ],
        "undecided_sent_s": sorted(
            round(sent_at[ip] - first_sent[0], 1) for ip in sent_at if ip not in to_topic
        )[:10],
    }


def start_load(
    bootstrap: str,
    topic: str,
    rate_per_s: int,
    duration_s: float,
    stdout: int = subprocess.DEVNULL,
    fresh: bool = False,
) -> subprocess.Popen[bytes]:
    """``bench.stream --load``: mixed traffic at ``rate_per_s`` to ``topic`` for
    ``duration_s`` from a process of its own (its own session, so a ``killpg`` ends it);
    ``fresh``: every ordinary user signs in at a new place. Its last stdout line is what
    it sent (JSON)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.stream",
            "--load",
            bootstrap,
            topic,
            str(rate_per_s),
            str(duration_s),
            *(["--load-fresh"] if fresh else []),
        ],
        cwd=REPO_ROOT,
        stdout=stdout,
        start_new_session=True,
    )


def bench_b2(ctx: Context, rate_per_s: int, probes: int, gap_s: float = 0.1) -> dict[str, Any]:
    """B2: probes' decision latency while a second process loads the input topic."""
    names = Names.fresh("b2")
    create_topics(ctx.bootstrap, names, ctx.partitions)
    run = ctx.worker(names, "b2")
    load: subprocess.Popen[bytes] | None = None
    try:
        run.wait_ready()
        duration_s = probes * 2 * gap_s + 8
        load = start_load(ctx.bootstrap, names.input, rate_per_s, duration_s, subprocess.PIPE)
        time.sleep(3)  # the load is flowing before the first probe
        before = run.metrics()
        t0 = time.perf_counter()
        result = asyncio.run(probe_latencies(ctx, names, probes, gap_s))
        after = run.metrics()
        span_s = time.perf_counter() - t0
        out, _ = load.communicate(timeout=duration_s + 60)
        sent = orjson.loads(out.decode().strip().splitlines()[-1])
        key = "authpipe_events_total"
        result |= {
            "background_rate_per_s": rate_per_s,
            "load": sent,
            "worker_events_per_s_during": round((after.get(key, 0) - before.get(key, 0)) / span_s),
            "ingest_lag_at_end": int(after.get("authpipe_ingest_lag_messages", 0)),
        }
        return result
    finally:
        if load is not None and load.poll() is None:
            os.killpg(load.pid, signal.SIGKILL)
            load.wait()
        run.stop()


# -- B6: restart with tracked keys --------------------------------------------------------------


async def _await_probe_decisions(
    bootstrap: str, topic: str, sources: set[str], timeout_s: float
) -> dict[str, int]:
    """Counts of the decisions read for ``sources`` (from the topic's start)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
    )
    await consumer.start()
    found: dict[str, int] = {}
    try:
        deadline = time.perf_counter() + timeout_s
        while len(found) < len(sources) and time.perf_counter() < deadline:
            batch = await consumer.getmany(timeout_ms=50)
            for messages in batch.values():
                for m in messages:
                    if m.value:
                        d = orjson.loads(m.value)
                        if d.get("source") in sources and d.get("scope") == "account_source":
                            found[d["source"]] = d["count"]
    finally:
        await consumer.stop()
    return found


def bench_b6(ctx: Context, accounts: int, probes: int = 20, seed: int = 17) -> dict[str, Any]:
    """B6: stop a worker holding ``accounts`` tracked accounts, start a new one, time it."""
    names = Names.fresh("b6")
    create_topics(ctx.bootstrap, names, ctx.partitions)
    end_ms = wall_ms() - 5_000
    messages = [
        failure(
            f"rs{seed}-{i}",
            f"tracked-{i}@example.com",
            f"10.{200 + i // 65536}.{(i >> 8) & 255}.{i & 255}",
            end_ms - accounts + i,
        )
        for i in range(accounts)
    ]
    probe_ips = {f"172.31.{i // 250}.{i % 250 + 1}" for i in range(probes)}
    for n, ip in enumerate(sorted(probe_ips)):
        messages += [
            failure(f"rsp{seed}-{n}-{k}", f"restart-probe-{n}@example.com", ip, end_ms + k)
            for k in range(4)
        ]
    preload(ctx.bootstrap, names.input, messages, ctx.partitions)
    first = ctx.worker(names, "b6-first")
    try:
        follow_until_done(first, len(messages), 600)
        before = first.metrics()
    finally:
        first.stop()
    expected_entries = before.get("authpipe_table_entries", 0)
    second = ctx.worker(names, "b6-second")
    try:
        ready_s = second.wait_ready(RESTART_TIMEOUT_S)
        restored_s = None
        deadline = time.perf_counter() + 60
        while time.perf_counter() < deadline:
            if second.metrics().get("authpipe_table_entries", 0) >= expected_entries:
                restored_s = time.perf_counter() - second.started
                break
            time.sleep(0.05)
        fifth = [
            failure(f"rsp{seed}-{n}-4", f"restart-probe-{n}@example.com", ip, wall_ms())
            for n, ip in enumerate(sorted(probe_ips))
        ]
        preload(ctx.bootstrap, names.input, fifth, ctx.partitions)
        found = asyncio.run(_await_probe_decisions(ctx.bootstrap, names.decisions, probe_ips, 30))
        decided_s = time.perf_counter() - second.started
        after = second.metrics()
    finally:
        second.stop()
    correct = len(found) == probes and all(count == 5 for count in found.values())
    return {
        "tracked_accounts": accounts,
        "table_entries_before": int(expected_entries),
        "table_entries_after": int(after.get("authpipe_table_entries", 0)),
        "ready_s": round(ready_s, 2),
        "restored_s": round(restored_s, 2) if restored_s else None,
        "probes": probes,
        "probes_decided_with_count_5": sum(1 for c in found.values() if c == 5),
        "correct": correct,
        "ready_and_correct_s": round(max(decided_s, restored_s or decided_s), 2),
    }


# -- entry point ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """Sizes of one run (``--quick`` scales everything down)."""

    b1_events: int
    b1_3m_events: int
    b2_rate_per_s: int
    b2_probes: int
    b2_unsaturated_rate_per_s: int
    b3_events: int
    b3_sources: int
    b3_entry_cap: int
    b6_accounts: int

    @classmethod
    def of(cls, quick: bool) -> Scale:
        if quick:
            return cls(50_000, 150_000, 2_000, 20, 500, 50_000, 5_000, 1_000, 5_000)
        return cls(1_000_000, B1_3M_EVENTS, 10_000, 200, 2_000, 1_000_000, 100_000, 20_000, 100_000)


def prepare_b1(ctx: Context, events: int, seed: int = 7) -> tuple[Names, float]:
    """Create and pre-load the mixed topic of B1 (the peers read the same topic)."""
    names = Names.fresh("b1")
    create_topics(ctx.bootstrap, names, ctx.partitions)
    messages = mixed_events(events, seed, wall_ms() - 60_000)
    return names, preload(ctx.bootstrap, names.input, messages, ctx.partitions)


def run_selected(ctx: Context, scale: Scale, only: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    if "b1" in only:
        names, preload_s = prepare_b1(ctx, scale.b1_events)
        results["b1"] = bench_b1(ctx, names, scale.b1_events) | {"preload_s": round(preload_s, 1)}
    if "b2" in only:
        results["b2"] = bench_b2(ctx, scale.b2_rate_per_s, scale.b2_probes)
    if "b3" in only:
        results["b3"] = bench_b3(ctx, scale.b3_events, scale.b3_sources, scale.b3_entry_cap)
    if "b6" in only:
        results["b6"] = bench_b6(ctx, scale.b6_accounts)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.stream", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--quick", action="store_true", help="scaled down (seconds, not minutes)")
    parser.add_argument("--only", default="b1,b2,b3,b6", help="comma-separated subset")
    parser.add_argument("--b1-events", type=int, help="override the B1 event count")
    parser.add_argument("--load", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--load-fresh", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load:
        bootstrap, topic, rate, duration = args.load
        load_main(bootstrap, topic, int(rate), float(duration), seed=99, fresh=args.load_fresh)
        return 0
    scale = Scale.of(args.quick)
    if args.b1_events:
        scale = Scale(**{**scale.__dict__, "b1_events": args.b1_events})
    workdir = Path(tempfile.mkdtemp(prefix="authpipe-bench-"))
    with broker(args.bootstrap) as bootstrap:
        ctx = Context(bootstrap, workdir)
        try:
            results = run_selected(ctx, scale, set(args.only.split(",")))
        finally:
            ctx.stop_all()
    shutil.rmtree(workdir, ignore_errors=True)
    sys.stdout.write(orjson.dumps(results).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
