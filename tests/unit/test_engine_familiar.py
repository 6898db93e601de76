"""The compiled engine's familiar store (engine/, ``authpipe_engine.FamiliarStore``): exact
values, bad input, and a differential test against the core's ``DecisionIndex``, whose
familiar exempts it is to hold at the edge (issue 45)."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.decisions import Active, DecisionIndex
from pipeline.core.keys import Key
from pipeline.core.policy import Policy

try:
    import authpipe_engine as engine
except ImportError as exc:  # never skipped: an unbuilt engine is a failure that says why
    raise ImportError("authpipe_engine is not installed: run scripts/build-engine") from exc

Parts = tuple[str, str | None, str | None, str | None]


def reference_digest(
    tenant: str, account: str | None, source: str | None, device: str | None
) -> bytes:
    """The digest's specification (engine/src/digest.rs), in Python."""
    data = [b"authpipe-familiar-v1\x00"]
    for part in (tenant, account, source, device):
        if part is None:
            data.append(b"\xff\xff\xff\xff")
        else:
            raw = part.encode("utf-8", "surrogatepass")
            data.append(struct.pack("<I", len(raw)) + raw)
    return hashlib.blake2b(b"".join(data), digest_size=16).digest()


def reference_fingerprint(decision_id: str) -> int:
    raw = b"authpipe-decision-id-v1\x00" + decision_id.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


def digest(parts: Parts) -> bytes:
    return engine.familiar_digest(*parts)


def pack(parts: Parts, expires_ms: int, since_ms: int = -1, id_fp: int = 0) -> bytes:
    return struct.pack(engine.RECORD_FORMAT, digest(parts), expires_ms, since_ms, id_fp)


PAIR: Parts = ("acme", "9edd5c6a2f0b4b1c8d3e7f6a5b4c3d2e", "203.0.113.7", None)
CLIENT: Parts = (
    "acme",
    "9edd5c6a2f0b4b1c8d3e7f6a5b4c3d2e",
    None,
    "0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f",
)
PLACE: Parts = ("acme", None, "203.0.113.7", None)


# -- exact values -----------------------------------------------------------------------


def test_the_digest_and_fingerprint_are_the_specified_blake2b() -> None:
    """familiar_digest and id_fingerprint equal their Python specification and pinned values."""
    assert digest(PAIR).hex() == "95b1d3cb593e95dd78bddc65f8894aae"
    assert digest(PAIR) == reference_digest(*PAIR)
    for parts in (CLIENT, PLACE, ("t", "a\ud800", None, "d"), ("t", "ab", None, "c")):
        assert digest(parts) == reference_digest(*parts)
    assert digest(("t", "ab", None, "c")) != digest(("t", "a", None, "bc"))
    assert digest(("t", "a", "s", None)) != digest(("t", "a", None, "s"))
    assert engine.id_fingerprint("4f1c0a") == 7616644563476070231
    assert engine.id_fingerprint("4f1c0a") == reference_fingerprint("4f1c0a")
    assert (engine.KEY_BYTES, engine.RECORD_BYTES, struct.calcsize(engine.RECORD_FORMAT)) == (
        16,
        40,
        40,
    )


def test_put_get_and_the_expiry_boundary() -> None:
    """A record is alive strictly before its expiry, as DecisionIndex.check reads it."""
    store = engine.FamiliarStore()
    store.put(digest(PAIR), 1_000, 400, 7)
    assert store.get(digest(PAIR)) == (1_000, 400, 7)
    assert store.expiry(digest(PAIR)) == 1_000
    assert (store.contains_at(digest(PAIR), 999), store.contains_at(digest(PAIR), 1_000)) == (
        True,
        False,
    )
    assert store.familiar_at(*PAIR, 999) is True
    assert store.get_key(*PAIR) == (1_000, 400, 7)
    assert (store.get(digest(CLIENT)), store.familiar_at(*CLIENT, 0)) == (None, False)
    store.put(digest(PAIR), 500, 450, 8)  # the last put wins, even an earlier expiry
    assert (store.get(digest(PAIR)), len(store)) == ((500, 450, 8), 1)


def test_lift_with_a_fingerprint_removes_only_that_record() -> None:
    """A stale lift (another decision id) leaves the newer record; no id lifts whatever is there."""
    store = engine.FamiliarStore()
    store.put(digest(PAIR), 1_000, 0, 8)
    assert store.lift(digest(PAIR), 7) is False
    assert store.get(digest(PAIR)) == (1_000, 0, 8)
    assert store.lift(digest(PAIR), 8) is True
    assert (store.get(digest(PAIR)), len(store)) == (None, 0)
    store.put(digest(PAIR), 1_000, 0, 9)
    assert (store.lift(digest(PAIR)), store.lift(digest(PAIR)), len(store)) == (True, False, 0)


