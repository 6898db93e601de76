"""The scorecard of a policy's outputs against the labelled events.

Per attack (the attacker events of one scenario): the first block and the first matching
alert (``pipeline.sim.matching``); time from the attack's first attempt to the earlier of the
two; attacker attempts that got through before it; refused and allowed totals; attacker
successes allowed (account takeovers); ``guesses_per_account_24h``, the most attacker
failures let through against one account in any 24 h (what a patient attacker gets), and
``account_takeovers``, the accounts with an attacker success let through.

Legitimate attempts refused (roles ``legit`` and ``owner``) are counted per cohort:
``owner_trusted_device``, ``nat_office``, ``ordinary``, ``ipv6_rotating``, ``stale_app``,
``owner_without_trusted_device``. A refusal a seed's rule makes on purpose
(``pipeline.sim.by_design``) is counted apart, as "refused by design", and is not in
``legit_refused_total``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from pipeline.core.decision_keys import VERIFY
from pipeline.core.decisions import Verdict
from pipeline.core.policy import DEFAULT_POLICY, Policy
from pipeline.sim.by_design import design_reasons
from pipeline.sim.card import AttackScore, Scorecard
from pipeline.sim.examples import example
from pipeline.sim.history import HISTORY
from pipeline.sim.matching import AttackIndex, new_score, score_alerts, score_decisions
from pipeline.sim.outputs import Outputs
from pipeline.sim.replay import replay_sessions
from pipeline.sim.truth import ATTACKER, LEGIT_ROLES, TruthEvent
from pipeline.sim.waves import answers, attack_spans, during, near_attacks, wave_spans

NOT_TAKEOVERS = frozenset({"attacker_own_account", "attacker_first_factor"})
"""Attacker successes that are no takeover: its own account, and a right password whose
second factor it then fails (``pipeline.sim.holdout``)."""
EXAMPLES = 10
EXAMPLE_FIELDS = ("event_id", "at", "cohort", "actor", "flow", "refused_by", "retry_after_ms")
DAY_MS = 86_400_000


def score(
    events: Sequence[TruthEvent], outputs: Outputs, policy: Policy = DEFAULT_POLICY
) -> Scorecard:
    """The scorecard of ``outputs`` against the labelled ``events``; ``policy`` (the one
    that decided) sets how far each attack's wave may reach (``near_attacks``)."""
    verdicts, reviewed = replay_sessions(events, outputs.decisions, policy)
    design = design_reasons(events, verdicts)
    attacks = AttackIndex.build(events)
    scores = {name: new_score(name, evs) for name, evs in sorted(attacks.events.items())}
    decision_stats = score_decisions(outputs.decisions, attacks, scores, events, verdicts, design)
    alerts_by_type, unmatched_alerts = score_alerts(outputs.alerts, events, attacks, scores, policy)
    legit_attempts: Counter[str] = Counter()
    legit_refused: Counter[str] = Counter()
    legit_challenged: Counter[str] = Counter()
    waves = wave_spans(outputs)
    running = attack_spans(events)
    near = near_attacks(running, policy)
    in_wave = [0, 0]  # legitimate untrusted password attempts during a wave; challenged
    # legitimate attempts challenged while no attack ran; of them away from attacks
    outside = [0, 0]
    by_design: Counter[str] = Counter()
    why: dict[str, list[str]] = defaultdict(list)
    examples: list[dict[str, Any]] = []
    let_through: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    taken: dict[str, set[tuple[str, str]]] = defaultdict(set)
    bought: dict[str, set[tuple[str, str]]] = defaultdict(set)  # taken if CAPTCHAs are bought
    # People (legitimate actors) of the run, not its history; those who met a challenge;
    # those who signed in during the history (the warm start's known people).
    people: set[str] = set()
    people_challenged: set[str] = set()
    known_people: set[str] = set()
    # legitimate sessions stepped up after sign-in; of them outside attacks; away from them
    legit_reviewed = [0, 0, 0]
    verified = 0  # legitimate right passwords [verify] stepped up (unfamiliar sign-ins)
    for i, (event, verdict, reason) in enumerate(zip(events, verdicts, design, strict=True)):
        if event.role == ATTACKER:
            taken_over = takeover(event, verdict, i in reviewed)
            count_valid(scores[event.scenario], bought, event, verdict, i in reviewed)
            # A challenge stops a bot: the assumption is that bots fail challenges, the
            # step-up a session review asks after the sign-in too.
            challenged = shown_challenge(verdict, event)
            if challenged:
                verdict = CHALLENGED
                scores[event.scenario].challenged += 1
            elif i in reviewed:
                verdict = CHALLENGED
                scores[event.scenario].stepped_up_after_sign_in += 1
            a = event.attempt
            _count_attacker(scores[event.scenario], event, verdict, taken_over)
            if taken_over:
                taken[event.scenario].add((a.tenant, a.account))
            elif verdict.allowed and not a.success:
                let_through[(event.scenario, a.tenant, a.account)].append(event.occurred_ms)
        elif event.role in LEGIT_ROLES:
            legit_attempts[event.cohort] += 1
            in_history = event.scenario == HISTORY
            if in_history and event.attempt.success:
                known_people.add(event.actor)
            elif not in_history:
                people.add(event.actor)
            if i in reviewed:
                legit_reviewed[0] += 1
                legit_reviewed[1] += not during(running, event.attempt.tenant, event.occurred_ms)
                legit_reviewed[2] += not during(near, event.attempt.tenant, event.occurred_ms)
            shown = shown_challenge(verdict, event)
            if shown:
                legit_challenged[event.cohort] += 1
                if not in_history:
                    people_challenged.add(event.actor)
                if _verified(verdict):
                    verified += 1
            a = event.attempt
            if a.password_flow and not a.trusted and during(waves, a.tenant, a.occurred_ms):
                in_wave[0] += 1
                in_wave[1] += shown
            # What only a wave could bring: [verify]'s step-up of an unfamiliar sign-in is
            # asked whether or not an attack runs, and counted apart (``verified``).
            if shown and not _verified(verdict) and not during(running, a.tenant, a.occurred_ms):
                outside[0] += 1
                outside[1] += not during(near, a.tenant, a.occurred_ms)
            if not verdict.allowed:
                if reason is not None:
                    by_design[event.cohort] += 1
                    if reason not in why[event.cohort]:
                        why[event.cohort].append(reason)
                    continue
                legit_refused[event.cohort] += 1
                if len(examples) < EXAMPLES:
                    examples.append(example(event, verdict, EXAMPLE_FIELDS))
    for (name, _, _), times in let_through.items():
        s = scores[name]
        s.guesses_per_account_24h = max(s.guesses_per_account_24h, most_in_a_day(times))
    for name, accounts in taken.items():
        scores[name].account_takeovers = len(accounts)
    for name in taken.keys() | bought.keys():
        scores[name].takeovers_if_captcha_bought = len(taken[name] | bought[name])
    versions = {r.decision.policy_version for r in outputs.decisions if r.decision is not None}
    versions |= {r.alert.policy_version for r in outputs.alerts}
    return Scorecard(
        origin=outputs.origin,
        policy_version=",".join(sorted(versions)) or None,
        events=len(events),
        attacks=list(scores.values()),
        legit_attempts=legit_attempts,
        legit_refused=legit_refused,
        legit_challenged=legit_challenged,
        legit_untrusted_in_wave=in_wave[0],
        legit_challenged_in_wave=in_wave[1],
        legit_challenged_outside_attacks=outside[0],
        legit_challenged_away_from_attacks=outside[1],
        legit_stepped_up_after_sign_in=legit_reviewed[0],
        legit_stepped_up_outside_attacks=legit_reviewed[1],
        legit_stepped_up_away_from_attacks=legit_reviewed[2],
        legit_verified=verified,
        legit_people=len(people),
        legit_people_challenged=len(people_challenged),
        legit_known_people=len(people & known_people),
        legit_known_people_challenged=len(people_challenged & known_people),
        wave_answers=answers(events, waves),
        legit_examples=examples,
        legit_by_design=by_design,
        legit_by_design_why=dict(why),
        alerts_by_type=alerts_by_type,
        unmatched_alerts=unmatched_alerts,
        missing_decision_records=outputs.missing_decision_records,
        **decision_stats,
    )


