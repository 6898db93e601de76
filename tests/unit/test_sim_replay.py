"""The scorecard's replay of a decision stream read from the topic (``pipeline.sim.replay``):
records without positions give the engine's verdicts."""

from __future__ import annotations

from pipeline.core.policy import DEFAULT_POLICY
from pipeline.sim.outputs import DecisionRecord, run_engine
from pipeline.sim.replay import replay
from pipeline.sim.truth import TruthEvent
from tests.unit.test_core_support import MIN, SEC, att


def test_a_topic_replay_lifts_what_a_mailbox_reset_ends() -> None:
    """The scorecard's replay of the decision topic (records without positions) lifts the
    pair's block at the reset, as the engine does: the sign-in with the new password is
    allowed in both (it was refused by the stale account_source block before)."""
    events = [
        TruthEvent(i, a.event_id, "s", "legit", "actor", "forgot_password", "plain", a)
        for i, a in enumerate(
            [
                *(att(i * 5 * SEC) for i in range(5)),
                att(3 * MIN, flow="reset", success=True),
                att(3 * MIN + 20 * SEC, success=True),
            ]
        )
    ]
    outputs = run_engine(events, DEFAULT_POLICY)
    assert outputs.verdicts is not None
    unpositioned = [DecisionRecord(r.key, r.decision) for r in outputs.decisions]
    replayed = replay(events, unpositioned)
    assert [v.allowed for v in replayed] == [v is None or v.allowed for v in outputs.verdicts]
    assert replayed[-1].allowed is True
