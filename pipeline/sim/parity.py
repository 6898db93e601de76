"""Live vs replay: does a replay of the events reproduce what the worker published?

The stream applies every stage's rows in event-time order (``pipeline.core.sequence``),
so the same events and policy give the same decisions and alerts live and in the core
``Engine`` over the events sorted by ``(occurred_ms, event_id)``. This compares the two
as sets of whole records (every field, ids and timestamps included; a record the worker
sent twice, as it may after a crash when it applies an envelope again, is one record:
the copies are identical and counted as ``resent``):

* decisions: every published decision (tombstones are not compared: the worker also
  tombstones decisions whose expiry passed on the wall clock, so an idle topic forgets
  them, and a replay has no wall clock);
* alerts: every alert.

A difference means an event broke the documented bound (an input partition not in
event-time order, a row later than its partition's mark, a reorder buffer past its cap)
or the live outputs were read incompletely (e.g. a compacted decision topic read long
after the run: read it soon, or save the outputs with ``scorecard --save-outputs``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipeline.sim.outputs import Outputs


def _decisions(outputs: Outputs) -> Counter[str]:
    return Counter(
        rec.decision.model_dump_json() for rec in outputs.decisions if rec.decision is not None
    )


def _alerts(outputs: Outputs) -> Counter[str]:
    return Counter(rec.alert.model_dump_json() for rec in outputs.alerts)


def _resent(records: Counter[str]) -> int:
    return sum(n - 1 for n in records.values())


@dataclass
class Parity:
    """How a replay's outputs compare with the live ones."""

    live_decisions: int
    replay_decisions: int
    live_alerts: int
    replay_alerts: int
    decisions_only_live: list[str] = field(default_factory=list)
    decisions_only_replay: list[str] = field(default_factory=list)
    alerts_only_live: list[str] = field(default_factory=list)
    alerts_only_replay: list[str] = field(default_factory=list)
    resent: int = 0  # live records sent more than once (identical copies)

    @property
    def decisions_differ(self) -> int:
        return len(self.decisions_only_live) + len(self.decisions_only_replay)

    @property
    def alerts_differ(self) -> int:
        return len(self.alerts_only_live) + len(self.alerts_only_replay)

    @property
    def equal(self) -> bool:
        return not self.decisions_differ and not self.alerts_differ

    def render(self) -> str:
        line = (
            f"live vs replay: {self.decisions_differ} decisions differ "
            f"(live {self.live_decisions}, replay {self.replay_decisions}), "
            f"{self.alerts_differ} alerts differ (live {self.live_alerts}, replay {self.replay_alerts})"
            + (f"; {self.resent} live records sent twice (after a restart)" if self.resent else "")
        )
        examples = [f"  only live:   {d}" for d in self.decisions_only_live[:3]]
        examples += [f"  only replay: {d}" for d in self.decisions_only_replay[:3]]
        examples += [f"  only live:   {a}" for a in self.alerts_only_live[:3]]
        examples += [f"  only replay: {a}" for a in self.alerts_only_replay[:3]]
        return "\n".join([line, *examples])

    def as_json(self) -> dict[str, Any]:
        return {
            "equal": self.equal,
            "resent": self.resent,
            "decisions": {
                "live": self.live_decisions,
                "replay": self.replay_decisions,
                "differ": self.decisions_differ,
                "only_live": self.decisions_only_live,
                "only_replay": self.decisions_only_replay,
            },
            "alerts": {
                "live": self.live_alerts,
                "replay": self.replay_alerts,
                "differ": self.alerts_differ,
                "only_live": self.alerts_only_live,
                "only_replay": self.alerts_only_replay,
            },
        }


def compare(replay: Outputs, live: Outputs) -> Parity:
    """Set differences of whole decision and alert records (see the module docstring);
    the counts are of distinct records."""
    live_d, replay_d = _decisions(live), _decisions(replay)
    live_a, replay_a = _alerts(live), _alerts(replay)
    return Parity(
        live_decisions=len(live_d),
        replay_decisions=len(replay_d),
        live_alerts=len(live_a),
        replay_alerts=len(replay_a),
        decisions_only_live=sorted(set(live_d) - set(replay_d)),
        decisions_only_replay=sorted(set(replay_d) - set(live_d)),
        alerts_only_live=sorted(set(live_a) - set(replay_a)),
        alerts_only_replay=sorted(set(replay_a) - set(live_a)),
        resent=_resent(live_d) + _resent(live_a),
    )
