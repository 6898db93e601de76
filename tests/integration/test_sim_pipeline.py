"""The simulator, the real worker and the scorecard together on the real broker."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from tests.plugins.settling import end_offsets, wait_for_outputs
from tests.plugins.waiting import wait_until
from tests.plugins.worker import StreamNames, WorkerProcess, start_worker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
INGEST_TIMEOUT_S = 480.0  # generous: the 2-core CI machine is shared


def cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *argv],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def mixed_stream_args(duration_s: int, speedup: int, truth: Path) -> list[str]:
    """``simulate`` of the mixed scenario the parity tests replay (rate 5, seed 11):
    ``duration_s`` simulated seconds produced at ``speedup`` (0: unpaced), truth in ``truth``."""
    return [
        "simulate",
        "--scenario",
        "mixed",
        "--rate",
        "5",
        "--duration-s",
        str(duration_s),
        "--seed",
        "11",
        "--speedup",
        str(speedup),
        "--truth",
        str(truth),
    ]


def live_vs_replay(
    env: dict[str, str], tmp_path: Path, truth: Path, live: Path
) -> tuple[dict[str, Any], str]:
    """``backtest`` of the run's events under the default policy against the live outputs
    saved in ``live``: its diff (``live_vs_replay`` among it) and its printed report."""
    policy = tmp_path / "same.toml"
    policy.write_text('policy_version = "default-1"\n')
    diff_path = tmp_path / "diff.json"
    done = cli(
        env,
        "backtest",
        "--policy",
        str(policy),
        "--events",
        str(truth),
        "--truth",
        str(truth),
        "--live",
        str(live),
        "--out",
        str(diff_path),
    )
    assert done.returncode == 0, done.stderr
    diff: dict[str, Any] = orjson.loads(diff_path.read_bytes())
    return diff, done.stdout


def live_equals_replay(
    env: dict[str, str], tmp_path: Path, truth: Path
) -> tuple[dict[str, Any], Path, str]:
    """The run's decisions and alerts read from the topics (``scorecard --save-outputs``)
    against ``backtest``'s replay of the same events (``live_vs_replay``): asserts that
    none differs; the diff, where the live ones were saved, and the printed report."""
    live = tmp_path / "live"
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
    diff, report = live_vs_replay(env, tmp_path, truth, live)
    parity = diff["live_vs_replay"]
    assert (parity["decisions"]["only_live"], parity["decisions"]["only_replay"]) == ([], [])
    assert (parity["alerts"]["only_live"], parity["alerts"]["only_replay"]) == ([], [])
    return diff, live, report


def consumer_groups(bootstrap: str) -> set[str]:
    async def run() -> set[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return {group[0] for group in await admin.list_consumer_groups()}
        finally:
            await admin.close()

    return asyncio.run(run())


def simulate_and_settle(
    env: dict[str, str],
    worker: WorkerProcess,
    kafka_bootstrap: str,
    stream_names: StreamNames,
    truth: Path,
    *scenario_args: str,
) -> int:
    """Produce a simulated run unpaced, wait until the worker ingested all of it and its
    decisions and alerts settled; returns the number of events produced."""
    done = cli(env, "simulate", *scenario_args, "--speedup", "0", "--truth", str(truth))
    assert done.returncode == 0, done.stderr
    produced = len(truth.read_bytes().splitlines())
    wait_until(
        lambda: worker.metric("authpipe_events_total") >= produced,
        INGEST_TIMEOUT_S,
        interval_s=1.0,
        description=f"the worker to ingest {produced} events",
    )
    outputs = [stream_names.decisions, stream_names.alerts]
    try:
        wait_for_outputs(
            kafka_bootstrap,
            stream_names,
            outputs,
            "no internal lag and decisions and alerts settled",
        )
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}\nthe worker's log ends:\n{worker.log_tail()}") from None
    return produced


@pytest.mark.timeout(1200)
def test_mixed_run_through_the_worker_catches_every_attack_and_refuses_nobody(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """A 5-minute mixed run produced unpaced into fresh topics, decided by the real worker: once
    its outputs settle, the scorecard from the topics shows every attack stopped or detected and
    zero legitimate attempts refused."""
    env = {**worker_env, "AUTHPIPE_LOG_LEVEL": "warning"}
    worker = start_worker(workers, worker_env, tmp_path).wait_ready()
    truth = tmp_path / "truth.jsonl"
    produced = simulate_and_settle(
        env,
        worker,
        kafka_bootstrap,
        stream_names,
        truth,
        *("--scenario", "mixed", "--rate", "5", "--duration-s", "300", "--seed", "11"),
    )
    assert produced > 15_000
    outputs = [stream_names.decisions, stream_names.alerts]

    card_path = tmp_path / "card.json"
    done = cli(
        env, "scorecard", "--truth", str(truth), "--decisions-from-topic", "--out", str(card_path)
    )
    assert done.returncode == 0, done.stderr
    print(done.stdout)  # the scorecard table, shown with pytest -s
    card = orjson.loads(card_path.read_bytes())
    statuses = {a["attack"]: a["status"] for a in card["attacks"]}
    assert statuses == {
        "brute_force": "stopped",
        "distributed_brute_force": "stopped",
        "lockout_dos": "stopped",
        "uia_bruteforce": "stopped",
        # Stuffing and spray are answered by the tenant's wave challenge (issue 24); the
        # seed 002 lock refuses what guesses one account.
        "spray": statuses["spray"],
        # Paced under every per-source threshold (spray stays signal-only, seed 001). In
        # this cold 5-minute run it is most of acme's traffic from acme's first window, so
        # it is near the median rule 8's paced sum compares with: depending on where the
        # run's 10-second windows fall, the wave comes about a minute in ("slowed") or not
        # at all ("detected_only", alerted by stuffing_tenant); with history (the demo's
        # hour) rule 8 answers it.
        "low_and_slow_spray": statuses["low_and_slow_spray"],
        "credential_stuffing": statuses["credential_stuffing"],
    }, done.stdout
    attacks = {a["attack"]: a for a in card["attacks"]}
    # Stuffing: no takeover. Its status is "stopped" or "slowed": the simulator's events
    # are unenforced, so the proxies' valid-credential successes make them known places
    # (a step-up, shown only after a correct password), and the wrong passwords tried
    # there count as let through (this run packs 4,200 attempts into 105 s).
    assert statuses["credential_stuffing"] in ("stopped", "slowed")
    assert attacks["credential_stuffing"]["account_takeovers"] == 0
    assert attacks["credential_stuffing"]["challenged"] > 0
    # Spray: the engine lets 8 % through after the response (stopped); read back from the
    # topics, where records carry no event positions and the 2-minute wave holds start and
    # end by their times, one CI run let 12 % through (slowed). Either way: no takeover.
    assert statuses["spray"] in ("stopped", "slowed")
    assert attacks["spray"]["account_takeovers"] == 0
    assert attacks["spray"]["challenged"] > 0
    assert statuses["low_and_slow_spray"] in ("slowed", "detected_only")
    assert attacks["low_and_slow_spray"]["account_takeovers"] == 0
    assert "stuffing_tenant" in attacks["low_and_slow_spray"]["alerts"]
    # No source is blocked for stuffing or spray: only the seed 002 lock refuses.
    for name in ("credential_stuffing", "low_and_slow_spray", "spray"):
        assert set(attacks[name]["blocks"]) <= {"lockout", "account_source", "account"}, name
    assert card["all_attacks_caught"] is True
    assert card["legitimate"]["refused"] == 0, card["legitimate"]["examples"]
    assert card["legitimate"]["by_cohort"]["owner_trusted_device"] == {
        "attempts": 26,
        "refused": 0,
        "challenged": 0,
    }
    assert card["blocks_matching_no_attack"] == []

    # The backtest reads the same run back from the input topic by event time, with no
    # consumer group and no write to the decision topic (the worker is stopped first, so
    # nothing else writes there either).
    worker.stop()
    first = orjson.loads(truth.read_bytes().split(b"\n", 1)[0])["event"]["occurred_at"]
    policy = tmp_path / "ceiling-10.toml"
    policy.write_text('policy_version = "ceiling-10"\n[defaults.account]\nthreshold = 10\n')
    groups, decided = consumer_groups(kafka_bootstrap), end_offsets(kafka_bootstrap, outputs)
    diff_path = tmp_path / "diff.json"
    done = cli(
        env,
        "backtest",
        "--policy",
        str(policy),
        "--from-ts",
        first,
        "--truth",
        str(truth),
        "--out",
        str(diff_path),
    )
    assert done.returncode == 0, done.stderr
    diff = orjson.loads(diff_path.read_bytes())
    assert (diff["events"], diff["invalid_events"]) == (produced, 0)
    base = diff["scorecards"]["baseline"]
    assert base["all_attacks_caught"] is True and base["legitimate"]["refused"] == 0
    assert diff["decisions"]["added_by_rule"].get("account", 0) >= 1
    assert consumer_groups(kafka_bootstrap) == groups
    assert end_offsets(kafka_bootstrap, outputs) == decided


HOLDOUT_ATTACKS = (
    "mfa_code_guessing",
    "second_wave",
    "spray_pool",
    "stuffing_bursts",
    "stuffing_own_account",
    "stuffing_paced",
    "stuffing_pool_once",
    "stuffing_pool_twice",
)


@pytest.mark.timeout(1200)
def test_holdout_through_the_worker_scores_as_the_engine_does(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """The held-out shapes of issue 24, compressed into 15 minutes after 15 minutes of
    history, through the real worker: the scorecard from the topics equals the core
    engine's on the same events (per attack: status, takeovers, challenged; legitimate
    refused, challenged during waves; sessions stepped up after sign-in within 1 in 1,000);
    no stuffing,
    spray or own-account takeover (a wave's lead-in included: those sessions are stepped
    up), no legitimate refusal, no office colleague challenged. The strangers tier learns
    for 10 minutes here, not the default 20: the compressed run's paced stuffer starts
    about 16 minutes after the first event."""
    policy = tmp_path / "policy.toml"
    policy.write_text("[defaults.strangers]\nmin_history_ms = 600000\n")
    worker_env = {**worker_env, "AUTHPIPE_POLICY_PATH": str(policy)}
    env = {**worker_env, "AUTHPIPE_LOG_LEVEL": "warning"}
    worker = start_worker(workers, worker_env, tmp_path).wait_ready()
    truth = tmp_path / "truth.jsonl"
    simulate_and_settle(
        env,
        worker,
        kafka_bootstrap,
        stream_names,
        truth,
        *("--scenario", "baseline,holdout", "--rate", "5", "--duration-s", "900"),
        *("--history-s", "900", "--seed", "11"),
    )
    cards = {}
    for origin, flag in (("topics", "--decisions-from-topic"), ("engine", "--engine")):
        path = tmp_path / f"{origin}.json"
        done = cli(env, "scorecard", "--truth", str(truth), flag, "--out", str(path))
        assert done.returncode == 0, done.stderr
        print(done.stdout)  # the scorecard table, shown with pytest -s
        cards[origin] = orjson.loads(path.read_bytes())

    def figures(card: dict[str, object]) -> dict[str, object]:
        attacks = card["attacks"]
        assert isinstance(attacks, list)
        legit = card["legitimate"]
        assert isinstance(legit, dict)
        return {
            "attacks": {
                a["attack"]: (a["status"], a["account_takeovers"], a["stepped_up_after_sign_in"])
                for a in attacks
            },
            "legit": (legit["refused"], legit["untrusted_during_waves"]),
        }

    def challenged(card: dict[str, object]) -> dict[str, int]:
        attacks = card["attacks"]
        assert isinstance(attacks, list)
        return {a["attack"]: a["challenged"] for a in attacks}

    live, engine = figures(cards["topics"]), figures(cards["engine"])
    assert live == engine
    # The topic's records carry no event positions: the replay places each by its times,
    # so an attempt in the same millisecond as a wave's issue may fall either side (1 of
    # 4,385 in this run). The decision records themselves are test_replay_parity's.
    for name, n in challenged(cards["engine"]).items():
        assert abs(challenged(cards["topics"])[name] - n) <= max(1, n // 1000), name
    # Sessions reviewed against a wave record: the same placement by time (986 live against
    # 985 in one CI run of bb07012, since the strangers tier issues more wave records).
    stepped = [c["legitimate"]["sessions_stepped_up_after_sign_in"] for c in cards.values()]
    assert abs(stepped[0] - stepped[1]) <= max(1, stepped[1] // 1000), stepped
    attacks = live["attacks"]
    assert isinstance(attacks, dict) and set(attacks) == set(HOLDOUT_ATTACKS)
    for name in HOLDOUT_ATTACKS:
        if name != "mfa_code_guessing":
            assert attacks[name][1] == 0, (name, attacks[name])
    legit = cards["topics"]["legitimate"]
    assert legit["refused"] == 0, legit["examples"]
    assert legit["by_cohort"]["office_colleague"]["challenged"] == 0
