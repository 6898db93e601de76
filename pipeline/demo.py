"""``authpipe demo``: the main job, end to end on the local stack.

Starts the broker (``stack up``), migrates embedded ClickHouse, starts the worker, the
audit sink and the edge as subprocesses (each the same command a user would run), plays
a day of the patient attackers (``low_and_slow_bruteforce`` and its 13-source variant),
then an hour of the deployment's ordinary past (``simulate --history-s``: the warm start
docs/operations.md asks of a new deployment, so people's places are familiar when the
first wave comes) and a mixed attack scenario through them with ``authpipe simulate``, waits until every event
is counted or dead-lettered, then prints the scorecard, writes ``report.html`` and says
where to look next. Each run uses its own topics and consumer groups (named in the
output), so runs never mix; the broker keeps running afterwards for exploration
(``authpipe stack down`` stops it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.clock import wall_ms
from pipeline.demo_services import DemoError, Service, wait_on
from pipeline.dev.stack import LocalKafka
from pipeline.logs import get_logger
from pipeline.settings import Settings, ensure_digest_key_file
from pipeline.sim.demo_notes import blocklist_note, load_source_decisions
from pipeline.sim.scenarios import SLOW_ATTACKS

log = get_logger("demo")

READY_TIMEOUT_S = 120.0
PATIENT_DAY_S = 86_400


@dataclass(frozen=True)
class DemoOptions:
    rate: float = 25.0
    duration_s: float = 3600.0
    history_s: float = 3600.0
    """Ordinary traffic before the mixed run (0: a cold start, no familiar places)."""
    seed: int = 1
    out: Path = Path("report.html")
    keep_services: bool = False


def _rfc3339(epoch_ms: int) -> str:
    from pipeline.contracts.models import format_utc_ms, ms_to_datetime

    return format_utc_ms(ms_to_datetime(epoch_ms))


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name)
        and (line.split(" ")[0] == name or (not name.endswith("}") and line.startswith(name + "{")))
    )


def _run(args: list[str], env: dict[str, str], log_dir: Path, name: str) -> str:
    """Run an ``authpipe`` command to completion; its output is returned and logged."""
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], env=env, capture_output=True, text=True
    )
    (log_dir / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise DemoError(
            f"authpipe {' '.join(args[:2])} failed (exit {done.returncode}):\n"
            f"{(done.stderr or done.stdout)[-2000:]}"
        )
    return done.stdout


def _run_showing_progress(
    args: list[str], env: dict[str, str], log_dir: Path, name: str, say: Callable[[str], None]
) -> str:
    """Like ``_run``, and passes the command's progress lines (``<name>: N % ...`` on stderr,
    see pipeline.progress) to ``say`` as they come."""
    log_path = log_dir / f"{name}.log"
    with log_path.open("w") as log_file, (log_dir / f"{name}.out").open("w+") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", *args],
            env=env,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        for line in proc.stderr:
            log_file.write(line)
            if line.startswith(f"{name}: "):
                say(line.rstrip())
        code = proc.wait()
        out.seek(0)
        stdout = out.read()
        log_file.write(stdout)
    if code != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        raise DemoError(
            f"authpipe {' '.join(args[:2])} failed (exit {code}); its log is {log_path}:\n{tail}"
        )
    return stdout


def _env(settings: Settings, run_id: str, bootstrap: str) -> dict[str, str]:
    state = settings.state_dir.resolve()
    return {
        **os.environ,
        "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "AUTHPIPE_KAFKA_APP_ID": run_id,
        "AUTHPIPE_KAFKA_INPUT_TOPIC": f"{run_id}.login-attempts",
        "AUTHPIPE_KAFKA_DECISIONS_TOPIC": f"{run_id}.throttle-decisions",
        "AUTHPIPE_KAFKA_ALERTS_TOPIC": f"{run_id}.alerts",
        "AUTHPIPE_KAFKA_NOTICES_TOPIC": f"{run_id}.account-notices",
        "AUTHPIPE_KAFKA_DLQ_TOPIC": f"{run_id}.login-attempts.dlq",
        "AUTHPIPE_KAFKA_AUDIT_TOPIC": f"{run_id}.audit",
        "AUTHPIPE_STATE_DIR": str(state),
        "AUTHPIPE_CLICKHOUSE_PATH": str(state / "chdb"),
        "AUTHPIPE_LOG_FORMAT": "json",
    }


def run_demo(settings: Settings, options: DemoOptions) -> int:
    started = time.monotonic()
    run_id = "demo-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    demo_dir = (settings.state_dir / "demo" / run_id).resolve()
    demo_dir.mkdir(parents=True, exist_ok=True)
    say = _printer(started)

    broker = LocalKafka.from_settings(settings)
    say(f"starting the Kafka broker ({broker.bootstrap}, data in {broker.data_dir})")
    broker.up()
    if settings.identity.digest_key is None:
        say(
            f"account digests keyed by {ensure_digest_key_file(settings.state_dir)} (generated once)"
        )
    env = _env(settings, run_id, broker.bootstrap)
    say("migrating embedded ClickHouse (chdb)")
    _run(["clickhouse", "migrate"], env, demo_dir, "migrate")

    services: list[Service] = []
    try:
        worker, edge = _start_services(settings, env, demo_dir, services, say)
        truth = demo_dir / "truth.jsonl"
        port = int(env["AUTHPIPE_WORKER_WEB_PORT"])
        # The patient attackers first: their day of event time ends where the mixed run's
        # history begins, so the watermark only moves forward and one truth file holds all.
        patient_truth = demo_dir / "truth-patient.jsonl"
        history_s = int(options.history_s)
        start_ms = (int(time.time()) - int(options.duration_s) - history_s - PATIENT_DAY_S) * 1000
        say(
            f"simulating patient attackers ({', '.join(SLOW_ATTACKS)}): a day of event time, "
            "replayed as fast as the broker takes it"
        )
        _show(
            _run_showing_progress(
                [
                    "simulate",
                    "--scenario",
                    ",".join(SLOW_ATTACKS),
                    "--rate",
                    "1",
                    "--duration-s",
                    str(PATIENT_DAY_S),
                    "--seed",
                    str(options.seed),
                    "--speedup",
                    "0",
                    "--start",
                    _rfc3339(start_ms),
                    "--truth",
                    str(patient_truth),
                ],
                env,
                demo_dir,
                "simulate-patient",
                say,
            )
        )
        patient = sum(1 for _ in patient_truth.open("rb"))
        wait_on(
            lambda: _drained(port, patient),
            900,
            worker,
            "every patient attempt through every stage",
        )
        mixed_truth = demo_dir / "truth-mixed.jsonl"
        say(
            f"simulating a mixed attack scenario ({options.duration_s:g} s of traffic at "
            f"{options.rate:g} logins/s after {history_s} s of ordinary history, replayed as "
            "fast as the broker takes it)"
        )
        _show(
            _run_showing_progress(
                [
                    "simulate",
                    "--scenario",
                    "mixed",
                    "--rate",
                    str(options.rate),
                    "--duration-s",
                    str(options.duration_s),
                    "--history-s",
                    str(history_s),
                    "--seed",
                    str(options.seed),
                    "--speedup",
                    "0",
                    "--truth",
                    str(mixed_truth),
                ],
                env,
                demo_dir,
                "simulate",
                say,
            )
        )
        truth.write_bytes(patient_truth.read_bytes() + mixed_truth.read_bytes())
        produced = sum(1 for _ in truth.open("rb"))
        say(f"waiting for the worker to count all {produced} events")
        wait_on(lambda: _drained(port, produced), 900, worker, "every event through every stage")
        wait_on(_quiet_checker(port), 60, worker, "the stages to settle")
        say("scoring the decisions on the topic against the ground truth")
        _show(
            _run(
                [
                    "scorecard",
                    "--truth",
                    str(truth),
                    "--decisions-from-topic",
                    "--out",
                    str(demo_dir / "scorecard.json"),
                    "--save-outputs",
                    str(demo_dir),
                ],
                env,
                demo_dir,
                "scorecard",
            )
        )
        _show_blocklist(edge, env, demo_dir / "decisions.jsonl")
        _run(
            [
                "report",
                "--out",
                str(options.out.resolve()),
                "--truth",
                str(truth),
                "--decisions",
                str(demo_dir / "decisions.jsonl"),
                "--alerts",
                str(demo_dir / "alerts.jsonl"),
                "--scorecard",
                str(demo_dir / "scorecard.json"),
                "--title",
                f"authpipe demo {run_id}",
            ],
            env,
            demo_dir,
            "report",
        )
        say(f"wrote {options.out.resolve()}")
        if options.keep_services:
            say("services keep running (Ctrl-C stops them)")
            _hold(services)
    finally:
        for service in reversed(services):
            service.stop()
    _audit_summary(settings, env, run_id)
    _where_next(options, demo_dir, run_id, started)
    return 0


def _start_services(
    settings: Settings,
    env: dict[str, str],
    demo_dir: Path,
    services: list[Service],
    say: Callable[[str], None],
) -> tuple[Service, Service]:
    import asyncio

    from pipeline.stream.worker import prepare_topics

    ports = _free_ports(2)
    env["AUTHPIPE_WORKER_WEB_PORT"] = str(ports[0])
    env["AUTHPIPE_EDGE_PORT"] = str(ports[1])
    topic_settings = settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(
                update={
                    "bootstrap_servers": env["AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS"],
                    "app_id": env["AUTHPIPE_KAFKA_APP_ID"],
                    "input_topic": env["AUTHPIPE_KAFKA_INPUT_TOPIC"],
                    "decisions_topic": env["AUTHPIPE_KAFKA_DECISIONS_TOPIC"],
                    "alerts_topic": env["AUTHPIPE_KAFKA_ALERTS_TOPIC"],
                    "dlq_topic": env["AUTHPIPE_KAFKA_DLQ_TOPIC"],
                    "audit_topic": env["AUTHPIPE_KAFKA_AUDIT_TOPIC"],
                    "notices_topic": env["AUTHPIPE_KAFKA_NOTICES_TOPIC"],
                }
            )
        }
    )
    asyncio.run(prepare_topics(topic_settings))
    say(f"starting the worker, the audit sink and the edge (logs in {demo_dir})")
    worker = Service("worker", ["worker"], env, demo_dir)
    services.append(worker)
    services.append(Service("sink", ["sink"], env, demo_dir))
    edge = Service("edge", ["edge", "serve", "--port", str(ports[1])], env, demo_dir)
    services.append(edge)
    wait_on(
        lambda: _http_ok(f"http://127.0.0.1:{ports[0]}/readyz"), READY_TIMEOUT_S, worker, "ready"
    )
    wait_on(lambda: _http_ok(f"http://127.0.0.1:{ports[1]}/readyz"), READY_TIMEOUT_S, edge, "ready")
    say(
        f"worker ready (metrics http://127.0.0.1:{ports[0]}/metrics), "
        f"edge ready (http://127.0.0.1:{ports[1]}/v1/check)"
    )
    return worker, edge


def _drained(port: int, produced: int) -> bool:
    """Every produced event ingested (counted or dead-lettered), every valid one through the
    account stage, and every forwarded failure through the source stage."""
    valid = _metric(port, "authpipe_events_total")
    if valid + _metric(port, "authpipe_dead_letters_total") < produced:
        return False
    rows = _metric(port, 'authpipe_stage_rows_total{stage="account"}')
    forwarded = _metric(port, "authpipe_forwarded_total")
    return rows >= valid and _metric(port, 'authpipe_stage_rows_total{stage="source"}') >= forwarded


def _quiet_checker(port: int, polls: int = 8) -> Callable[[], bool]:
    """A predicate: true once the stages' row counter stood still for ``polls`` polls (2 s)."""
    seen: list[float] = []

    def quiet() -> bool:
        seen.append(_metric(port, "authpipe_stage_rows_total"))
        return len(seen) >= polls and len(set(seen[-polls:])) == 1

    return quiet


