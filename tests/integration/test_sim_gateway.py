"""``simulate --gateway``: the simulator as a contract-following login service in front of
the real edge, on the real broker and worker (issue 44: through the broker, with a login
service honouring the step-up)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from pipeline.sim.live_gateway import REPORTED
from pipeline.sim.scoring import NOT_TAKEOVERS
from tests.integration.test_sim_pipeline import REPO, cli
from tests.plugins.kafka import free_ports
from tests.plugins.settling import wait_for_outputs
from tests.plugins.waiting import wait_until
from tests.plugins.worker import StreamNames, WorkerProcess, read_topic, start_worker

pytestmark = pytest.mark.integration

SHAPE = ("--scenario", "baseline,known_exits_fast,retry_after_hit", "--rate", "3")
RUN = ("--duration-s", "60", "--history-s", "300", "--seed", "4")
"""A minute of the adaptive attackers who hit the most valid credentials in a short run
(exits made known by the attacker's own account, 3 guesses/s; a bot that retries each hit
from the same exit 20 s later), after 5 minutes of history: 8 valid credentials."""


@contextmanager
def edge_serving(env: dict[str, str], log_path: Path) -> Iterator[str]:
    """``authpipe edge serve`` on the test's decision topic; yields its base URL once ready."""
    (port,) = free_ports(1)
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, log_path.read_text(errors="replace")[-2000:]
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "edge", "serve", "--port", str(port)],
            cwd=REPO,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(ready, 60.0, interval_s=0.2, description="the edge to be ready")
            yield base
        finally:
            process.kill()
            process.wait(15)


def ingested(worker: WorkerProcess) -> float:
    """Input events the worker counted or dead-lettered."""
    return worker.metric("authpipe_events_total") + worker.metric("authpipe_dead_letters_total")


def valid_credentials(truth: Path) -> set[str]:
    """Event ids of the attempts in which an attacker holds another's right password."""
    rows = [orjson.loads(line) for line in truth.read_bytes().splitlines()]
    return {
        r["event_id"]
        for r in rows
        if r["role"] == "attacker"
        and r["cohort"] not in NOT_TAKEOVERS
        and r["event"]["outcome"] == "success"
    }


@pytest.mark.timeout(240)
def test_through_the_edge_no_valid_attacker_credential_becomes_a_session(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """A minute of known exits and retried hits, in event time after 5 minutes of history,
    each attempt checked at the real edge and reported as the contract says: every one of
    the 8 valid attacker credentials met a step-up (the edge's answers and the scorecard
    from the topics agree), none reached the topic as a sign-in (each is exactly a step_up
    then a failed second factor), 0 taken over even if CAPTCHAs are bought, nobody refused."""
    env = {**worker_env, "AUTHPIPE_LOG_LEVEL": "warning"}
    worker = start_worker(workers, worker_env, tmp_path).wait_ready()
    truth = tmp_path / "truth.jsonl"
    with edge_serving(env, tmp_path / "edge.log") as url:
        done = cli(env, "simulate", "--gateway", url, *SHAPE, *RUN, "--truth", str(truth))
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    valid = valid_credentials(truth)
    assert len(valid) == 8
    assert (
        "attacker valid credentials: 0 taken over (bots fail CAPTCHAs), 0 if CAPTCHAs are bought (0 met only a CAPTCHA), 8 confirmed by a step-up"
        in done.stdout
    )
    people = re.search(r"people: ([\d,]+), challenged ([\d,]+), refused ([\d,]+)", done.stdout)
    assert people is not None and people[3] == "0", done.stdout

    produced_text = re.search(r"events produced: ([\d,]+)", done.stdout)
    assert produced_text is not None, done.stdout
    produced = int(produced_text[1].replace(",", ""))
    try:
        wait_until(lambda: ingested(worker) >= produced, 60.0, interval_s=1.0)
    except AssertionError:
        raise AssertionError(
            f"the worker ingested {ingested(worker)} of {produced} events "
            f"({worker.metric('authpipe_events_total')} counted); input topic: "
            f"{len(read_topic(kafka_bootstrap, stream_names.input))} events"
        ) from None
    assert worker.metric("authpipe_dead_letters_total") == 0, worker.log_tail()
    wait_for_outputs(kafka_bootstrap, stream_names, [stream_names.decisions], "decisions settled")
    records = read_topic(kafka_bootstrap, stream_names.input)
    topic = {e["event_id"]: e for e in (orjson.loads(m.value) for m in records)}
    assert len(topic) == produced
    # Each valid credential is on the topic as the bot's failed CAPTCHA (the password never
    # checked), or as a step_up then a failed second factor: never as a sign-in.
    shapes: Counter[tuple[tuple[str, str, str | None], ...]] = Counter()
    for event_id in valid:
        reports = [
            topic[i] for i in (event_id, event_id + "#step_up", event_id + "#mfa") if i in topic
        ]
        shapes[tuple((r["flow"], r["outcome"], r.get("failure_reason")) for r in reports)] += 1
    assert set(shapes) <= {
        (("challenge", "failure", "other"),),
        (("login", "step_up", None), ("mfa", "failure", "bad_second_factor")),
    }, shapes
    assert sum(shapes.values()) == 8
    # The truth: every attempt as made, then each extra report (role "reported"), which is
    # on the topic as such; an attempt is there under its own id unless a bot's step-up
    # replaced it.
    rows = {r["event_id"]: r for r in map(orjson.loads, truth.read_bytes().splitlines())}
    extras = {i for i, r in rows.items() if r["role"] == REPORTED}
    assert extras <= topic.keys() and set(topic) <= rows.keys()
    assert {i for i in rows.keys() - topic.keys()} == {
        i for i in rows if i + "#mfa" in extras and rows[i]["role"] == "attacker"
    }

    card_path = tmp_path / "card.json"
    done = cli(
        env, "scorecard", "--truth", str(truth), "--decisions-from-topic", "--out", str(card_path)
    )
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    card = orjson.loads(card_path.read_bytes())
    attacks = {a["attack"]: a for a in card["attacks"]}
    assert {
        name: (a["account_takeovers"], a["takeovers_if_captcha_bought"])
        for name, a in attacks.items()
    } == {"known_exits_fast": (0, 0), "retry_after_hit": (0, 0)}
    assert sum(a["valid_confirmed_by_step_up"] for a in attacks.values()) == 8
    assert card["legitimate"]["refused"] == 0, card["legitimate"]["examples"]
