"""``authpipe backtest --verdicts OUT.jsonl``: what would this policy do to these attempts?

The events go through the core ``Engine`` one by one, emulating the gateway in front of
the login service: each attempt is first checked against the decisions in force (as
``pipeline.edge`` would answer it); a refused attempt never reaches the password check,
so it is reported as ``failure_reason = "refused"`` whatever its recorded outcome, and no
rule counts it (the README's login service does exactly this). One line per input event:

``{"event_id", "occurred_at", "account", "allowed", "retry_after_ms", "challenge",
"step_up", "challenge_passed", "taken_over", "refused_by", "decisions", "lifts", "alerts", "notices"}``

``challenge`` is what the gateway would demand (``captcha``, ``step_up`` or null) and
``step_up`` whether a right password must pass a possession check first. The emulation
assumes bots fail challenges and people pass them, and feeds the engine what a login
service following the contract reports (``pipeline.sim.gateway.reported``: a bot's
``captcha`` is a ``flow = "challenge"`` failure; a right password under a step-up is
reported ``outcome = "step_up"``, then the possession check as ``mfa``, failed by a bot,
passed by a person, whose completed sign-in follows).

``taken_over`` says whether the attempt took an account over, decided by the function the
scorecard and the report use (``pipeline.sim.scoring.takeover``; no session review is
played here, so a sign-in a later wave would have stepped up still counts).
``refused_by`` lists the rules of every block in force that applies (the longest first);
``decisions``, ``lifts``, ``alerts`` and ``notices`` are what the event itself caused.
The summary counts, per account, the most failures let through in any 24 h: the number a
policy author checks against a scripted patient attacker.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from pipeline.contracts.models import format_utc_ms, ms_to_datetime
from pipeline.core.decision_keys import keys_for
from pipeline.core.engine import Engine
from pipeline.core.policy import Policy
from pipeline.sim.card import Tally
from pipeline.sim.gateway import reported
from pipeline.sim.scoring import most_in_a_day, takeover
from pipeline.sim.truth import ATTACKER, TruthEvent


@dataclass
class VerdictSummary(Tally):
    """Totals of a verdicts run (``Tally``: the attempts let through and refused)."""

    events: int = 0
    refused_by_rule: Counter[str] = field(default_factory=Counter)
    decisions_by_rule: Counter[str] = field(default_factory=Counter)
    alerts_by_type: Counter[str] = field(default_factory=Counter)
    notices: int = 0
    challenged: int = 0
    failures_let_through: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    takeovers: Counter[str] = field(default_factory=Counter)
    """Takeovers (``pipeline.sim.scoring.takeover``) per account as typed."""

    def per_account_24h(self) -> list[tuple[str, int]]:
        """(account as typed, most failures let through in any 24 h), most first."""
        ranked = [
            (account, most_in_a_day(times)) for account, times in self.failures_let_through.items()
        ]
        return sorted(ranked, key=lambda item: (-item[1], item[0]))

    def render(self, top: int = 10) -> str:
        lines = [
            f"verdicts: {self.events:,} events, {self.allowed:,} allowed, {self.refused:,} refused "
            f"(refused attempts are reported as refused and counted by no rule)",
            "refused by: " + (_counts(self.refused_by_rule) or "nothing"),
            "decisions: " + (_counts(self.decisions_by_rule) or "none"),
            "alerts: "
            + (_counts(self.alerts_by_type) or "none")
            + f"; owner notices: {self.notices}",
            f"challenged: {self.challenged:,} (bots are assumed to fail challenges, people to "
            "pass them)",
            f"successes allowed: {self.successes_allowed:,}",
            self._takeovers_line(),
            "most failures let through per account in any 24 h:",
        ]
        lines += [f"  {n:>6}  {account}" for account, n in self.per_account_24h()[:top]]
        return "\n".join(lines)

    def _takeovers_line(self) -> str:
        if not self.takeovers:
            return "account takeovers: none"
        accounts = len(self.takeovers)
        logins = sum(self.takeovers.values())
        return (
            f"account takeovers: {accounts:,} account{'s' * (accounts != 1)} "
            f"({logins:,} attacker sign-in{'s' * (logins != 1)} let through): "
            + ", ".join(f"{account} {n}" for account, n in sorted(self.takeovers.items()))
        )


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counter.items()))


def verdicts(
    events: Sequence[TruthEvent], policy: Policy, summary: VerdictSummary
) -> Iterator[dict[str, Any]]:
    """One verdict line per event, in order, emulating the gateway (see the module doc)."""
    engine = Engine(policy)
    out = engine.out
    index = engine.accounts.index
    now = 0
    for event in events:
        a = event.attempt
        now = max(now, a.occurred_ms)
        keys = keys_for(a)
        verdict = index.check(keys, a.occurred_ms)
        refused_by: list[str] = []
        if not verdict.allowed:
            in_force = [index.get(key) for key in keys]
            blocks = [
                x
                for x in in_force
                if x is not None and x.action == "block" and x.expires_ms > a.occurred_ms
            ]
            refused_by = [x.rule for x in sorted(blocks, key=lambda x: -x.expires_ms)]
        passed: bool | None = None
        if verdict.challenge is not None or verdict.step_up:
            passed = event.role != ATTACKER
        reports = reported(a, verdict, event.role == ATTACKER)
        for report in reports:
            engine.step(report, now)
        a = reports[0]
        line = {
            "event_id": event.event_id,
            "occurred_at": format_utc_ms(ms_to_datetime(a.occurred_ms)),
            "account": event.account_plain,
            "allowed": verdict.allowed,
            "retry_after_ms": verdict.retry_after_ms,
            "challenge": verdict.challenge,
            "step_up": verdict.step_up,
            "challenge_passed": passed,
            "taken_over": takeover(event, verdict, False),
            "refused_by": refused_by,
            "decisions": [
                {
                    "key": key,
                    "rule": d.rule,
                    "action": d.action,
                    "count": d.count,
                    "expires_at": format_utc_ms(d.expires_at),
                }
                for key, d in out.decisions
                if d is not None
            ],
            "lifts": [key for key, d in out.decisions if d is None],
            "alerts": [{"type": x.type, "count": x.count} for x in out.alerts],
            "notices": [
                {"reason": n.reason, "expires_at": format_utc_ms(n.expires_at)} for n in out.notices
            ],
        }
        _add(summary, event, line)
        out.clear()
        yield line


def _add(summary: VerdictSummary, event: TruthEvent, line: dict[str, Any]) -> None:
    summary.events += 1
    a = event.attempt
    if line["taken_over"]:
        summary.takeovers[event.account_plain] += 1
    if line["challenge"] is not None:
        summary.challenged += 1
        if not line["challenge_passed"]:
            summary.add(False, False)  # a bot's failed challenge: stopped
            return
    summary.add(line["allowed"], a.success)
    if not line["allowed"]:
        summary.refused_by_rule.update(line["refused_by"][:1])
    elif not a.success:
        summary.failures_let_through[event.account_plain].append(a.occurred_ms)
    summary.decisions_by_rule.update(d["rule"] for d in line["decisions"])
    summary.alerts_by_type.update(x["type"] for x in line["alerts"])
    summary.notices += len(line["notices"])


def write_verdicts(events: Sequence[TruthEvent], policy: Policy, path: Path) -> VerdictSummary:
    """Write the verdict lines to ``path`` (JSONL) and return the summary."""
    summary = VerdictSummary()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        _write_all(handle, verdicts(events, policy, summary))
    return summary


def _write_all(handle: IO[bytes], lines: Iterator[dict[str, Any]]) -> None:
    for line in lines:
        handle.write(orjson.dumps(line) + b"\n")
