"""Replay = live: the demo's scenario through the real broker and worker, then replayed."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.integration.test_sim_pipeline import (
    INGEST_TIMEOUT_S,
    cli,
    live_equals_replay,
    mixed_stream_args,
)
from tests.plugins.settling import wait_for_outputs
from tests.plugins.waiting import wait_until
from tests.plugins.worker import StreamNames, WorkerProcess, start_worker

pytestmark = pytest.mark.integration


def killed_a_third_in(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> tuple[WorkerProcess, Path]:
    """The mixed scenario (2 simulated minutes, unpaced) through a worker SIGKILLed a third
    of the way and restarted from its changelogs, until its outputs settle: the worker
    now running, and the run's truth file."""
    env = {**worker_env, "AUTHPIPE_LOG_LEVEL": "warning"}
    worker = start_worker(workers, worker_env, tmp_path).wait_ready()
    truth = tmp_path / "truth.jsonl"
    done = cli(env, *mixed_stream_args(120, 0, truth))
    assert done.returncode == 0, done.stderr
    produced = len(truth.read_bytes().splitlines())
    assert produced > 15_000
    wait_until(
        lambda: worker.metric("authpipe_events_total") >= produced // 3,
        INGEST_TIMEOUT_S,
        interval_s=0.2,
        description="a third of the events ingested",
    )
    worker.kill()
    restarted = start_worker(workers, worker_env, tmp_path).wait_ready()

    # faust's commits skip holes its rebalance left, so committed offsets alone can say
    # "no lag" while a stage still has messages to apply: ask the worker itself too.
    # Held rows too: rows still waiting for a later mark are not applied yet.
    def caught_up() -> bool:
        return all(
            restarted.metric(name) == 0
            for name in (
                "authpipe_stage_behind_messages",
                "authpipe_ingest_lag_messages",
                "authpipe_reorder_held_rows",
            )
        )

    wait_for_outputs(
        kafka_bootstrap,
        stream_names,
        [stream_names.decisions, stream_names.alerts],
        "the worker caught up, no internal lag, decisions and alerts settled",
        caught_up,
    )
    return restarted, truth


@pytest.mark.timeout(900)
def test_the_demo_scenario_live_equals_its_replay(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """The mixed scenario (2 simulated minutes, unpaced, 8 partitions) through the worker, SIGKILLed
    and restarted a third of the way: its decisions and alerts on the topics equal, record for
    record, those of `backtest` and of `scorecard --engine` over the same events, with nothing
    held or forced and at most 3 rows applied out of order after the restart; those two agree."""
    # The producer writes the past unpaced; on a loaded machine it can stall for longer than
    # the default 0.5 s quiet window mid-millisecond, and a row of that millisecond is then
    # late (docs/stream.md, "The bound"): give it the 2 s a user would give such a producer.
    worker_env = {**worker_env, "AUTHPIPE_WORKER_INPUT_IDLE_MS": "2000"}
    env = {**worker_env, "AUTHPIPE_LOG_LEVEL": "warning"}
    worker, truth = killed_a_third_in(kafka_bootstrap, stream_names, worker_env, workers, tmp_path)
    engine = tmp_path / "engine"
    done = cli(env, "scorecard", "--truth", str(truth), "--engine", "--save-outputs", str(engine))
    assert done.returncode == 0, done.stderr
    diff, live, report = live_equals_replay(env, tmp_path, truth)
    print(report)
    assert "live vs replay: 0 decisions differ" in report
    parity = diff["live_vs_replay"]
    assert parity["decisions"]["live"] >= 5 and parity["alerts"]["live"] >= 50
    reorder = {
        (name, stage): worker.metric(f'authpipe_reorder_{name}_rows{{stage="{stage}"}}')
        for name in ("late", "forced", "held")
        for stage in ("account", "source", "rollup")
    }
    print("reorder", reorder)
    # Nothing held or forced. Late rows: a producer stall longer than the quiet window can
    # still make a row of one millisecond late (logged as stream_rows_late); the outputs
    # above must stay equal whatever happens, and such rows stay this rare.
    assert {v for (name, _), v in reorder.items() if name != "late"} == {0.0}, reorder
    assert sum(v for (name, _), v in reorder.items() if name == "late") <= 3, reorder

    def records(directory: Path, name: str) -> list[bytes]:
        rows = [orjson.loads(line) for line in (directory / name).read_bytes().splitlines()]
        return sorted(orjson.dumps(r["value"]) for r in rows if r["value"] is not None)

    # scorecard --engine and backtest run the same replay: the same records and the same card.
    for name in (
        "decisions.jsonl",
        "alerts.jsonl",
    ):  # live: copies re-sent after the kill are one record
        assert records(engine, name) == sorted(set(records(live, name)))
    baseline = diff["scorecards"]["baseline"]
    engine_card = tmp_path / "engine.json"
    done = cli(env, "scorecard", "--truth", str(truth), "--engine", "--out", str(engine_card))
    assert done.returncode == 0, done.stderr
    assert orjson.loads(engine_card.read_bytes())["attacks"] == baseline["attacks"]
