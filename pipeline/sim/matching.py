"""Which attack a decision or an alert belongs to.

A block belongs to the attacks one of whose attempts its key applies to, if issued during
the attack. Alerts are matched by subject: a source or account alert to the attacks whose
attempts have that source or account, raised between the attack's start and its end plus the
alert's window. ``spray_tenant`` (and ``stuffing_tenant``) has no subject: it is matched to
the attacks that gave at least 10 % of the distinct failing accounts counted when it fired
(the first ``count`` untrusted failing accounts of its window, in event order), provided
attackers gave at least half of them; otherwise it matches no attack (ordinary failures
tripped it: typically a cold start, when the tenant has no trailing baseline yet).
``strangers_tenant`` (the slow tier) counts sources, not accounts: it is matched the same way
to the failing sources of its window that no sign-in followed within ``redeem_ms``, and it
fired when its last window settled (``redeem_ms`` after the window's end). Blocks of
the seed rules (``SEED_RULES``) that match no attack and refused nothing legitimate but by
design are counted, not listed.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.decision_keys import keys_for
from pipeline.core.decisions import Verdict
from pipeline.core.keys import Key, parse_key
from pipeline.core.policy import DEFAULT_POLICY, Policy
from pipeline.core.rollup import TICK_MS
from pipeline.sim.card import AttackScore, ts
from pipeline.sim.outputs import AlertRecord, DecisionRecord
from pipeline.sim.truth import ATTACKER, TruthEvent

MIN_ATTACK_SHARE = 0.10
MIN_ATTACKER_SHARE = 0.5
SEED_RULES = frozenset({"lockout", "mfa_curve", "lifetime_bound"})
TENANT_ALERTS = frozenset({"spray_tenant", "stuffing_tenant", "strangers_tenant"})
"""Alerts without a subject, matched by who gave the accounts they counted."""


@dataclass
class AttackIndex:
    """Per attack: its events, its keys, its sources and accounts."""

    events: dict[str, list[TruthEvent]] = field(default_factory=lambda: defaultdict(list))
    keys: dict[Key, set[str]] = field(default_factory=lambda: defaultdict(set))
    sources: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    accounts: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))

    @classmethod
    def build(cls, events: Sequence[TruthEvent]) -> AttackIndex:
        idx = cls()
        for e in events:
            if e.role != ATTACKER:
                continue
            a = e.attempt
            idx.events[e.scenario].append(e)
            for key in keys_for(a):
                idx.keys[key].add(e.scenario)
            idx.sources[(a.tenant, a.source)].add(e.scenario)
            idx.accounts[(a.tenant, a.account)].add(e.scenario)
        return idx


def new_score(name: str, evs: list[TruthEvent]) -> AttackScore:
    return AttackScore(
        attack=name,
        tenant=evs[0].attempt.tenant,
        attempts=len(evs),
        start_ms=evs[0].occurred_ms,
        end_ms=evs[-1].occurred_ms,
    )


def score_decisions(
    records: Sequence[DecisionRecord],
    attacks: AttackIndex,
    scores: dict[str, AttackScore],
    events: Sequence[TruthEvent],
    verdicts: Sequence[Verdict],
    design: Sequence[str | None],
) -> dict[str, Any]:
    blocks = observes = tombstones = 0
    unmatched: list[dict[str, Any]] = []
    refused_by: Counter[Key] = Counter()
    seed_holds = 0
    for event, verdict, reason in zip(events, verdicts, design, strict=True):
        key = verdict.matched_key
        if key is not None and event.role != ATTACKER and reason is None:
            refused_by[key] += 1
    for rec in records:
        d = rec.decision
        if d is None:
            tombstones += 1
            continue
        if d.action == "exempt":
            continue  # a familiar pair: the owner's own place, no response to an attack
        key = parse_key(rec.key)
        issued = datetime_to_ms(d.issued_at)
        matched = [
            scores[name]
            for name in sorted(attacks.keys.get(key, ()))
            if scores[name].start_ms <= issued <= scores[name].end_ms
        ]
        if d.action == "block":
            blocks += 1
            for s in matched:
                s.blocks[d.rule] += 1
                if s.first_block_ms is None or issued < s.first_block_ms:
                    s.first_block_ms, s.first_block_rule = issued, d.rule
            if not matched and d.rule in SEED_RULES and not refused_by.get(key, 0):
                seed_holds += 1
            elif not matched:
                unmatched.append(
                    {
                        "key": rec.key,
                        "rule": d.rule,
                        "issued_at": ts(issued),
                        "refused_legitimate": refused_by.get(key, 0),
                    }
                )
        else:
            observes += 1
            for s in matched:
                s.observes[d.rule] += 1
    return {
        "blocks": blocks,
        "observes": observes,
        "tombstones": tombstones,
        "unmatched_blocks": unmatched,
        "seed_holds_matching_no_attack": seed_holds,
    }


def match_alerts(
    records: Sequence[AlertRecord], events: Sequence[TruthEvent]
) -> list[tuple[int, list[str], str | None]]:
    """Per alert: its event time, the attacks it matches, and a note when it matches none."""
    attacks = AttackIndex.build(events)
    scores = {name: new_score(name, evs) for name, evs in attacks.events.items()}
    windows = _TenantWindows(events)
    return [_match_alert(rec, events, attacks, scores, windows) for rec in records]


def score_alerts(
    records: Sequence[AlertRecord],
    events: Sequence[TruthEvent],
    attacks: AttackIndex,
    scores: dict[str, AttackScore],
    policy: Policy = DEFAULT_POLICY,
) -> tuple[Counter[str], list[dict[str, Any]]]:
    by_type: Counter[str] = Counter()
    unmatched: list[dict[str, Any]] = []
    tenant_windows = _TenantWindows(events, policy)
    for rec in records:
        alert = rec.alert
        by_type[alert.type] += 1
        at_ms, names, note = _match_alert(rec, events, attacks, scores, tenant_windows)
        for name in names:
            s = scores[name]
            s.alerts[alert.type] += 1
            if s.first_alert_ms is None or at_ms < s.first_alert_ms:
                s.first_alert_ms, s.first_alert_type = at_ms, alert.type
        if not names:
            unmatched.append(
                {
                    "type": alert.type,
                    "tenant": alert.tenant,
                    "source": alert.source,
                    "account_digest": alert.account_digest,
                    "count": alert.count,
                    "at": ts(at_ms),
                    "note": note,
                }
            )
    return by_type, unmatched


def _match_alert(
    rec: AlertRecord,
    events: Sequence[TruthEvent],
    attacks: AttackIndex,
    scores: dict[str, AttackScore],
    tenant_windows: _TenantWindows,
) -> tuple[int, list[str], str | None]:
    """(time of the alert, attacks it matches, a note when it matches none)."""
    alert = rec.alert
    start_ms, end_ms = datetime_to_ms(alert.window_start), datetime_to_ms(alert.window_end)
    known_ms = events[rec.after - 1].occurred_ms if rec.after else None
    if alert.type == "strangers_tenant":
        redeem_ms = tenant_windows.redeem_ms(alert.tenant)
        shares = tenant_windows.stranger_sources(alert.tenant, start_ms, end_ms, redeem_ms)
        at_ms = end_ms + redeem_ms  # the span's last window settled then
    elif alert.type in TENANT_ALERTS:
        at_ms, shares = tenant_windows.contributions(
            alert.tenant,
            start_ms,
            end_ms,
            alert.count,
            unknown_only=alert.type == "stuffing_tenant",
        )
        # Both are evaluated at second boundaries of event time: each fired at the first
        # one after its window's ``count``-th account failed, however the outputs were read.
        at_ms = at_ms - at_ms % TICK_MS + TICK_MS
    if alert.type in TENANT_ALERTS:
        attacker_share = sum(v for k, v in shares.items() if k is not None)
        if attacker_share < MIN_ATTACKER_SHARE:
            return (
                at_ms,
                [],
                f"{round(100 * (1 - attacker_share))} % of its accounts were ordinary failures",
            )
        names = sorted(k for k, v in shares.items() if k is not None and v >= MIN_ATTACK_SHARE)
        return at_ms, names, None
    at_ms = known_ms if known_ms is not None else end_ms
    candidates: set[str] = set()
    if alert.source is not None:
        candidates |= attacks.sources.get((alert.tenant, alert.source), set())
    if alert.account_digest is not None:
        candidates |= attacks.accounts.get((alert.tenant, alert.account_digest), set())
    slack = end_ms - start_ms
    names = sorted(n for n in candidates if scores[n].start_ms <= at_ms <= scores[n].end_ms + slack)
    return at_ms, names, None if names else "its subject is not part of any attack at that time"


class _TenantWindows:
    """Distinct accounts with untrusted password failures per tenant, in event order, with
    the attack (or None) whose failure first counted each: what rule 8 sums (and, with
    ``unknown_only``, the ``unknown_account`` ones ``stuffing_tenant`` sums)."""

    def __init__(self, events: Sequence[TruthEvent], policy: Policy = DEFAULT_POLICY) -> None:
        self.events = events
        self.policy = policy
        self._cache: dict[tuple[str, int, int, bool], list[tuple[int, str | None]]] = {}
        self._successes: dict[tuple[str, str], list[int]] | None = None
        self._strangers: dict[str, list[tuple[int, str, str | None]]] = {}

    def redeem_ms(self, tenant: str) -> int:
        return self.policy.for_tenant(tenant).strangers.redeem_ms

    def stranger_sources(
        self, tenant: str, start_ms: int, end_ms: int, redeem_ms: int
    ) -> dict[str | None, float]:
        """Who gave the sources the slow tier counted in the window, as the truth sees it
        (roughly): untrusted password failures at no known place (no success there within
        ``familiar.memory_ms``), of an account that had not succeeded there or with that
        client, nor failed so within ``tenant_spray.recount_ms``, that no success at the
        source followed within ``redeem_ms``: the attack (or None) of each source's first."""
        successes = self._success_times()
        rules = self.policy.for_tenant(tenant)
        memory_ms = rules.familiar.memory_ms
        seen: set[str] = set()
        tally: Counter[str | None] = Counter()
        for t, source, name in self._stranger_failures(tenant, rules.tenant_spray.recount_ms):
            if t < start_ms or t >= end_ms or source in seen:
                continue
            seen.add(source)
            times = successes.get((tenant, source), [])
            i = bisect.bisect_left(times, t)
            if i < len(times) and times[i] <= t + redeem_ms:
                continue  # redeemed
            if i > 0 and times[i - 1] > t - memory_ms:
                continue  # a known place: somebody signed in here before
            tally[name] += 1
        total = sum(tally.values())
        return {name: n / total for name, n in tally.items()} if total else {}

    def _success_times(self) -> dict[tuple[str, str], list[int]]:
        if self._successes is None:
            self._successes = defaultdict(list)
            for e in self.events:
                if e.attempt.success:
                    self._successes[(e.attempt.tenant, e.attempt.source)].append(e.occurred_ms)
        return self._successes

    def _stranger_failures(self, tenant: str, recount_ms: int) -> list[tuple[int, str, str | None]]:
        """(time, source, attack or None) of the tenant's unfamiliar untrusted password
        failures whose account had none in the ``recount_ms`` before, in event order."""
        cached = self._strangers.get(tenant)
        if cached is not None:
            return cached
        memory_ms = self.policy.for_tenant(tenant).familiar.memory_ms
        last_ok: dict[tuple[str, str | None, str | None], int] = {}
        last_failed: dict[str, int] = {}
        out: list[tuple[int, str, str | None]] = []
        for e in self.events:
            a = e.attempt
            if a.tenant != tenant:
                continue
            t = a.occurred_ms
            if a.success:
                last_ok[(a.account, a.source, None)] = t
                if a.device is not None:
                    last_ok[(a.account, None, a.device)] = t
                continue
            if not a.untrusted_password_failure:
                continue
            pair = last_ok.get((a.account, a.source, None), -memory_ms) > t - memory_ms
            client = a.device is not None and (
                last_ok.get((a.account, None, a.device), -memory_ms) > t - memory_ms
            )
            if pair or client:
                continue
            before = last_failed.get(a.account)
            last_failed[a.account] = t
            if before is not None and t - before <= recount_ms:
                continue
            out.append((t, a.source, e.scenario if e.role == ATTACKER else None))
        self._strangers[tenant] = out
        return out

    def _accounts(
        self, tenant: str, start_ms: int, end_ms: int, unknown_only: bool
    ) -> list[tuple[int, str | None]]:
        slot = (tenant, start_ms, end_ms, unknown_only)
        cached = self._cache.get(slot)
        if cached is not None:
            return cached
        seen: set[str] = set()
        out: list[tuple[int, str | None]] = []
        lo = bisect.bisect_left(self.events, start_ms, key=lambda e: e.occurred_ms)
        for e in self.events[lo:]:
            a = e.attempt
            if a.occurred_ms >= end_ms:
                break
            if a.tenant != tenant or not a.untrusted_password_failure or a.account in seen:
                continue
            if unknown_only and a.failure_reason != "unknown_account":
                continue
            seen.add(a.account)
            out.append((a.occurred_ms, e.scenario if e.role == ATTACKER else None))
        self._cache[slot] = out
        return out

    def contributions(
        self, tenant: str, start_ms: int, end_ms: int, count: int, *, unknown_only: bool = False
    ) -> tuple[int, dict[str | None, float]]:
        """When the window's ``count``-th account failed, and who gave the first ``count``."""
        accounts = self._accounts(tenant, start_ms, end_ms, unknown_only)[: max(count, 1)]
        if not accounts:
            return end_ms, {}
        tally = Counter(name for _, name in accounts)
        return accounts[-1][0], {name: n / len(accounts) for name, n in tally.items()}
