"""SourceState makes its rings on first use; its changelog records are unchanged."""

from __future__ import annotations

from pipeline.core.attempt import FAMILIAR, Attempt
from pipeline.core.engine import Engine
from pipeline.core.state import SourceState

T0 = 1_790_000_000_000


def _attempt(i: int, success: bool, reason: str | None = None) -> Attempt:
    return Attempt(
        event_id=f"e{i}",
        occurred_ms=T0 + i * 1000,
        tenant="t",
        account=f"acct{i}",
        source="10.0.0.1",
        device=None,
        session=None,
        trusted=False,
        flow="login",
        success=success,
        failure_reason=reason,
    )


def test_a_fresh_state_dumps_the_empty_rings_of_its_sizes() -> None:
    """SourceState(3, 4, 2) holds no ring and dumps the record the eager rings gave."""
    state = SourceState(3, 4, 2)
    assert (state._distinct, state._failures, state._unknown) == (None, None, None)
    assert (state._successes, state._challenges) == (None, None)
    assert state.dump() == [
        [-1, 0, 0, 0],
        [-1, 0, 0, 0, 0],
        [-1, 0, 0, 0, 0],
        0,
        0,
        0,
        "",
        0,
        -1,
        -1,
        0,
        "",
        [-1, 0, 0, 0, 0],
        [-1, 0, 0],
        -1,
        0,
        0,
        -1,
        0,
        "",
    ]


def test_a_ring_is_made_on_first_use_with_its_size() -> None:
    """Reading ``distinct`` makes a ring of the spray size; the others stay unmade."""
    state = SourceState(3, 4, 2)
    state.distinct.add(5)
    state.challenges.add(7)
    assert (state.distinct.size, state.distinct.head, state.distinct.total) == (3, 5, 1)
    assert (state.challenges.size, state.challenges.head) == (2, 7)
    assert (state._failures, state._unknown, state._successes) == (None, None, None)
    assert state.dump()[0] == [5, 0, 0, 1]
    assert state.dump()[13] == [7, 0, 1]


def test_records_load_and_dump_back_byte_for_byte() -> None:
    """Records of 20, 17, 13 and 10 fields: a never-used ring loads as none made and
    dumps back the same; a used one (head 9, all counts gone) stays a ring."""
    used = [9, 0, 0, 0]
    record: list[object] = [
        used,
        [-1, 0, 0],
        [-1, 0, 0],
        1,
        2,
        3,
        "d",
        4,
        5,
        6,
        7,
        "source",
        [-1, 0, 0],
        [-1, 0],
        8,
        1,
        0,
        -1,
        0,
        "",
    ]
    loaded = SourceState.load(record)
    assert loaded._distinct is not None and loaded._failures is None
    assert loaded.dump() == record
    assert SourceState.load(record[:17]).dump() == record
    assert SourceState.load(record[:13]).dump()[13:17] == [[-1, 0], -1, 0, 0]
    old = SourceState.load(record[:10])
    assert old.dump()[10:14] == [0, "source", [-1, 0], [-1, 0]]


def test_a_familiar_place_makes_no_ring_and_a_failure_makes_three() -> None:
    """The source stage's entry of a place made familiar holds no ring; a failure there
    makes distinct, failures and unknown (the stuffing signals), not challenges."""
    engine = Engine()
    engine.sources.step(_attempt(1, True, FAMILIAR), T0 + 1000, engine.out)
    (src,) = [s for _, s in engine.sources.tenant("t").sources.items()]
    assert (src._distinct, src._failures, src._unknown, src._challenges) == (None,) * 4
    assert src.vouch_count == 1
    engine.sources.step(_attempt(2, False, "bad_password"), T0 + 2000, engine.out)
    assert (src.distinct.total, src.failures.total, src.unknown.total) == (1, 1, 0)
    assert (src._successes, src._challenges) == (None, None)
