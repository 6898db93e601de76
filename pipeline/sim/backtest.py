"""``authpipe backtest``: replay recorded input through the current and a candidate policy.

The input (``pipeline.sim.backtest_input``) is a range of the input topic or a JSONL file of
events or truth rows; nothing is written anywhere but the report: the live decision topic is
never touched and no worker is needed.

Both policies run in the core ``Engine`` over the same normalised events. The diff:

* decisions added and removed, identified by ``(key, issued_at, action)``;
* attempts newly refused (refused under the candidate, allowed under the current
  policy) and newly allowed, where "refused" is the decision-stream replay of the
  scorecard (what a gateway would have answered);
* a newly refused attempt is owner collateral when whoever was refused demonstrably
  knew the password: the attempt itself succeeded, or the same account later succeeds
  from the same source or the same device (within the replayed range). Otherwise it is
  attacker traffic. (An attacked account whose owner signs in later from elsewhere does
  not make the attacker's refusals collateral.) The looser count of newly refused
  attempts on accounts that later succeed from any client is reported beside it, as an
  upper bound. An added decision is collateral when it refused at least one
  owner-collateral attempt;
* with a truth file, newly refused attempts by true role and both full scorecards.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.decisions import Verdict
from pipeline.core.keys import Key, decision_key, parse_key
from pipeline.core.policy import Policy
from pipeline.logs import get_logger
from pipeline.settings import Settings
from pipeline.sim.backtest_input import (
    BacktestError,
    TopicRange,
    events_from_records,
    label,
    read_input_range,
)
from pipeline.sim.card import Scorecard
from pipeline.sim.card_text import render as render_card
from pipeline.sim.examples import example
from pipeline.sim.output_files import load_outputs, write_json
from pipeline.sim.outputs import Outputs, run_engine
from pipeline.sim.parity import Parity, compare
from pipeline.sim.replay import replay
from pipeline.sim.scoring import score
from pipeline.sim.truth import UNKNOWN, TruthEvent, load_truth
from pipeline.wiring import build_normaliser, grouping_check, load_policy

log = get_logger("backtest")

EXAMPLES = 20
EXAMPLE_FIELDS = ("event_id", "at", "account", "role", "flow", "success", "refused_by")


@dataclass
class PolicyRun:
    policy: Policy
    outputs: Outputs
    verdicts: list[Verdict]

    @classmethod
    def run(cls, events: Sequence[TruthEvent], policy: Policy) -> PolicyRun:
        outputs = run_engine(events, policy)
        return cls(policy, outputs, replay(events, outputs.decisions, policy))

    def decision_ids(self) -> dict[tuple[str, int, str], str]:
        """(key, issued_ms, action) -> rule of every decision (not tombstones, not the
        familiar pairs' exempts: one per account and place, the same under any policy)."""
        out: dict[tuple[str, int, str], str] = {}
        for rec in self.outputs.decisions:
            if rec.decision is not None and rec.decision.action != "exempt":
                d = rec.decision
                out[(rec.key, datetime_to_ms(d.issued_at), d.action)] = d.rule
        return out


@dataclass
class Diff:
    events: int
    invalid: int
    baseline_version: str
    candidate_version: str
    baseline_decisions: int
    candidate_decisions: int
    added: Counter[str] = field(default_factory=Counter)
    removed: Counter[str] = field(default_factory=Counter)
    added_collateral: int = 0
    added_attacker: int = 0
    newly_refused: int = 0
    attacker_traffic: int = 0
    owner_collateral: int = 0
    collateral_accounts: int = 0
    account_later_succeeds: int = 0
    newly_allowed: int = 0
    by_role: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)
    scorecards: dict[str, Scorecard] = field(default_factory=dict)
    live: Parity | None = None  # the baseline replay against the live outputs, if given

    def as_json(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "invalid_events": self.invalid,
            "baseline_policy": self.baseline_version,
            "candidate_policy": self.candidate_version,
            "decisions": {
                "baseline": self.baseline_decisions,
                "candidate": self.candidate_decisions,
                "added": sum(self.added.values()),
                "removed": sum(self.removed.values()),
                "added_by_rule": dict(sorted(self.added.items())),
                "removed_by_rule": dict(sorted(self.removed.items())),
                "added_attacker": self.added_attacker,
                "added_collateral": self.added_collateral,
            },
            "attempts": {
                "newly_refused": self.newly_refused,
                "attacker_traffic": self.attacker_traffic,
                "owner_collateral": self.owner_collateral,
                "collateral_accounts": self.collateral_accounts,
                "account_later_succeeds": self.account_later_succeeds,
                "newly_allowed": self.newly_allowed,
                "newly_refused_by_true_role": dict(sorted(self.by_role.items())),
            },
            "collateral_examples": self.examples,
            "scorecards": {name: card.as_json() for name, card in self.scorecards.items()},
            "live_vs_replay": self.live.as_json() if self.live is not None else None,
        }


