"""The refusal check: which decision keys apply to an attempt, and DecisionIndex."""

from __future__ import annotations

from pipeline.core.decision_keys import applicable_keys, keys_for
from pipeline.core.decisions import Active, DecisionIndex, Verdict
from tests.unit.test_core_support import att

A, S, D, SESS = "a" * 32, "203.0.113.5", "d" * 32, "5" * 32


MANUAL_KEYS = (("source", "t", None, S, "manual"), ("account", "t", A, None, "manual"))


def test_untrusted_password_flow_keys() -> None:
    """An untrusted login is checked against familiar (the pair and the cookie: first;
    a known place is no key since issue 44 item 7), the client's passed CAPTCHA, source, account_source, account, lock, the tenant's wave and the operator's
    source and account keys (the tenant's [verify] is policy, not a key)."""
    assert applicable_keys("t", A, S, D, None, False, "login") == (
        ("familiar", "t", A, S, None),
        ("familiar", "t", A, None, D),
        ("passed", "t", A, None, D),
        ("source", "t", None, S, None),
        ("account_source", "t", A, S, None),
        ("account", "t", A, None, None),
        ("lock", "t", A, None, None),
        ("tenant", "t", None, None, None),
        *MANUAL_KEYS,
    )


def test_trusted_password_flow_keys() -> None:
    """A trusted device is checked against its device key, the account's bound on failing
    trusted devices and the operator's keys only: no rule's source decision refuses or
    challenges it (an operator's still do)."""
    for flow in ("login", "token", "recovery"):
        assert applicable_keys("t", A, S, D, None, True, flow) == (
            ("device", "t", A, None, D),
            ("device", "t", A, None, None),
            *MANUAL_KEYS,
        )


def test_a_mailbox_reset_is_checked_against_the_operator_keys_only() -> None:
    """flow reset: neither the lock, the ceiling, the pair nor the wave can refuse it."""
    assert applicable_keys("t", A, S, None, None, False, "reset") == MANUAL_KEYS


def test_mfa_is_checked_against_the_account_bound_too() -> None:
    """mfa: the device's curve and the account's consecutive bound over every device."""
    assert applicable_keys("t", A, S, D, None, False, "mfa")[1:3] == (
        ("mfa", "t", A, None, D),
        ("mfa", "t", A, None, None),
    )


def test_a_challenge_allows_and_names_its_kind_and_a_block_wins() -> None:
    """A challenge decision allows the attempt with its kind; a block in force wins."""
    index = DecisionIndex()
    keys = applicable_keys("t", A, S, None, None, False, "login")
    index.put(("tenant", "t", None, None, None), Active("w", "challenge", 10_000, "w", "captcha"))
    verdict = index.check(keys, 0)
    assert (verdict.allowed, verdict.challenge, verdict.applied) == (True, "captcha", "challenge")
    index.put(("lock", "t", A, None, None), Active("l", "block", 5_000, "lockout"))
    verdict = index.check(keys, 0)
    assert (verdict.allowed, verdict.challenge, verdict.retry_after_ms) == (False, None, 5_000)


def test_a_familiar_pair_voids_the_wave_and_rule_source_decisions_not_the_operators() -> None:
    """exempt on familiar|t|a|s|-: no wave challenge, no rule source block; manual applies."""
    index = DecisionIndex()
    keys = applicable_keys("t", A, S, None, None, False, "login")
    index.put(("tenant", "t", None, None, None), Active("w", "challenge", 10_000, "w", "captcha"))
    index.put(("source", "t", None, S, None), Active("s", "block", 10_000, "challenge_failures"))
    index.put(("familiar", "t", A, S, None), Active("f", "exempt", 10_000, "familiar"))
    assert index.check(keys, 0) == Verdict(True, 0)
    assert index.subjects == {"t": 1, S: 1}  # an exempt is no subject: the fast path stays
    index.put(("source", "t", None, S, "manual"), Active("m", "block", 7_000, "manual"))
    assert index.check(keys, 0).retry_after_ms == 7_000


def test_every_flow_is_checked_against_the_operator_keys() -> None:
    """uia and mfa attempts are refused by an operator's source or account block too."""
    for flow in ("uia", "mfa"):
        assert applicable_keys("t", A, S, D, SESS, False, flow)[-2:] == MANUAL_KEYS


def test_uia_and_mfa_keys() -> None:
    """uia uses session > device > source; mfa uses device > session > source."""
    assert applicable_keys("t", A, S, D, SESS, True, "uia")[1] == ("uia", "t", A, None, SESS)
    assert applicable_keys("t", A, S, D, None, False, "uia")[1] == ("uia", "t", A, None, D)
    assert applicable_keys("t", A, S, None, None, False, "uia")[1] == ("uia", "t", A, S, None)
    assert applicable_keys("t", A, S, D, SESS, False, "mfa")[1] == ("mfa", "t", A, None, D)
    assert applicable_keys("t", A, S, None, SESS, False, "mfa")[1] == ("mfa", "t", A, None, SESS)
    assert applicable_keys("t", A, S, None, None, False, "mfa")[1] == ("mfa", "t", A, S, None)


