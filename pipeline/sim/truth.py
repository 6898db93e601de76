"""The ground truth: labelled, normalised events in the order the stream applies them.

A truth row is ``{"event", "scenario", "role", "actor", "cohort"}`` (``authpipe simulate``
writes them); a bare wire event is read as an unlabelled one (every label ``unknown``).
Roles: ``attacker``, ``owner`` and ``legit``; the last two are the legitimate ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from pipeline.contracts.codec import DecodeError, decode_attempt
from pipeline.core.attempt import Attempt, Normaliser
from pipeline.core.errors import InvalidAttempt
from pipeline.logs import get_logger
from pipeline.sim.errors import ScorecardError

log = get_logger("scorecard")

LEGIT_ROLES = frozenset({"legit", "owner"})
ATTACKER = "attacker"
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class TruthEvent:
    """One labelled, normalised event; ``index`` is its position in event-time order."""

    index: int
    event_id: str
    scenario: str
    role: str
    actor: str
    cohort: str
    account_plain: str
    attempt: Attempt

    @property
    def occurred_ms(self) -> int:
        return self.attempt.occurred_ms


def load_truth(path: Path, normaliser: Normaliser) -> list[TruthEvent]:
    """Truth rows (or bare wire events, labelled ``unknown``), sorted by event time.

    Lines that are not valid events are counted and skipped with a warning: the worker
    dead-letters them, so they never had a decision either.
    """
    if not path.is_file():
        raise ScorecardError(f"truth file {path} does not exist; write one with authpipe simulate")
    rows: list[tuple[int, int, TruthEvent]] = []
    bad = 0
    with path.open("rb") as handle:
        for number, line in enumerate(handle):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
                event = row.get("event", row) if isinstance(row, dict) else row
                wire = decode_attempt(orjson.dumps(event), max_bytes=1 << 20)
                attempt = normaliser.normalise(wire)
            except (orjson.JSONDecodeError, DecodeError, InvalidAttempt):
                bad += 1
                continue
            labelled = "event" in row
            truth = TruthEvent(
                index=0,
                event_id=wire.event_id,
                scenario=row.get("scenario", UNKNOWN) if labelled else UNKNOWN,
                role=row.get("role", UNKNOWN) if labelled else UNKNOWN,
                actor=row.get("actor", UNKNOWN) if labelled else UNKNOWN,
                cohort=row.get("cohort", UNKNOWN) if labelled else UNKNOWN,
                account_plain=wire.account,
                attempt=attempt,
            )
            rows.append((attempt.occurred_ms, number, truth))
    if bad:
        log.warning("truth_lines_skipped", path=str(path), lines=bad)
    # Event time, then event id: the order every stage of the stream applies events in
    # (``pipeline.core.engine.replay_order``), so a replay reproduces the live outputs.
    rows.sort(key=lambda r: (r[0], r[2].event_id, r[1]))
    return [reindex(truth, i) for i, (_, _, truth) in enumerate(rows)]


def reindex(truth: TruthEvent, index: int) -> TruthEvent:
    return TruthEvent(
        index,
        truth.event_id,
        truth.scenario,
        truth.role,
        truth.actor,
        truth.cohort,
        truth.account_plain,
        truth.attempt,
    )