def _show_blocklist(edge: Service, env: dict[str, str], decisions: Path) -> None:
    url = f"http://127.0.0.1:{env['AUTHPIPE_EDGE_PORT']}/v1/blocklist?format=text&include=observe"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            lines = response.read().decode().splitlines()
    except OSError as exc:
        raise edge.failed(f"did not serve the block-list ({exc})") from exc
    listed = [line for line in lines if line and not line.startswith("#")]
    print(f"\nblock-list feed ({url}): {len(listed)} source(s) listed now")
    for line in listed[:10]:
        print(f"  {line}")
    for line in blocklist_note(load_source_decisions(decisions), len(listed), wall_ms()):
        print(textwrap.fill(line, 98, initial_indent="  ", subsequent_indent="  "))


def _show(output: str) -> None:
    print(output.rstrip("\n"), flush=True)


def _audit_summary(settings: Settings, env: dict[str, str], run_id: str) -> None:
    from pipeline.sinks.connect import open_clickhouse

    chs = settings.clickhouse.model_copy(update={"path": Path(env["AUTHPIPE_CLICKHOUSE_PATH"])})
    with open_clickhouse(chs) as ch:
        rows = ch.query(
            "SELECT count(), sum(weight), countIf(summary), countIf(decision = 'block') "
            "FROM attempts WHERE kafka_topic = {topic:String}",
            {"topic": env["AUTHPIPE_KAFKA_INPUT_TOPIC"]},
        )
        decisions = ch.query("SELECT count() FROM decisions WHERE NOT tombstone")
    count, weight, summaries, blocked = rows[0]
    print(
        f"\nClickHouse (embedded, {chs.path}): {count} audit rows standing for {weight} attempts "
        f"({summaries} rate-cap summary rows, {blocked} attempts under a block); "
        f"{decisions[0][0]} decision rows in total"
    )


