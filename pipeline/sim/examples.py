"""One refused attempt as an example row (the scorecard's and the backtest's JSON and text).

Each field is defined once here; a caller names the fields it shows, in its order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pipeline.core.decisions import Verdict
from pipeline.sim.card import ts
from pipeline.sim.truth import TruthEvent


def refused_by(verdict: Verdict) -> str | None:
    """The key of the decision that refused the attempt, ``-`` for its empty parts."""
    key = verdict.matched_key
    return "|".join(part or "-" for part in key) if key else None


_FIELDS: dict[str, Callable[[TruthEvent, Verdict], Any]] = {
    "event_id": lambda event, _: event.event_id,
    "at": lambda event, _: ts(event.occurred_ms),
    "account": lambda event, _: event.account_plain,
    "role": lambda event, _: event.role,
    "cohort": lambda event, _: event.cohort,
    "actor": lambda event, _: event.actor,
    "flow": lambda event, _: event.attempt.flow,
    "success": lambda event, _: event.attempt.success,
    "refused_by": lambda _, verdict: refused_by(verdict),
    "retry_after_ms": lambda _, verdict: verdict.retry_after_ms,
}


def example(event: TruthEvent, verdict: Verdict, fields: Sequence[str]) -> dict[str, Any]:
    """The ``fields`` of a refused attempt, in that order."""
    return {name: _FIELDS[name](event, verdict) for name in fields}
