"""A policy's outputs over a run (decision records and alerts), and the core run giving them.

Wherever they come from (the topics, ``pipeline.sim.topics``; files,
``pipeline.sim.output_files``; the core ``Engine``, ``run_engine``), the outputs are the
same records; an engine run also knows each record's exact position in the events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.contracts.models import Alert, Decision
from pipeline.core.decisions import Verdict
from pipeline.core.engine import Engine
from pipeline.core.policy import Policy
from pipeline.sim.truth import TruthEvent


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One record of the decision stream; ``decision`` None is a tombstone. ``after`` is
    the number of events applied before it was emitted (known for engine runs only)."""

    key: str
    decision: Decision | None
    after: int | None = None


@dataclass(frozen=True, slots=True)
class AlertRecord:
    alert: Alert
    after: int | None = None


@dataclass
class Outputs:
    """A policy's outputs over a run, from wherever they came."""

    origin: str
    decisions: list[DecisionRecord] = field(default_factory=list)
    alerts: list[AlertRecord] = field(default_factory=list)
    verdicts: list[Verdict | None] | None = None  # the engine's own, for cross-checks
    missing_decision_records: int = 0  # offsets of the decision topic compacted away


def run_engine(events: Sequence[TruthEvent], policy: Policy) -> Outputs:
    """The core's outputs for the events (in ``load_truth``'s order: event time, then
    event id), with each record's exact position; ``Engine.finish`` at the end, as the
    stream does once its input is idle. ``backtest`` and ``scorecard --engine`` both
    call this, so they give the same answer."""
    engine = Engine(policy)
    out = engine.out
    outputs = Outputs(origin=f"engine:{policy.policy_version}", verdicts=[])
    assert outputs.verdicts is not None
    now = 0
    for position, event in enumerate(events, start=1):
        attempt = event.attempt
        now = max(now, attempt.occurred_ms)
        outputs.verdicts.append(engine.step(attempt, now))
        if out.decisions or out.exempts:
            # The order the stream sends them in (``pipeline.stream.envelopes.collect``).
            outputs.decisions.extend(DecisionRecord(k, d, position) for k, d in out.decisions)
            outputs.decisions.extend(
                DecisionRecord(k, Decision.model_validate_json(raw), position)
                for k, raw in out.exempts
            )
            out.decisions.clear()
            out.exempts.clear()
        if out.alerts:
            outputs.alerts.extend(AlertRecord(a, position) for a in out.alerts)
            out.alerts.clear()
    engine.finish()
    outputs.decisions.extend(DecisionRecord(k, d, len(events)) for k, d in out.decisions)
    outputs.alerts.extend(AlertRecord(a, len(events)) for a in out.alerts)
    out.decisions.clear()
    out.alerts.clear()
    return outputs