def shown_challenge(verdict: Verdict, event: TruthEvent) -> bool:
    """Whether the attempt met its challenge: a captcha before any password check, a
    step-up only after a correct password (a wrong one fails as it would have)."""
    if not verdict.allowed or verdict.challenge is None:
        return False
    return verdict.challenge != "step_up" or event.attempt.success


def takeover(event: TruthEvent, verdict: Verdict, reviewed: bool) -> bool:
    """Whether ``event`` took an account over: a labelled attacker's success (not on its own
    account nor a first factor it then fails: ``NOT_TAKEOVERS``) the gateway let through
    with no challenge to meet (bots fail them) and no session review stepped up later
    (``reviewed``). The one count of the scorecard, the report and ``backtest --verdicts``."""
    a = event.attempt
    return (
        event.role == ATTACKER
        and a.success
        and event.cohort not in NOT_TAKEOVERS
        and verdict.allowed
        and not shown_challenge(verdict, event)
        and not reviewed
    )


def count_valid(
    s: AttackScore,
    bought: dict[str, set[tuple[str, str]]],
    event: TruthEvent,
    verdict: Verdict,
    reviewed: bool,
) -> None:
    """A valid credential (an attacker's success on another's account, not refused): one
    confirmed by a step-up, or one that met only a CAPTCHA (taken over if CAPTCHAs are
    bought, unless a session review stepped it up)."""
    a = event.attempt
    if not (a.success and event.cohort not in NOT_TAKEOVERS and verdict.allowed):
        return
    if verdict.step_up or verdict.challenge == "step_up":
        s.valid_confirmed_by_step_up += 1
    elif verdict.challenge == "captcha":
        s.valid_captcha_only += 1
        if not reviewed:
            bought[event.scenario].add((a.tenant, a.account))


def _verified(verdict: Verdict) -> bool:
    """The step-up is [verify]'s alone (an unfamiliar sign-in), no wave's or source's."""
    key = verdict.challenge_key
    return verdict.challenge == "step_up" and key is not None and key[4] == VERIFY


def most_in_a_day(times: Sequence[int]) -> int:
    """The most of ``times`` (sorted epoch ms) inside any 24 h."""
    most = first = 0
    for last, t in enumerate(times):
        while t - times[first] >= DAY_MS:
            first += 1
        most = max(most, last - first + 1)
    return most


CHALLENGED = Verdict(False, 0)
"""How an attacker's challenged attempt is counted: stopped, like a refusal."""


def _count_attacker(s: AttackScore, event: TruthEvent, verdict: Verdict, success: bool) -> None:
    s.add(verdict.allowed, success)
    if not verdict.allowed:
        return
    response = s.response_ms
    if response is None or event.occurred_ms <= response:
        s.allowed_before_response += 1