def test_put_many_in_order_and_prune() -> None:
    """put_many applies packed records in order (the last of a key wins); prune removes at or
    before now and says how many; prune_keys names them."""
    store = engine.FamiliarStore()
    packed = pack(PAIR, 100) + pack(CLIENT, 200, 5, 3) + pack(PLACE, 300) + pack(PAIR, 150, 9, 4)
    assert store.put_many(packed) == 4
    assert (len(store), store.get(digest(PAIR)), store.get(digest(CLIENT))) == (
        3,
        (150, 9, 4),
        (200, 5, 3),
    )
    assert store.count_alive(150) == 2
    assert store.prune(150) == 1
    assert store.prune_keys(200) == [digest(CLIENT)]
    assert (len(store), store.items()) == (1, [(digest(PLACE), 300, -1, 0)])


def test_prune_step_sweeps_the_whole_table_in_bounded_steps() -> None:
    """prune_step looks at max_slots slots per call, wrapping: slot_count / max_slots calls
    remove every expired record."""
    store = engine.FamiliarStore()
    store.put_many(b"".join(pack(("t", f"a{n}", "s", None), 10 + n % 2) for n in range(1_000)))
    slots = store.slot_count()
    assert (slots, store.approx_bytes()) == (1_178, 1_178 * 41 + 80)
    removed = [store.prune_step(10, 100) for _ in range(-(-slots // 100))]
    assert (sum(removed), len(store), store.count_alive(10)) == (500, 500, 500)
    assert store.prune_step(11, slots) == 500
    assert len(store) == 0


def test_reserve_then_load_never_rehashes_and_stays_compact() -> None:
    """A store reserved for N records holds them in its first allocation, 48 bytes a record."""
    store = engine.FamiliarStore(10_000)
    slots = store.slot_count()
    store.put_many(b"".join(pack(("t", f"a{n}", "s", None), 5) for n in range(10_000)))
    assert (len(store), store.slot_count()) == (10_000, slots)
    assert store.approx_bytes() // 10_000 == 48


# -- bad input --------------------------------------------------------------------------


def test_bad_input_raises_clear_errors_and_changes_nothing() -> None:
    """Wrong digest length, negative times, a bad packed batch, an absurd capacity: a
    ValueError that says what was wrong (TypeError/OverflowError for the wrong type or a
    negative integer), nothing stored or allocated."""
    store = engine.FamiliarStore()
    with pytest.raises(ValueError, match=r"familiar digest is 16 bytes .*got 15"):
        store.put(b"x" * 15, 1)
    with pytest.raises(ValueError, match=r"familiar digest is 16 bytes .*got 17"):
        store.contains_at(b"x" * 17, 1)
    with pytest.raises(ValueError, match="familiar digest is 16 bytes"):
        store.lift(b"", None)
    with pytest.raises(
        ValueError, match="expires_ms must be epoch milliseconds, at least 0; got -1"
    ):
        store.put(digest(PAIR), -1)
    with pytest.raises(ValueError, match="since_ms must be epoch milliseconds, or -1"):
        store.put(digest(PAIR), 1, -2)
    with pytest.raises(ValueError, match="now_ms must be epoch milliseconds, at least 0; got -5"):
        store.contains_at(digest(PAIR), -5)
    with pytest.raises(ValueError, match="now_ms"):
        store.prune(-1)
    with pytest.raises(ValueError, match=r"packed records are 40 bytes each .* got 39 bytes"):
        store.put_many(b"\0" * 39)
    with pytest.raises(ValueError, match="packed record 1: expires_ms must be at least 0"):
        store.put_many(pack(PAIR, 5) + pack(CLIENT, -3) + pack(PLACE, 5))
    with pytest.raises(OverflowError):
        store.put(digest(PAIR), 1, -1, -1)
    with pytest.raises(OverflowError):
        store.put(digest(PAIR), 2**63)
    with pytest.raises(TypeError):
        store.put("0123456789abcdef", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        engine.familiar_digest("t", 3, None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capacity is at most 2147483648 records"):
        engine.FamiliarStore(2**40)
    with pytest.raises(ValueError, match="reserve is at most 2147483648 records"):
        store.reserve(2**40)
    with pytest.raises(OverflowError):
        engine.FamiliarStore(-1)
    assert (len(store), store.slot_count()) == (0, 64)


# -- the differential test against DecisionIndex -----------------------------------------

TENANTS = ("acme", "beta")
ACCOUNTS = ("a1", "a2")
SOURCES = ("198.51.100.1", "198.51.100.2")
DEVICES = ("d1", "d2")


def familiar_keys() -> st.SearchStrategy[Key]:
    """The three shapes a familiar exempt's key has: pair, client, known place."""
    t, a, s, d = (st.sampled_from(x) for x in (TENANTS, ACCOUNTS, SOURCES, DEVICES))
    return st.one_of(
        st.tuples(st.just("familiar"), t, a, s, st.none()),
        st.tuples(st.just("familiar"), t, a, st.none(), d),
        st.tuples(st.just("familiar"), t, st.none(), s, st.none()),
    )


TIMES = st.integers(0, 60)
OPS = st.one_of(
    st.tuples(st.just("put"), familiar_keys(), TIMES, TIMES),
    st.tuples(st.just("lift"), familiar_keys()),
    st.tuples(st.just("lift_id"), familiar_keys(), st.integers(0, 12)),
    st.tuples(st.just("prune"), TIMES),
    st.tuples(
        st.just("check"),
        st.sampled_from(TENANTS),
        st.sampled_from(ACCOUNTS),
        st.sampled_from(SOURCES),
        st.sampled_from((None, *DEVICES)),
        TIMES,
    ),
)


def store_unfamiliar(
    store: engine.FamiliarStore,
    tenant: str,
    account: str,
    source: str,
    device: str | None,
    now_ms: int,
) -> bool:
    """``DecisionIndex.unfamiliar``'s lookup on the store: the pair's record, else (only when
    the pair has none, alive or not) the client's; unfamiliar unless it is alive at now."""
    entry = store.get_key(tenant, account, source, None)
    if entry is None and device is not None:
        entry = store.get_key(tenant, account, None, device)
    return not (entry is not None and entry[0] > now_ms)


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=80))
def test_the_store_answers_as_the_decision_index_does(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    """Random puts, lifts (with and without a decision id, current or stale), prunes and unfamiliar checks over
    a small key space: the store and DecisionIndex (announce off, [verify] enforce: the
    edge's) agree on every record, every prune and every verdict."""
    index = DecisionIndex(announce=False, policy=Policy(), engine=None)  # the dict alone
    store = engine.FamiliarStore()
    digests: dict[bytes, Key] = {}
    puts = 0
    for op in ops:
        if op[0] == "put":
            _, key, expires_ms, since_ms = op
            decision_id = f"i{puts}"  # ids are unique per decision, as stable_id makes them
            puts += 1
            d = digest(key[1:])
            digests[d] = key
            index.put(key, Active(decision_id, "exempt", expires_ms, "familiar", None, since_ms))
            store.put(d, expires_ms, since_ms, engine.id_fingerprint(decision_id))
        elif op[0] == "lift":
            assert store.lift(digest(op[1][1:])) is (index.lift(op[1]) is not None)
        elif op[0] == "lift_id":
            _, key, n = op
            decision_id = f"i{n}"  # this key's current id, an older one or another key's
            current = index.get(key)
            lifted = current is not None and current.decision_id == decision_id
            if lifted:
                index.lift(key)
            assert store.lift(digest(key[1:]), engine.id_fingerprint(decision_id)) is lifted
        elif op[0] == "prune":
            expected = sorted(index.prune(op[1]), key=repr)
            assert sorted((digests[d] for d in store.prune_keys(op[1])), key=repr) == expected
        else:
            _, tenant, account, source, device, now_ms = op
            verdict = index.unfamiliar(tenant, account, source, device, now_ms)
            assert (
                store_unfamiliar(store, tenant, account, source, device, now_ms) is verdict.step_up
            )
        assert len(store) == len(index)
        for d, key in digests.items():
            active = index.get(key)
            want = None
            if active is not None:
                want = (
                    active.expires_ms,
                    active.since_ms,
                    engine.id_fingerprint(active.decision_id),
                )
            assert store.get(d) == want
            for now_ms in (0, 30, 60):
                alive = active is not None and active.expires_ms > now_ms
                assert store.contains_at(d, now_ms) is alive
                assert store.familiar_at(*key[1:], now_ms) is alive
