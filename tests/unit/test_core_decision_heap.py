"""The decision index's expiry heaps never compare keys, whatever ids a producer sends."""

from __future__ import annotations

from pipeline.core.decisions import Active, DecisionIndex

# Equal up to the source, where one holds None and the other text: comparing them raises.
LOCK = ("uia", "t", "acct", None, "session-1")
PAIR = ("uia", "t", "acct", "198.51.100.7", "session-1")


def test_two_keys_with_one_expiry_and_one_id_are_held_and_expire_together() -> None:
    """Same expiry and id on keys holding None and text: both held, both pruned at expiry."""
    for announce in (True, False):
        index = DecisionIndex(announce=announce, engine=None)
        index.put(LOCK, Active("same-id", "block", 5_000, "uia"))
        index.put(PAIR, Active("same-id", "block", 5_000, "uia"))
        assert sorted(map(str, index.prune(4_999))) == []
        assert sorted(map(str, index.prune(5_000))) == sorted(map(str, [LOCK, PAIR]))


def test_the_tie_holds_after_the_heaps_are_rebuilt() -> None:
    """Renewals that force a heap rebuild keep the tie broken (no TypeError, both expire)."""
    index = DecisionIndex(announce=True, engine=None)
    for n in range(300):  # renewals (a new id each) leave stale entries until the rebuild
        index.put(LOCK, Active(f"id-{n}", "block", 5_000 + n, "uia"))
        index.put(PAIR, Active(f"id-{n}", "block", 5_000 + n, "uia"))
    assert index.announce_expired(5_298) == []
    assert sorted(map(str, index.announce_expired(5_299))) == sorted(map(str, [LOCK, PAIR]))
    index.prune(5_299)  # announced keys leave quietly (never tombstoned twice)
    assert index.items() == []
