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

``replay_sessions`` also plays the login service's session review (``/v1/session``): a
session signed in from an untrusted client without a challenge is reviewed with the
core's ``review_session`` each time a wave challenge of its tenant is put while the
session is younger than ``REVIEW_HORIZON_MS`` (the assumption: a login service asks on
the requests of its young sessions, and a session makes one soon after the wave is put).
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.attempt import Attempt
from pipeline.core.decision_keys import keys_for, lock_key, mfa_account_key
from pipeline.core.decisions import Active, DecisionIndex, Verdict, active_of
from pipeline.core.keys import Key, decision_key, parse_key
from pipeline.core.policy import Policy
from pipeline.core.review import review_session
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
            active = active_of(d)
            pending = follower is not None and follower.decision is None and follower.after is None
            changes.append(_IndexChange(at, seq, "put", key, active, pending))
    changes.sort(key=lambda change: (change.at, change.seq))
    return changes


REVIEW_HORIZON_MS = 10 * 60_000
"""How long after its sign-in a session is still reviewed (``replay_sessions``)."""


def replay(
    events: Sequence[TruthEvent],
    records: Sequence[DecisionRecord],
    policy: Policy | None = None,
) -> list[Verdict]:
    """Each event's verdict under the decision stream, as a gateway would have given it
    (with ``policy``'s ``[verify]``, which the gateway's edge reads from the same file)."""
    return replay_sessions(events, records, policy)[0]


def _open_session(a: Attempt, verdict: Verdict) -> bool:
    """A sign-in the session review concerns: a password-flow success from an untrusted
    client, let through without a challenge."""
    return (
        a.success
        and a.password_flow
        and not (a.trusted and a.device)
        and verdict.allowed
        and verdict.challenge is None
    )


def replay_sessions(
    events: Sequence[TruthEvent],
    records: Sequence[DecisionRecord],
    policy: Policy | None = None,
) -> tuple[list[Verdict], set[int]]:
    """Each event's verdict, and the positions of the sign-ins a session review later
    stepped up (see the module docstring); ``policy`` sets ``[verify]``."""
    index = DecisionIndex(announce=False, policy=policy)
    sessions: dict[str, deque[int]] = defaultdict(deque)
    reviewed: set[int] = set()
    pending: dict[Key, str] = {}
    changes = _index_changes(events, records)
    verdicts: list[Verdict] = []
    cursor = 0

    def apply(change: _IndexChange, now_ms: int) -> None:
        if change.kind == "lift":
            index.lift(change.key)
            return
        assert change.active is not None
        index.put(change.key, change.active)
        if change.pending_lift:
            pending[change.key] = change.active.decision_id
        else:
            pending.pop(change.key, None)
        if change.key[0] == "tenant" and change.active.action == "challenge":
            tenant = change.key[1]
            _review(index, events, tenant, sessions[tenant], now_ms, reviewed)

    for i, event in enumerate(events):
        while cursor < len(changes) and changes[cursor].at <= i:
            apply(changes[cursor], event.occurred_ms)
            cursor += 1
        a = event.attempt
        verdict = index.check(keys_for(a), a.occurred_ms)
        verdicts.append(verdict)
        if _open_session(a, verdict):
            sessions[a.tenant].append(i)
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
    # Decisions after the last event (a wave the last attempts fired) still review the
    # sessions before them.
    for change in changes[cursor:]:
        apply(change, events[-1].occurred_ms)
    return verdicts, reviewed


def _review(
    index: DecisionIndex,
    events: Sequence[TruthEvent],
    tenant: str,
    open_sessions: deque[int],
    now_ms: int,
    reviewed: set[int],
) -> None:
    """Review the tenant's young sessions at ``now_ms``; forget those past the horizon."""
    while open_sessions and events[open_sessions[0]].occurred_ms < now_ms - REVIEW_HORIZON_MS:
        open_sessions.popleft()
    wave = index.get(("tenant", tenant, None, None, None))
    if wave is None or wave.since_ms < 0:
        return
    for i in reversed(open_sessions):  # newest first: those since the lead-in began
        if events[i].occurred_ms < wave.since_ms:
            break
        if i in reviewed:
            continue
        a = events[i].attempt
        step_up = review_session(
            index, a.tenant, a.account, a.source, a.device, a.occurred_ms, now_ms
        )
        if step_up is not None:
            reviewed.add(i)
