"""``DecisionIndex.subjects`` when a decision replaces another on its key: an exempt is no
subject, any other action is one, whatever the key held before (the dict and the
compiled store alike)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.core.decision_keys import applicable_keys
from pipeline.core.decisions import Active, DecisionIndex
from pipeline.core.keys import Key

try:
    import authpipe_engine as engine
except ImportError as exc:  # never skipped: an unbuilt engine is a failure that says why
    raise ImportError("authpipe_engine is not installed: run scripts/build-engine") from exc

T, A, S = "acme", "a" * 32, "198.51.100.1"
PASSED: Key = ("passed", T, A, S, None)
FAMILIAR: Key = ("familiar", T, A, S, None)
STORES = pytest.mark.parametrize("store", [None, engine], ids=["dict", "store"])


@STORES
@pytest.mark.parametrize("key", [PASSED, FAMILIAR], ids=["passed", "familiar"])
def test_a_block_replacing_an_exempt_makes_its_account_a_subject(key: Key, store: Any) -> None:
    """An exempt, then a block on the same key: the account is a subject (may_apply True,
    the check refuses); lifting the block leaves no subject."""
    index = DecisionIndex(announce=False, engine=store)
    index.put(key, Active("e1", "exempt", 9_000, key[0]))
    index.put(key, Active("b1", "block", 9_000, "manual"))
    keys = applicable_keys(T, A, S, None, None, False, "login")
    verdict = index.check(keys, 1_000)
    assert (index.subjects, index.may_apply(T, A, S), verdict.allowed) == ({A: 1}, True, False)
    index.lift(key)
    assert (index.subjects, index.may_apply(T, A, S)) == ({}, False)


@STORES
@pytest.mark.parametrize("key", [PASSED, FAMILIAR], ids=["passed", "familiar"])
def test_an_exempt_replacing_a_block_leaves_no_subject(key: Key, store: Any) -> None:
    """A block, then an exempt on the same key: no subject is left (the account is back on
    the fast path), and lifting or pruning the exempt later changes nothing."""
    index = DecisionIndex(announce=False, engine=store)
    index.put(key, Active("b1", "block", 9_000, "manual"))
    assert index.subjects == {A: 1}
    index.put(key, Active("e1", "exempt", 9_000, key[0]))
    assert (index.subjects, index.may_apply(T, A, S)) == ({}, False)
    pruned = [] if store is not None and key == FAMILIAR else [key]  # the store's: unnamed
    assert (index.prune(9_000), index.subjects) == (pruned, {})


def test_a_worker_index_counts_a_block_after_an_exempt_and_back() -> None:
    """The worker's own index (announce on): exempt, block, exempt on one key gives
    subjects {}, {A: 1}, {}; the wall clock's announcement of the last one changes
    nothing."""
    index = DecisionIndex()
    seen = []
    for n, action in enumerate(("exempt", "block", "exempt")):
        index.put(PASSED, Active(f"d{n}", action, 9_000 + n, "passed"))
        seen.append(dict(index.subjects))
    assert seen == [{}, {A: 1}, {}]
    assert (index.announce_expired(10_000), index.subjects) == ([PASSED], {})
