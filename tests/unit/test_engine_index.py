"""A reader's ``DecisionIndex`` with its familiar exempts in the compiled engine's store
(issue 45) against the same index on the dict alone (the reference): a differential test
of every answer the edge and a replay read."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.decision_keys import applicable_keys
from pipeline.core.decisions import FAMILIAR_RULE, Active, DecisionIndex
from pipeline.core.errors import CoreError
from pipeline.core.familiar_store import familiar_engine
from pipeline.core.keys import Key
from pipeline.core.review import review_session
from tests.unit.test_core_support import policy

try:
    import authpipe_engine as engine
except ImportError as exc:  # never skipped: an unbuilt engine is a failure that says why
    raise ImportError("authpipe_engine is not installed: run scripts/build-engine") from exc

T, A, S, D = "acme", "a" * 32, "198.51.100.1", "d" * 32
PAIR: Key = ("familiar", T, A, S, None)


def _pair(index: DecisionIndex) -> Active | None:
    return index.get(PAIR)


def test_a_reader_keeps_familiar_exempts_in_the_store_a_worker_in_the_dict() -> None:
    """announce off with the engine: the exempt is in the store (the dict empty), read back
    with its decision id as the fingerprint's hex; a worker's index keeps the dict."""
    reader = DecisionIndex(announce=False, engine=engine)
    reader.put(PAIR, Active("d1", "exempt", 5_000, FAMILIAR_RULE, None, 1_000))
    fingerprint = f"{engine.id_fingerprint('d1'):016x}"
    assert (len(reader), reader.items(), reader.familiar_alive(4_999)) == (1, [], 1)
    assert _pair(reader) == Active(fingerprint, "exempt", 5_000, FAMILIAR_RULE, None, 1_000)
    assert reader.lift(PAIR) == Active(fingerprint, "exempt", 5_000, FAMILIAR_RULE, None, 1_000)
    assert (len(reader), reader.lift(PAIR)) == (0, None)
    worker = DecisionIndex(engine=engine)
    worker.put(PAIR, Active("d1", "exempt", 5_000, FAMILIAR_RULE))
    assert (worker.familiar_alive(0), worker.get(PAIR)) == (
        0,
        Active("d1", "exempt", 5_000, "familiar"),
    )


def test_another_decision_on_a_familiar_key_goes_to_the_dict_and_replaces_the_record() -> None:
    """A familiar key's decision the store cannot hold (not a plain exempt) replaces its
    record in the dict, and an exempt after it replaces it back in the store."""
    index = DecisionIndex(announce=False, engine=engine)
    index.put(PAIR, Active("d1", "exempt", 5_000, FAMILIAR_RULE))
    index.put(PAIR, Active("d2", "block", 6_000, "manual"))
    assert (len(index), index.get(PAIR)) == (1, Active("d2", "block", 6_000, "manual"))
    index.put(PAIR, Active("d3", "exempt", 7_000, FAMILIAR_RULE))
    assert (len(index), index.items(), index.get(PAIR).expires_ms) == (1, [], 7_000)  # type: ignore[union-attr]


@pytest.mark.parametrize("store", [None, engine], ids=["dict", "store"])
def test_an_exempt_in_the_store_covers_until_its_expiry_not_at_it(store: Any) -> None:
    """The pair's exempt voids the wave's CAPTCHA and the verify step-up at 4,999 ms, not
    at its expiry (5,000), in check and unfamiliar alike, from the dict or the store."""
    index = DecisionIndex(announce=False, policy=policy(verify={"mode": "enforce"}), engine=store)
    index.put(PAIR, Active("d1", "exempt", 5_000, FAMILIAR_RULE, None, 0))
    index.put(("tenant", T, None, None, None), Active("w", "challenge", 9_000, "tenant", "captcha"))
    keys = applicable_keys(T, A, S, None, None, False, "login")
    before, at = index.check(keys, 4_999), index.check(keys, 5_000)
    assert (before.challenge, before.step_up, at.challenge, at.step_up) == (
        None,
        False,
        "captcha",
        True,
    )
    fast = (index.unfamiliar(T, A, S, None, 4_999), index.unfamiliar(T, A, S, None, 5_000))
    assert [(v.challenge, v.step_up) for v in fast] == [(None, False), ("step_up", True)]


def test_the_engine_is_chosen_by_name_and_a_bad_name_says_what_is_allowed() -> None:
    """AUTHPIPE_ENGINE: python never uses the engine, rust requires it, other names are
    refused with the names allowed."""
    assert (familiar_engine("python"), familiar_engine("rust")) == (None, engine)
    with pytest.raises(CoreError, match="is not one of auto, python, rust"):
        familiar_engine("numba")


TENANTS = ("acme", "acme", "acme", "beta")  # mostly one tenant: records meet its checks
ACCOUNTS = ("a1", "a2")
SOURCES = ("198.51.100.1", "198.51.100.2")
DEVICES = ("d1",)
TIMES = st.integers(0, 60)
tenant, account, source, device = (
    st.sampled_from(x) for x in (TENANTS, ACCOUNTS, SOURCES, DEVICES)
)
FAMILIAR = st.one_of(
    st.tuples(st.just("familiar"), tenant, account, source, st.none()),
    st.tuples(st.just("familiar"), tenant, account, st.none(), device),
    st.tuples(st.just("familiar"), tenant, st.none(), source, st.none()),
)
OTHER = st.one_of(
    st.tuples(st.just("source"), tenant, st.none(), source, st.none()),
    st.tuples(st.just("account_source"), tenant, account, source, st.none()),
    st.tuples(st.just("tenant"), tenant, st.none(), st.none(), st.none()),
    st.tuples(st.just("tenant"), tenant, st.none(), st.none(), st.none()),  # waves meet exempts
    st.tuples(st.just("passed"), tenant, account, st.none(), device),
    st.tuples(st.just("passed"), tenant, account, source, st.none()),
)
ACTIONS = st.sampled_from(("exempt", "exempt", "exempt", "block", "challenge", "observe"))
OPS = st.one_of(
    st.tuples(st.just("put"), st.one_of(FAMILIAR, FAMILIAR, OTHER), ACTIONS, TIMES, TIMES),
    st.tuples(st.just("lift"), st.one_of(FAMILIAR, OTHER)),
    st.tuples(st.just("prune"), TIMES),
    st.tuples(
        st.just("check"), tenant, account, source, st.none() | device, st.booleans(), TIMES, TIMES
    ),
)


def _active(key: Key, action: str, expires_ms: int, since_ms: int, n: int) -> Active:
    """A decision as the feed would index it: a familiar key's is an exempt (only that
    scope has them); a wave's a challenge with its lead-in start."""
    if key[0] == "familiar":
        return Active(f"i{n}", "exempt", expires_ms, FAMILIAR_RULE, None, since_ms)
    if key[0] == "passed":  # a CAPTCHA passed: an exempt the dict keeps
        return Active(f"i{n}", "exempt", expires_ms, "passed", None, since_ms)
    if action in ("exempt", "challenge") or key[0] == "tenant":
        kind = "step_up" if since_ms % 2 else "captcha"
        return Active(f"i{n}", "challenge", expires_ms, key[0], kind, since_ms)
    return Active(f"i{n}", action, expires_ms, key[0], None, since_ms)