def test_keys_for_uses_the_attempt_fields() -> None:
    """keys_for(attempt) equals applicable_keys of its fields."""
    a = att(0, device=D, trusted=True)
    assert keys_for(a) == applicable_keys(a.tenant, a.account, a.source, D, None, True, "login")


def _index(
    *entries: tuple[tuple[str, str, str | None, str | None, str | None], str, int],
) -> DecisionIndex:
    index = DecisionIndex()
    for n, (key, action, expires) in enumerate(entries):
        index.put(key, Active(f"id{n}", action, expires, key[0]))
    return index


AS = ("account_source", "t", A, S, None)
AC = ("account", "t", A, None, None)
SRC = ("source", "t", None, S, None)


def test_check_refuses_with_the_longest_remaining_block() -> None:
    """Refused iff a block applies; retry_after is the longest remaining one."""
    index = _index((AS, "block", 1000), (AC, "block", 5000))
    verdict = index.check((SRC, AS, AC), 400)
    assert verdict == Verdict(False, 4600, AC, None)
    assert verdict.applied == "block"


def test_check_ignores_expired_and_unrelated_decisions() -> None:
    """Expired decisions (even unpruned) and other keys never refuse."""
    index = _index((AS, "block", 1000), (("account", "t", "b" * 32, None, None), "block", 9000))
    assert index.check((SRC, AS, AC), 1000) == Verdict(True, 0)
    assert index.check((SRC, AS, AC), 999).retry_after_ms == 1


def test_check_observe_is_allowed_but_reported() -> None:
    """An observe decision allows, with observed_key set and applied == 'observe'."""
    index = _index((AC, "observe", 5000))
    verdict = index.check((SRC, AS, AC), 10)
    assert (verdict.allowed, verdict.retry_after_ms, verdict.observed_key) == (True, 0, AC)
    assert verdict.applied == "observe"
    both = _index((AC, "observe", 5000), (AS, "block", 100)).check((SRC, AS, AC), 10)
    assert (both.allowed, both.matched_key, both.observed_key, both.applied) == (
        False,
        AS,
        AC,
        "block",
    )


def test_prune_lift_and_replace() -> None:
    """prune removes expired decisions once; lift removes early; a re-issue replaces."""
    index = _index((AS, "block", 1000), (AC, "block", 2000))
    assert index.lift(AC) is not None and index.lift(AC) is None
    index.put(AS, Active("new", "block", 3000, "account_source"))
    assert index.prune(2500) == []  # the old AS entry was replaced; AC was lifted
    assert index.prune(3000) == [AS]
    assert len(index) == 0 and index.items() == []


def test_the_edges_index_keeps_nothing_of_decisions_that_expired() -> None:
    """200,000 source blocks applied and expired at an edge (``announce=False``, issue 26
    item 1): afterwards the index holds none of them, no wall heap, and under 1 MB of what
    the churn allocated stays held (about 65 MB stayed with the wall heap)."""
    import tracemalloc

    index = DecisionIndex(announce=False)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200_000):
            source = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
            index.put(
                ("source", "t", None, source, None), Active(f"d{i}", "block", 1000 + i, "source")
            )
            if i % 1000 == 999:
                index.prune(1000 + i)
        index.prune(1 << 40)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert (len(index), len(index._heap), len(index._wall_heap), index.subjects) == (0, 0, 0, {})
    assert held < 1_000_000


def test_renewals_leave_the_heaps_bounded_and_expiry_unchanged() -> None:
    """A familiar pair renewed 10,000 times keeps at most 2 x active + HEAP_SLACK heap
    entries, and its one decision still expires once, at its last expiry."""
    from pipeline.core.decisions import HEAP_SLACK

    key = ("familiar", "t", A, S, None)
    index = DecisionIndex()
    for i in range(10_000):
        index.put(key, Active(f"f{i}", "exempt", 1_000_000 + i, "familiar"))
        assert len(index._heap) <= 2 * len(index) + HEAP_SLACK
        assert len(index._wall_heap) <= 2 * len(index) + HEAP_SLACK
    assert index.announce_expired(1_009_998) == []
    assert index.announce_expired(1_009_999) == [key]
    assert index.prune(1_009_998) == []
    assert index.prune(1_009_999) == []  # the wall clock already tombstoned it
    assert (len(index), len(index._heap), len(index._wall_heap)) == (0, 0, 0)