def _later_success_index(
    events: Sequence[TruthEvent],
) -> tuple[dict[Key, int], dict[Key, int], dict[Key, int]]:
    """Index of the LAST success per (account, source), (account, device) and account."""
    by_source: dict[Key, int] = {}
    by_device: dict[Key, int] = {}
    by_account: dict[Key, int] = {}
    for e in events:
        a = e.attempt
        if not a.success:
            continue
        by_source[decision_key("pair", a.tenant, a.account, a.source, None)] = e.index
        by_account[decision_key("pair", a.tenant, a.account, None, None)] = e.index
        if a.device:
            by_device[decision_key("pair", a.tenant, a.account, None, a.device)] = e.index
    return by_source, by_device, by_account


def is_collateral(e: TruthEvent, by_source: dict[Key, int], by_device: dict[Key, int]) -> bool:
    """The refused party knew the password: it succeeded, or succeeds later as the same client."""
    a = e.attempt
    if a.success:
        return True
    if by_source.get(decision_key("pair", a.tenant, a.account, a.source, None), -1) > e.index:
        return True
    return (
        bool(a.device)
        and by_device.get(decision_key("pair", a.tenant, a.account, None, a.device), -1) > e.index
    )


def diff(
    events: Sequence[TruthEvent], baseline: PolicyRun, candidate: PolicyRun, invalid: int = 0
) -> Diff:
    base_ids, cand_ids = baseline.decision_ids(), candidate.decision_ids()
    result = Diff(
        events=len(events),
        invalid=invalid,
        baseline_version=baseline.policy.policy_version,
        candidate_version=candidate.policy.policy_version,
        baseline_decisions=len(base_ids),
        candidate_decisions=len(cand_ids),
        added=Counter(rule for ident, rule in cand_ids.items() if ident not in base_ids),
        removed=Counter(rule for ident, rule in base_ids.items() if ident not in cand_ids),
    )
    by_source, by_device, by_account = _later_success_index(events)
    collateral_keys: set[Key] = set()
    collateral_accounts: set[tuple[str, str]] = set()
    for e, old, new in zip(events, baseline.verdicts, candidate.verdicts, strict=True):
        if old.allowed and not new.allowed:
            result.newly_refused += 1
            result.by_role[e.role] += 1
            account_key = decision_key("pair", e.attempt.tenant, e.attempt.account, None, None)
            if e.attempt.success or by_account.get(account_key, -1) > e.index:
                result.account_later_succeeds += 1
            if is_collateral(e, by_source, by_device):
                result.owner_collateral += 1
                collateral_accounts.add((e.attempt.tenant, e.attempt.account))
                if new.matched_key is not None:
                    collateral_keys.add(new.matched_key)
                if len(result.examples) < EXAMPLES:
                    result.examples.append(example(e, new, EXAMPLE_FIELDS))
            else:
                result.attacker_traffic += 1
        elif new.allowed and not old.allowed:
            result.newly_allowed += 1
    result.collateral_accounts = len(collateral_accounts)
    for key, _issued, _action in (i for i in cand_ids if i not in base_ids):
        if parse_key(key) in collateral_keys:
            result.added_collateral += 1
        else:
            result.added_attacker += 1
    return result


def backtest(
    events: Sequence[TruthEvent],
    baseline: Policy,
    candidate: Policy,
    *,
    invalid: int = 0,
    labelled: bool = False,
    live: Outputs | None = None,
) -> Diff:
    """Run both policies and diff them; scorecards too when the events are labelled; the
    baseline replay against the live outputs when given (``pipeline.sim.parity``)."""
    if baseline.policy_version == candidate.policy_version:
        log.warning("backtest_same_policy_version", policy_version=baseline.policy_version)
    base_run, cand_run = PolicyRun.run(events, baseline), PolicyRun.run(events, candidate)
    result = diff(events, base_run, cand_run, invalid)
    if live is not None:
        result.live = compare(base_run.outputs, live)
    if labelled:
        result.scorecards["baseline"] = score(events, base_run.outputs, baseline)
        result.scorecards["candidate"] = score(events, cand_run.outputs, candidate)
    return result


