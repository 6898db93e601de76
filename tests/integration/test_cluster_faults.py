"""Faults of a three-broker cluster under a live stream: the counts stay exact.

One paced stream (the mixed scenario) runs through the worker, the audit sink and the edge,
all on the session's three-node cluster (replication factor 3, min.insync.replicas 2),
while the faults happen one after the other:

1. kill -9 of the broker leading most input and changelog partitions, then restarted;
2. kill -9 of the broker leading most of them then, and SIGKILL of the worker during the
   election that follows (a new worker restores and takes over), the broker restarted.

(A rolling restart is not run here: three broker restarts take over a minute on a
2-core machine, longer than this suite can spend.)

After the stream: the decisions and alerts on the topics equal those of a replay of the
same events (``backtest --live``), the audit's sum of weights in ClickHouse equals the
events produced (nothing lost, nothing doubled), the edge answered every check during the
faults and caught up, and every broker rejoined. Each fault's stall (the longest time in
which the worker's stages processed no row) is printed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.dev.cluster import LocalCluster
from pipeline.settings import ClickHouseSettings
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.migrate import apply_migrations
from tests.integration.test_audit_sink import SinkProcess
from tests.integration.test_sim_pipeline import REPO, cli, live_vs_replay
from tests.plugins.clickhouse import ChHttpEndpoint
from tests.plugins.kafka import free_ports
from tests.plugins.settling import settled, wait_for_outputs
from tests.plugins.waiting import wait_until
from tests.plugins.worker import StreamNames, WorkerProcess, start_worker

pytestmark = pytest.mark.integration

TOKEN = "cluster-fault-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# A broker's death is noticed after broker.session.timeout.ms (9 s): an input partition it
# led gets nothing meanwhile. The worker must not release the others past it (their rows
# would overtake its rows, which a replay keeps in order), so it waits longer than that.
INPUT_IDLE_MS = 15_000
REJOIN_TIMEOUT_S = 90.0
SAMPLE_S = 0.2


@pytest.fixture
def worker_env(
    kafka_cluster: LocalCluster, stream_names: StreamNames, tmp_path: Path
) -> dict[str, str]:
    """The worker's environment on the cluster: replicated topics, this test's names."""
    return {
        **stream_names.env(),
        "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": kafka_cluster.bootstrap,
        "AUTHPIPE_KAFKA_PARTITIONS": "4",
        "AUTHPIPE_KAFKA_REPLICATION_FACTOR": "3",
        "AUTHPIPE_KAFKA_MIN_INSYNC_REPLICAS": "2",
        "AUTHPIPE_STATE_DIR": str(tmp_path / "state"),
        "AUTHPIPE_LOG_FORMAT": "json",
        "AUTHPIPE_LOG_LEVEL": "warning",
        "AUTHPIPE_WORKER_INPUT_IDLE_MS": str(INPUT_IDLE_MS),
    }


def edge_check(base: str) -> int:
    """The status of one check at the edge (0: no answer)."""
    request = urllib.request.Request(f"{base}/v1/check?account=probe&ip=10.9.9.9", headers=AUTH)
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def edge_metric(base: str, name: str) -> float | None:
    request = urllib.request.Request(f"{base}/metrics", headers=AUTH)
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    return sum(values) if values else None


@pytest.fixture
def edge(worker_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """``authpipe edge serve`` on the cluster; its base URL once ready."""
    (port,) = free_ports(1)
    env = {**os.environ, **worker_env, "AUTHPIPE_EDGE_TOKEN": TOKEN, "AUTHPIPE_LOG_LEVEL": "info"}
    with (tmp_path / "edge.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "edge", "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        yield base
    finally:
        process.kill()
        process.wait(15)


@pytest.fixture
def sink_processes() -> Iterator[list[SinkProcess]]:
    """A list to start sinks into; any still running is killed at teardown."""
    started: list[SinkProcess] = []
    yield started
    for sink in started:
        if sink.process is not None and sink.process.poll() is None:
            sink.process.kill()
            sink.process.wait(30)


@dataclass
class Sampler:
    """Samples, every SAMPLE_S in a thread, the current worker's processed rows and the
    edge's answer to a check."""

    rows: Callable[[], float]
    base: str
    samples: list[tuple[float, float]] = field(default_factory=list)
    edge_failures: list[tuple[float, int]] = field(default_factory=list)
    checks: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            with contextlib.suppress(OSError):  # the worker is being replaced
                self.samples.append((now, self.rows()))
            status = edge_check(self.base)
            self.checks += 1
            if status != 200:
                self.edge_failures.append((now, status))
            self._stop.wait(SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()

    def stall_s(self, since: float, until: float) -> float:
        """The longest time between ``since`` and ``until`` in which the rows did not grow
        (a new worker counts from zero: any growth of its own counts)."""
        points = [(t, v) for t, v in self.samples if since <= t <= until]
        longest, last_t, last_v = 0.0, since, None
        for t, v in points:
            if last_v is None or v > last_v or v < last_v:
                longest = max(longest, t - last_t)
                last_t = t
            last_v = v
        return round(max(longest, (points[-1][0] if points else until) - last_t), 1)


def leader_of_most(cluster: LocalCluster, topics: list[str]) -> int:
    """The node leading most partitions of ``topics`` now."""
    counts = cluster.leader_counts(topics)
    return max(sorted(counts), key=lambda node: counts[node])


def wait_rejoined(cluster: LocalCluster) -> float:
    """Seconds until every node runs and no partition is under-replicated."""
    started = time.monotonic()
    wait_until(
        lambda: (
            len(cluster.running()) == len(cluster.nodes)
            and not any(p.under_replicated for p in cluster.partitions())
        ),
        REJOIN_TIMEOUT_S,
        interval_s=0.5,
        description="every broker back and no partition under-replicated",
    )
    return round(time.monotonic() - started, 1)


def wait_led_elsewhere(cluster: LocalCluster, topics: list[str], victim: int) -> None:
    """Until every partition of ``topics`` has a leader other than ``victim``."""

    def moved() -> bool:
        leaders = set(cluster.leader_counts(topics))
        return bool(leaders) and not leaders & {victim, -1}

    wait_until(
        moved,
        REJOIN_TIMEOUT_S,
        interval_s=0.2,
        description=f"partitions led by node {victim} moved to another node",
    )


def wait_rows_grow(worker: WorkerProcess, timeout_s: float = 120.0) -> None:
    """Until the worker's stages process rows again."""
    start = worker.metric("authpipe_stage_rows_total")
    wait_until(
        lambda: worker.metric("authpipe_stage_rows_total") > start,
        timeout_s,
        interval_s=SAMPLE_S,
        description="the worker processing rows again",
    )


@pytest.mark.timeout(600)
def test_broker_kill_and_worker_kill_in_an_election_lose_and_double_nothing(
    kafka_cluster: LocalCluster,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[WorkerProcess],
    chhttp: ChHttpEndpoint,
    edge: str,
    sink_processes: list[SinkProcess],
    tmp_path: Path,
) -> None:
    """kill -9 of the leading broker, then kill -9 of a broker plus SIGKILL of the worker
    during the election, under one paced stream: decisions and alerts
    equal the replay's, sum(weight) in ClickHouse equals the events produced, the edge
    answered every check, every broker rejoined with nothing under-replicated."""
    cluster = kafka_cluster
    ch_settings = ClickHouseSettings(url=chhttp.url, path=tmp_path / "chdb")
    with open_clickhouse(ch_settings, create_database=True) as handle:
        apply_migrations(handle, ch_settings)
    sink = SinkProcess(
        {
            **worker_env,
            "AUTHPIPE_CLICKHOUSE_URL": chhttp.url,
            "AUTHPIPE_AUDIT_FLUSH_INTERVAL_MS": "200",
            "AUTHPIPE_LOG_LEVEL": "info",
        },
        tmp_path,
        tmp_path / "sink.log",
    )
    sink_processes.append(sink)
    current: list[WorkerProcess] = [start_worker(workers, worker_env, tmp_path).wait_ready()]
    sink.start()
    wait_until(lambda: edge_check(edge) == 200, 90, interval_s=0.2, description="edge ready")
    truth = tmp_path / "truth.jsonl"
    sim_log = (tmp_path / "simulate.log").open("wb")
    stream = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "simulate",
            "--scenario",
            "mixed",
            "--rate",
            "5",
            "--duration-s",
            "150",
            "--seed",
            "11",
            "--speedup",
            "2",
            "--truth",
            str(truth),
        ],
        cwd=REPO,
        env={**os.environ, **worker_env},
        stdout=sim_log,
        stderr=subprocess.STDOUT,
    )
    sampler = Sampler(lambda: current[0].metric("authpipe_stage_rows_total"), edge)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    watched = [stream_names.input] + [
        f"{stream_names.app_id}-{t}-changelog"
        for t in ("account-state", "source-state", "rollup-state")
    ]
    figures: dict[str, float] = {}
    try:
        wait_until(
            lambda: current[0].metric("authpipe_events_total") >= 2000,
            120,
            interval_s=0.2,
            description="the stream flowing",
        )

        # 1. kill -9 of the broker leading most input and changelog partitions.
        victim = leader_of_most(cluster, watched)
        killed_at = time.monotonic()
        cluster.node(victim).kill()
        wait_led_elsewhere(cluster, watched, victim)
        wait_rows_grow(current[0])
        figures["broker_kill_stall_s"] = sampler.stall_s(killed_at, time.monotonic())
        restarted_at = time.monotonic()
        cluster.node(victim).up()
        wait_rejoined(cluster)
        figures["broker_kill_rejoin_s"] = round(time.monotonic() - restarted_at, 1)

        # 2. kill -9 of a broker, and SIGKILL of the worker during its election.
        victim = leader_of_most(cluster, watched)
        killed_at = time.monotonic()
        cluster.node(victim).kill()
        current[0].kill()
        current[0] = start_worker(workers, worker_env, tmp_path).wait_ready()
        wait_led_elsewhere(cluster, watched, victim)
        wait_rows_grow(current[0])
        figures["worker_kill_in_election_stall_s"] = sampler.stall_s(killed_at, time.monotonic())
        restarted_at = time.monotonic()
        cluster.node(victim).start()  # rejoins while the stream ends (checked below)

        figures["stream_running_after_faults"] = float(stream.poll() is None)
        assert stream.wait(timeout=400) == 0, (tmp_path / "simulate.log").read_text()[-2000:]
    finally:
        sampler.stop()
        thread.join(10)
        if stream.poll() is None:
            stream.kill()
    wait_rejoined(cluster)
    figures["worker_kill_rejoin_s"] = round(time.monotonic() - restarted_at, 1)
    print("cluster fault figures", figures, "edge checks", sampler.checks)
    produced = len(truth.read_bytes().splitlines())
    worker = current[0]
    outputs = [stream_names.decisions, stream_names.alerts]
    wait_for_outputs(
        cluster.bootstrap,
        stream_names,
        outputs,
        "the worker caught up after the faults",
        lambda: all(
            worker.metric(name) == 0
            for name in (
                "authpipe_stage_behind_messages",
                "authpipe_ingest_lag_messages",
                "authpipe_reorder_held_rows",
            )
        ),
    )
    assert sampler.edge_failures == [], sampler.edge_failures
    wait_until(
        lambda: edge_metric(edge, "authpipe_edge_lag_messages") == 0,
        60,
        interval_s=0.5,
        description="the edge caught up",
    )

    def audited() -> tuple[int, int]:
        with open_clickhouse(ch_settings) as handle:
            row = handle.query("SELECT toInt64(sum(weight)), uniqExact(event_id) FROM attempts")[0]
        return int(row[0]), int(row[1])

    wait_until(
        lambda: audited()[0] >= produced,
        120,
        interval_s=1.0,
        description="the audit has every event",
    )
    # A doubled batch would land within the sink's flush interval: wait for it to settle.
    wait_until(settled(audited, 3.0), 60, interval_s=0.5, description="the audit settled")
    assert audited()[0] == produced, (audited(), produced)
    sink.stop()

    live = tmp_path / "live"
    env = {**worker_env, "AUTHPIPE_LOG_LEVEL": "warning"}
    done = cli(
        env,
        "scorecard",
        "--truth",
        str(truth),
        "--decisions-from-topic",
        "--save-outputs",
        str(live),
    )
    assert done.returncode == 0, done.stderr
    diff, _ = live_vs_replay(env, tmp_path, truth, live)
    parity = diff["live_vs_replay"]
    print("parity", {k: parity[k]["live"] for k in ("decisions", "alerts")}, "produced", produced)
    assert (parity["decisions"]["only_live"], parity["decisions"]["only_replay"]) == ([], [])
    assert (parity["alerts"]["only_live"], parity["alerts"]["only_replay"]) == ([], [])
    assert parity["decisions"]["live"] >= 5 and parity["alerts"]["live"] >= 50
