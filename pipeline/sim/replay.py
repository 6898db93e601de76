"""Which attempts a gateway would have refused: the decision stream replayed in event time.

The simulator models no enforcement (see ``pipeline.sim``), so refusals are found by
replaying the decision stream into a ``DecisionIndex`` in event time and checking every
attempt at its ``occurred_at``, exactly as a gateway would have:

* a decision applies from its ``issued_at``: to attempts strictly later in event time
  (from a topic), or from the next attempt (engine runs record the exact position);
* a tombstone lifts its key's decision. Records from a topic carry no event time, so a
  tombstone is placed where the core lifts early: at the first later success that
  clears that key (a password-flow success clears its (account, source) block and, on
  a trusted device, its device block; a uia or mfa success clears its own bucket). A
  tombstone with no such success is an expiry, which ``expires_at`` already enforces;
* on a compacted topic a decision superseded by a later one for the same key may be
  gone; the scorecard then sees only the later one (read soon after a run, or use files).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.attempt import Attempt
from pipeline.core.decisions import (
    Active,
    DecisionIndex,
    Verdict,
    keys_for,
    lock_key,
    mfa_account_key,
)
from pipeline.core.keys import Key, decision_key, parse_key
from pipeline.sim.outputs import DecisionRecord
from pipeline.sim.truth import TruthEvent


def lifted_keys(a: Attempt) -> tuple[Key, ...]:
    """The decision keys a success clears early (the core's success semantics)."""
    if not a.success:
        return ()
    if a.password_flow:
        pair = decision_key("account_source", a.tenant, a.account, a.source, None)
        lock = lock_key(a.tenant, a.account)
        if a.trusted and a.device:
            # The lock is lifted by a trusted success only under the lifetime bound
            # (``replay`` checks the rule of the decision in force).
            return (pair, decision_key("device", a.tenant, a.account, None, a.device), lock)
        return (pair, lock)
    if a.flow == "reset":
        # A reset proven through the mailbox ends the run (``AccountShard._reset``).
        return (
            decision_key("account_source", a.tenant, a.account, a.source, None),
            lock_key(a.tenant, a.account),
            decision_key("account", a.tenant, a.account, None, None),
            mfa_account_key(a.tenant, a.account),
        )
    if a.flow == "challenge":
        return ()  # a passed challenge is the source stage's evidence; it lifts nothing
    return keys_for(a)[1:]


@dataclass(frozen=True, slots=True)
class _IndexChange:
    """One change of the replayed ``DecisionIndex``: put a decision or lift a key."""

    at: int  # applied before the event with this index
    seq: int
    kind: str  # put | lift
    key: Key
    active: Active | None = None
    pending_lift: bool = False


def _index_changes(
    events: Sequence[TruthEvent], records: Sequence[DecisionRecord]
) -> list[_IndexChange]:
    """The records as index changes, in the order they apply (position, then record order)."""
    times = [e.occurred_ms for e in events]
    per_key: dict[str, list[tuple[int, DecisionRecord]]] = defaultdict(list)
    for seq, rec in enumerate(records):
        per_key[rec.key].append((seq, rec))
    changes: list[_IndexChange] = []
    for wire_key, recs in per_key.items():
        key = parse_key(wire_key)
        for i, (seq, rec) in enumerate(recs):
            follower = recs[i + 1][1] if i + 1 < len(recs) else None
            if rec.decision is None:
                if rec.after is not None:
                    changes.append(_IndexChange(rec.after, seq, "lift", key))
                continue
            d = rec.decision
            issued = datetime_to_ms(d.issued_at)
            at = rec.after if rec.after is not None else bisect.bisect_right(times, issued)
            active = Active(
                d.decision_id, d.action, datetime_to_ms(d.expires_at), d.rule, d.challenge
            )
            pending = follower is not None and follower.decision is None and follower.after is None
            changes.append(_IndexChange(at, seq, "put", key, active, pending))
    changes.sort(key=lambda change: (change.at, change.seq))
    return changes


def replay(events: Sequence[TruthEvent], records: Sequence[DecisionRecord]) -> list[Verdict]:
    """Each event's verdict under the decision stream, as a gateway would have given it."""
    index = DecisionIndex(announce=False)
    pending: dict[Key, str] = {}
    changes = _index_changes(events, records)
    verdicts: list[Verdict] = []
    cursor = 0
    for i, event in enumerate(events):
        while cursor < len(changes) and changes[cursor].at <= i:
            change = changes[cursor]
            cursor += 1
            if change.kind == "lift":
                index.lift(change.key)
                continue
            assert change.active is not None
            index.put(change.key, change.active)
            if change.pending_lift:
                pending[change.key] = change.active.decision_id
            else:
                pending.pop(change.key, None)
        a = event.attempt
        verdicts.append(index.check(keys_for(a), a.occurred_ms))
        if a.success and pending:
            for key in lifted_keys(a):
                current = index.get(key)
                if (
                    key[0] == "lock"
                    and a.trusted
                    and a.flow != "reset"
                    and current is not None
                    and current.rule != "lifetime_bound"
                ):
                    continue
                if current is not None and pending.get(key) == current.decision_id:
                    index.lift(key)
                    del pending[key]
    return verdicts