def render(d: Diff) -> str:
    added = ", ".join(f"{rule} +{n}" for rule, n in sorted(d.added.items())) or "none"
    removed = ", ".join(f"{rule} -{n}" for rule, n in sorted(d.removed.items())) or "none"
    lines = [
        f"backtest: {d.events:,} events ({d.invalid} invalid skipped); "
        f"current {d.baseline_version} vs candidate {d.candidate_version}",
        f"{'':<28}{'current':>10}{'candidate':>11}{'added':>8}{'removed':>9}",
        f"{'decisions':<28}{d.baseline_decisions:>10}{d.candidate_decisions:>11}"
        f"{sum(d.added.values()):>8}{sum(d.removed.values()):>9}",
        f"  added by rule: {added}; removed by rule: {removed}",
        f"  added decisions on attacker traffic: {d.added_attacker}, causing owner collateral: {d.added_collateral}",
        f"attempts newly refused: {d.newly_refused} (attacker traffic {d.attacker_traffic}, "
        f"owner collateral {d.owner_collateral} on {d.collateral_accounts} accounts); "
        f"newly allowed: {d.newly_allowed}",
        f"  owner collateral: the refused client itself succeeds later in the range; "
        f"{d.account_later_succeeds} newly refused attempts are on accounts that succeed later "
        f"from any client (an upper bound)",
    ]
    if d.by_role:
        lines.append(
            "  newly refused by true role: "
            + ", ".join(f"{r} {n}" for r, n in sorted(d.by_role.items()))
        )
    for ex in d.examples[:5]:
        lines.append(
            f"  collateral: {ex['at']} {ex['account']} {ex['flow']} "
            f"{'success' if ex['success'] else 'failure'} refused by {ex['refused_by']}"
        )
    if d.live is not None:
        lines.append(d.live.render())
    for name, card in d.scorecards.items():
        lines.append("")
        lines.append(f"[{name}] " + render_card(card))
    return "\n".join(lines)


def run_backtest_command(
    settings: Settings,
    *,
    candidate: Path | None,
    baseline: Path | None,
    events: Path | None,
    topic_range: TopicRange | None,
    truth: Path | None,
    out: Path | None,
    verdicts: Path | None = None,
    live: Path | None = None,
) -> int:
    """``authpipe backtest``: load the input, run both policies, print and write the diff;
    with ``verdicts``, write one verdict line per event under one policy instead."""
    normaliser = build_normaliser(settings)
    invalid = 0
    if events is not None:
        loaded = load_truth(events, normaliser)
    else:
        assert topic_range is not None
        from pipeline.kafka_client import security_kwargs

        kafka = settings.kafka
        records = asyncio.run(
            read_input_range(
                kafka.bootstrap_servers,
                kafka.input_topic,
                topic_range,
                security=security_kwargs(kafka),
            )
        )
        loaded, invalid = events_from_records(records, normaliser, topic_range)
    labelled = any(e.role != UNKNOWN for e in loaded)
    if truth is not None:
        loaded = label(loaded, load_truth(truth, normaliser))
        labelled = True
    if not loaded:
        raise BacktestError("no valid events in the chosen range; check the range or the topic")
    if verdicts is not None:
        from pipeline.sim.verdicts import write_verdicts

        summary = write_verdicts(loaded, load_policy(candidate or settings.policy_path), verdicts)
        print(summary.render())
        print(f"verdicts JSONL: {verdicts}")
        log.info("verdicts_finished", events=summary.events, refused=summary.refused)
        return 0
    if candidate is None:
        raise BacktestError("a diff needs the candidate policy: pass --policy (or --verdicts)")
    live_outputs = None
    if live is not None:
        live_outputs = load_outputs(
            live / "decisions.jsonl", live / "alerts.jsonl", grouping_check(settings)
        )
    result = backtest(
        loaded,
        load_policy(baseline or settings.policy_path),
        load_policy(candidate),
        invalid=invalid,
        labelled=labelled,
        live=live_outputs,
    )
    print(render(result))
    if out is not None:
        write_json(result.as_json(), out)
        print(f"backtest JSON: {out}")
    log.info(
        "backtest_finished",
        events=result.events,
        added=sum(result.added.values()),
        removed=sum(result.removed.values()),
        owner_collateral=result.owner_collateral,
    )
    return 0