def _where_next(options: DemoOptions, demo_dir: Path, run_id: str, started: float) -> None:
    print(f"""
done in {time.monotonic() - started:.0f} s. Where to look next:
  report            {options.out.resolve()}  (open it in a browser)
  scorecard         {demo_dir / "scorecard.json"}
  decisions/alerts  {demo_dir / "decisions.jsonl"}, {demo_dir / "alerts.jsonl"}
  service logs      {demo_dir}/{{worker,sink,edge}}.log
  topics            {run_id}.login-attempts, {run_id}.throttle-decisions, {run_id}.alerts, ...
  try a stricter policy on the same history (and check the replay equals this live run):
    .venv/bin/authpipe backtest --policy schemas/policy.strict.toml --events {demo_dir / "truth.jsonl"} \
      --truth {demo_dir / "truth.jsonl"} --live {demo_dir}
  the edge on this run's decisions (its topic, not the default auth.throttle-decisions):
    AUTHPIPE_KAFKA_DECISIONS_TOPIC={run_id}.throttle-decisions .venv/bin/authpipe edge serve
  the broker keeps running: .venv/bin/authpipe stack status | stack down
""")


def _hold(services: list[Service]) -> None:
    try:
        while all(s.alive() for s in services):
            time.sleep(1)
    except KeyboardInterrupt:
        return


def _printer(started: float) -> Callable[[str], None]:
    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:5.0f}s] {message}", flush=True)

    return say


def _free_ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
