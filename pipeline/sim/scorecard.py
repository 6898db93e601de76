"""``authpipe scorecard``: how well did the policy do against the ground truth?

Inputs: the truth file (labels and the events themselves: ``pipeline.sim.truth``), the
decision stream and the alerts, from the topics (``pipeline.sim.topics``), from files
(``pipeline.sim.output_files``), or computed here by the core ``Engine``
(``pipeline.sim.outputs.run_engine``). Which attempts were refused is what a gateway would
have answered under the decision stream (``pipeline.sim.replay``); ``pipeline.sim.scoring``
computes the figures (``pipeline.sim.card``), matching decisions and alerts to attacks
(``pipeline.sim.matching``) and counting apart the refusals a seed's rule makes on purpose
(``pipeline.sim.by_design``); ``pipeline.sim.card_text`` prints them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pipeline.logs import get_logger
from pipeline.settings import Settings
from pipeline.sim.card_text import render
from pipeline.sim.output_files import load_outputs, write_json, write_outputs
from pipeline.sim.outputs import run_engine
from pipeline.sim.scoring import score
from pipeline.sim.topics import read_outputs_from_topics
from pipeline.sim.truth import load_truth
from pipeline.wiring import build_normaliser, grouping_check, load_policy

log = get_logger("scorecard")


def run_scorecard_command(
    settings: Settings,
    *,
    truth: Path,
    from_topics: bool,
    decisions: Path | None,
    alerts: Path | None,
    engine: bool,
    policy: Path | None,
    out: Path | None,
    save_outputs: Path | None,
    timeout_s: float,
    strict: bool,
) -> int:
    """``authpipe scorecard``: load, score, print, write; exit 3 on failure with --strict."""
    events = load_truth(truth, build_normaliser(settings))
    decided_by = load_policy(policy or settings.policy_path)
    if engine:
        outputs = run_engine(events, decided_by)
    elif decisions is not None:
        outputs = load_outputs(decisions, alerts, grouping_check(settings))
    else:
        from pipeline.kafka_client import security_kwargs

        kafka = settings.kafka
        outputs = asyncio.run(
            read_outputs_from_topics(
                kafka.bootstrap_servers,
                kafka.decisions_topic,
                kafka.alerts_topic,
                timeout_s,
                security_kwargs(kafka),
                grouping_check(settings),
            )
        )
    card = score(events, outputs, decided_by)
    print(render(card))
    if out is not None:
        write_json(card.as_json(), out)
        print(f"scorecard JSON: {out}")
    if save_outputs is not None:
        save_outputs.mkdir(parents=True, exist_ok=True)
        write_outputs(outputs, save_outputs / "decisions.jsonl", save_outputs / "alerts.jsonl")
        print(f"decisions and alerts: {save_outputs}/decisions.jsonl, {save_outputs}/alerts.jsonl")
    log.info(
        "scorecard_finished",
        events=card.events,
        attacks=len(card.attacks),
        statuses=",".join(a.status for a in card.attacks),
        takeovers=card.takeovers,
        legit_refused=card.legit_refused_total,
    )
    if strict and (not card.all_caught or card.legit_refused_total):
        return 3
    return 0