def _as_stored(entry: Active | None) -> Any:
    """A reference entry as the store gives it back: a familiar exempt's id as its
    fingerprint."""
    if entry is None or entry.action != "exempt" or entry.rule != FAMILIAR_RULE:
        return entry
    return entry._replace(decision_id=f"{engine.id_fingerprint(entry.decision_id):016x}")


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(("off", "observe", "enforce")), st.lists(OPS, min_size=20, max_size=80))
def test_a_reader_answers_alike_with_and_without_the_store(mode: str, ops: list[Any]) -> None:
    """Random decisions (familiar exempts mostly; source, pair, wave and passed-CAPTCHA
    decisions), lifts, prunes and checks: the index on the store and on the
    dict give equal verdicts (check, unfamiliar, review_session), entries, lengths and
    pruned keys (the store's own left unnamed)."""
    pol = policy(verify={"mode": mode})
    ref = DecisionIndex(announce=False, policy=pol, engine=None)
    new = DecisionIndex(announce=False, policy=pol, engine=engine)
    stored: dict[Key, bool] = {}  # per key: is its decision a familiar exempt (the store's)
    for n, op in enumerate(ops):
        if op[0] == "put":
            _, key, action, expires_ms, since_ms = op
            active = _active(key, action, expires_ms, since_ms, n)
            stored[key] = active.rule == FAMILIAR_RULE
            ref.put(key, active)
            new.put(key, active)
        elif op[0] == "lift":
            assert new.lift(op[1]) == _as_stored(ref.lift(op[1]))
        elif op[0] == "prune":
            expected = [k for k in ref.prune(op[1]) if not stored[k]]
            assert sorted(new.prune(op[1]), key=repr) == sorted(expected, key=repr)
        else:
            _, t, a, s, d, password, signed_in_ms, now_ms = op
            flow = "login" if password else "uia"
            keys = applicable_keys(t, a, s, d, None, False, flow)
            assert new.check(keys, now_ms) == ref.check(keys, now_ms)
            assert new.unfamiliar(t, a, s, d, now_ms) == ref.unfamiliar(t, a, s, d, now_ms)
            assert review_session(new, t, a, s, d, signed_in_ms, now_ms) == review_session(
                ref, t, a, s, d, signed_in_ms, now_ms
            )
        assert len(new) == len(ref)
        for key in stored:
            assert new.get(key) == _as_stored(ref.get(key))
