"""When the tenant's wave challenge was in force, against when attacks ran (the truth).

``wave_spans`` are the [issued, expires) spans of the rollup's tenant decisions, merged per
tenant. ``answers`` gives, per attacker (scenario, cohort, tenant), the seconds from its
first attempt until a wave challenge was in force (0 when one already was, None when none
came while it ran). ``attack_spans`` are the [first, last] password-attempt spans of
every attacker scenario per tenant, merged: a legitimate attempt challenged outside them was
challenged while no attack ran (a wave's hold after an attack counts as outside).
``near_attacks`` widens them by the tenant's ``near_margins_ms`` (the wave's lead-in and
first window before, its paced sum and hold after): a challenge or a review away from
every attack, beyond the detector's own lead-in and tail, is one ordinary traffic alone
brought on (a false wave).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.policy import DEFAULT_POLICY, Policy
from pipeline.sim.outputs import Outputs
from pipeline.sim.truth import ATTACKER, TruthEvent

Spans = dict[str, list[tuple[int, int]]]
"""Per tenant, merged [start, end) spans in order."""


def merge(spans: dict[str, list[tuple[int, int]]]) -> Spans:
    merged: Spans = {}
    for tenant, items in spans.items():
        out: list[tuple[int, int]] = []
        for start, end in sorted(items):
            if out and start <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((start, end))
        merged[tenant] = out
    return merged


def wave_spans(outputs: Outputs) -> Spans:
    """Per tenant, the [issued, expires) spans of its wave challenges, merged, in order."""
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for rec in outputs.decisions:
        d = rec.decision
        if d is not None and d.scope == "tenant" and d.device_id is None:  # not verify
            spans[d.tenant].append((datetime_to_ms(d.issued_at), datetime_to_ms(d.expires_at)))
    return merge(spans)


def attack_spans(events: Iterable[TruthEvent]) -> Spans:
    """Per tenant, the merged [first, last] attempt spans of its attacker scenarios."""
    first: dict[tuple[str, str], int] = {}
    last: dict[tuple[str, str], int] = {}
    for e in events:
        if e.role == ATTACKER and e.attempt.password_flow:
            key = (e.attempt.tenant, e.scenario)
            first.setdefault(key, e.occurred_ms)
            last[key] = e.occurred_ms
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for key, start in first.items():
        spans[key[0]].append((start, last[key] + 1))
    return merge(spans)


def near_margins_ms(policy: Policy, tenant: str) -> tuple[int, int]:
    """How far the tenant's wave challenge can reach around an attack, before its first
    attempt and after its last: the lead-in and the first detector window before (the
    session review reaches back ``wave.lead_in_ms`` from the end of the first firing
    window), the paced sum's ``slow_windows`` windows and ``wave.hold_ms`` after (a paced
    sum still fires while the attack's last windows are in it; the hold follows). With the
    strangers tier on, its reach too: its lead-in and first window before, and after, the
    ``redeem_ms`` it waits for a window to settle, twice its ``active_ms`` (the attack's
    last exits, then the tenant's own failures keeping the last minute at pace while those
    exits are still in the sum) and a window, then the hold."""
    rules = policy.for_tenant(tenant)
    window_ms = rules.tenant_spray.window_ms
    before = rules.wave.lead_in_ms + window_ms
    after = window_ms * rules.tenant_spray.slow_windows + rules.wave.hold_ms
    strangers = rules.strangers
    if strangers.enabled and rules.wave.lead_in_ms:
        before = max(before, strangers.lead_in_ms + window_ms)
    if strangers.enabled:
        reach = strangers.redeem_ms + 2 * strangers.active_ms + window_ms + rules.wave.hold_ms
        after = max(after, reach)
    return before, after


def near_attacks(running: Spans, policy: Policy = DEFAULT_POLICY) -> Spans:
    """``attack_spans`` widened by each tenant's ``near_margins_ms`` under ``policy``, merged."""
    widened: Spans = {}
    for tenant, items in running.items():
        before, after = near_margins_ms(policy, tenant)
        widened[tenant] = [(start - before, end + after) for start, end in items]
    return merge(widened)


def during(spans: Spans, tenant: str, t_ms: int) -> bool:
    items = spans.get(tenant)
    if not items:
        return False
    i = bisect_right(items, (t_ms, 1 << 62)) - 1
    return i >= 0 and items[i][0] <= t_ms < items[i][1]


def answers(events: Sequence[TruthEvent], waves: Spans) -> list[dict[str, Any]]:
    """Per attacker (scenario, cohort, tenant): its first attempt, and the seconds until a
    wave challenge was in force (None: none while it ran)."""
    runs: dict[tuple[str, str, str], list[int]] = {}
    for e in events:
        if e.role == ATTACKER and e.attempt.password_flow:
            key = (e.scenario, e.cohort, e.attempt.tenant)
            span = runs.setdefault(key, [e.occurred_ms, e.occurred_ms])
            span[1] = e.occurred_ms
    out = []
    for (scenario, cohort, tenant), (start, end) in sorted(runs.items()):
        after = None
        for w_start, w_end in waves.get(tenant, []):
            if w_end > start and w_start <= end:
                after = max(0, w_start - start) / 1000
                break
        out.append(
            {
                "attack": scenario,
                "cohort": cohort,
                "tenant": tenant,
                "first_attempt_ms": start,
                "challenged_after_s": after,
            }
        )
    return out
