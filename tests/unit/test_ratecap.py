"""The audit rate cap: caps, exact summaries, one summary per suppressed row, bounds."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.sinks.ratecap import (
    ACCOUNT_DIGEST,
    EVENT_ID,
    MINUTE_MS,
    SOURCE,
    SUMMARY,
    TENANT,
    TS_MS,
    WEIGHT,
    RateCap,
    RateCapConfig,
    is_capped,
)
from tests.unit.test_sink_support import audit_row

BASE_MS = 1_790_000_040_000 - (1_790_000_040_000 % MINUTE_MS)


def row(index: int, *, ts_ms: int = BASE_MS, **columns: Any) -> list[Any]:
    """One audit row (the sink tests' builder) from partition 0, by default account a1 at
    203.0.113.7; ``columns`` as ``audit_row`` takes them."""
    defaults: dict[str, Any] = {"account": "a1", "source": "203.0.113.7", "partition": 0}
    return audit_row(index, ts_ms, **(defaults | columns))


def run(cap: RateCap, rows: list[list[Any]]) -> list[list[Any]]:
    out: list[list[Any]] = []
    cap.offer_all(rows, out)
    cap.close_all(out)
    return out


def test_config_refuses_nonsense() -> None:
    """rows_per_minute < 1 and max_keys < 2 are refused."""
    with pytest.raises(ValueError, match="rows_per_minute"):
        RateCapConfig(rows_per_minute=0)
    with pytest.raises(ValueError, match="max_keys"):
        RateCapConfig(max_keys=1)


def test_capped_rows_are_failures_and_refusals() -> None:
    """Failures and blocks are capped; allowed or observed successes are not."""
    assert is_capped(row(0, outcome="failure"))
    assert is_capped(row(0, outcome="success", decision="block"))
    assert not is_capped(row(0, outcome="success", decision="allowed"))
    assert not is_capped(row(0, outcome="success", decision="observe"))


def test_successes_are_never_capped() -> None:
    """1,000 successes of one key in one minute are all written, unchanged, no state."""
    cap = RateCap(RateCapConfig(rows_per_minute=5))
    rows = [row(i, outcome="success") for i in range(1000)]
    out = run(cap, rows)
    assert out == rows
    assert cap.tracked_keys == 0


def test_source_cap_writes_n_rows_then_one_summary() -> None:
    """200 failures of one source on 200 accounts: 60 rows, then one summary of 140."""
    cap = RateCap(RateCapConfig(rows_per_minute=60))
    rows = [row(i, account=f"acct{i}", ts_ms=BASE_MS + i) for i in range(200)]
    out: list[list[Any]] = []
    cap.offer_all(rows, out)
    assert out == rows[:60]
    assert cap.pending_weight == 140
    cap.close_all(out)
    summary = out[60]
    assert len(out) == 61
    assert summary[SUMMARY] is True
    assert summary[WEIGHT] == 140
    assert summary[ACCOUNT_DIGEST] == ""
    assert summary[SOURCE] == "203.0.113.7"
    assert summary[EVENT_ID] == "summary:ev-60"
    assert summary[TS_MS] == BASE_MS + 60
    assert cap.tracked_keys == 0


def test_account_cap_summary_keeps_the_account() -> None:
    """100 failures on one account from 100 sources: 10 rows and an account summary of 90."""
    cap = RateCap(RateCapConfig(rows_per_minute=10))
    rows = [row(i, source=f"198.51.100.{i}") for i in range(100)]
    out = run(cap, rows)
    assert out[:10] == rows[:10]
    assert len(out) == 11
    assert out[10][WEIGHT] == 90
    assert out[10][SOURCE] == ""
    assert out[10][ACCOUNT_DIGEST] == "a1"


def test_doubly_suppressed_row_counts_in_the_source_summary_only() -> None:
    """One source and one account both at cap: every suppressed row is in the source summary."""
    cap = RateCap(RateCapConfig(rows_per_minute=3))
    out = run(cap, [row(i) for i in range(10)])
    summaries = [r for r in out if r[SUMMARY]]
    assert [(r[SOURCE], r[ACCOUNT_DIGEST], r[WEIGHT]) for r in summaries] == [
        ("203.0.113.7", "", 7)
    ]


def test_minutes_are_separate_and_close_before_closes_only_past_minutes() -> None:
    """Each minute has its own budget; close_before(now) closes minutes ended by now."""
    cap = RateCap(RateCapConfig(rows_per_minute=2))
    first = [row(i, ts_ms=BASE_MS + i) for i in range(5)]
    second = [row(10 + i, ts_ms=BASE_MS + MINUTE_MS + i) for i in range(4)]
    out: list[list[Any]] = []
    cap.offer_all(first + second, out)
    assert out == first[:2] + second[:2]
    cap.close_before(BASE_MS + MINUTE_MS + 30_000, out)
    assert [(r[WEIGHT], r[TS_MS]) for r in out[4:]] == [(3, BASE_MS + 2)]
    cap.close_before(BASE_MS + 2 * MINUTE_MS, out)
    assert [(r[WEIGHT], r[TS_MS]) for r in out[5:]] == [(2, BASE_MS + MINUTE_MS + 2)]
    assert cap.tracked_keys == 0


def test_input_weights_are_carried_into_summaries() -> None:
    """Suppressed rows of weight 5 add 5 each to the summary."""
    cap = RateCap(RateCapConfig(rows_per_minute=1))
    out = run(cap, [row(0, weight=5), row(1, weight=5), row(2, weight=5)])
    assert [(r[WEIGHT], r[SUMMARY]) for r in out] == [(5, False), (10, True)]


def test_key_cap_flushes_summaries_early_and_keeps_counts() -> None:
    """With max_keys 4, an overflowing key set emits summaries early; the total stays exact."""
    cap = RateCap(RateCapConfig(rows_per_minute=1, max_keys=4))
    rows = [row(i, source=f"s{i % 3}", account=f"a{i % 5}") for i in range(60)]
    out = run(cap, rows)
    assert cap.evicted_keys > 0
    assert sum(r[WEIGHT] for r in out) == 60
    assert len({r[EVENT_ID] for r in out}) == len(out)


_ROW_FIELDS = st.tuples(
    st.integers(min_value=0, max_value=3 * MINUTE_MS),  # ts offset
    st.integers(min_value=0, max_value=1),  # tenant
    st.integers(min_value=0, max_value=3),  # account
    st.integers(min_value=0, max_value=2),  # source
    st.integers(min_value=0, max_value=2),  # outcome: 0, 1 failure; 2 success
    st.integers(min_value=0, max_value=3),  # decision: 0, 1 allowed; 2 block; 3 observe
    st.integers(min_value=1, max_value=3),  # weight
)
_DECISIONS = ("allowed", "allowed", "block", "observe")


def audit_rows() -> st.SearchStrategy[list[list[Any]]]:
    """Lists of up to 150 audit rows over 2 tenants, 4 accounts, 3 sources, 4 minutes."""

    def build(fields: list[tuple[int, ...]]) -> list[list[Any]]:
        return [
            row(
                index,
                ts_ms=BASE_MS + ts,
                tenant=("acme", "globex")[tenant],
                account=f"a{account}",
                source=f"s{source}",
                outcome="success" if outcome == 2 else "failure",
                decision=_DECISIONS[decision],
                weight=weight,
            )
            for index, (ts, tenant, account, source, outcome, decision, weight) in enumerate(fields)
        ]

    return st.lists(_ROW_FIELDS, max_size=150).map(build)


@settings(max_examples=200, deadline=None)
@given(
    rows=audit_rows(),
    limit=st.integers(min_value=1, max_value=6),
    max_keys=st.integers(min_value=2, max_value=40),
    closes=st.lists(st.integers(min_value=0, max_value=150), max_size=5),
)
def test_sum_of_weights_is_exact_for_any_input(
    rows: list[list[Any]], limit: int, max_keys: int, closes: list[int]
) -> None:
    """For any input, cap, key bound and close points: sum(weight) out == sum(weight) in."""
    cap = RateCap(RateCapConfig(rows_per_minute=limit, max_keys=max_keys))
    out: list[list[Any]] = []
    for index, item in enumerate(rows):
        if index in closes:
            cap.close_before(item[TS_MS], out)
        cap.offer(item, out)
        assert cap.tracked_keys <= max_keys
    cap.close_all(out)
    assert sum(r[WEIGHT] for r in out) == sum(r[WEIGHT] for r in rows)
    assert cap.tracked_keys == 0
    assert cap.pending_weight == 0
    # Every summary stands for distinct suppressed rows: summary ids never repeat.
    assert len({r[EVENT_ID] for r in out}) == len(out)
    # Uncapped rows pass untouched and in order.
    assert [r for r in out if not is_capped(r)] == [r for r in rows if not is_capped(r)]


@settings(max_examples=150, deadline=None)
@given(rows=audit_rows(), limit=st.integers(min_value=1, max_value=6))
def test_written_rows_per_key_minute_stay_within_the_cap(rows: list[list[Any]], limit: int) -> None:
    """Without eviction, capped rows written per (tenant, source|account, minute) <= N."""
    out = run(RateCap(RateCapConfig(rows_per_minute=limit, max_keys=10_000)), rows)
    written = [r for r in out if is_capped(r) and not r[SUMMARY]]
    by_source = Counter((r[TENANT], r[SOURCE], r[TS_MS] // MINUTE_MS) for r in written)
    by_account = Counter((r[TENANT], r[ACCOUNT_DIGEST], r[TS_MS] // MINUTE_MS) for r in written)
    assert max(by_source.values(), default=0) <= limit
    assert max(by_account.values(), default=0) <= limit
    summaries = Counter(
        (r[TENANT], r[SOURCE], r[ACCOUNT_DIGEST], r[TS_MS] // MINUTE_MS) for r in out if r[SUMMARY]
    )
    assert max(summaries.values(), default=0) <= 1


@settings(max_examples=100, deadline=None)
@given(rows=audit_rows(), limit=st.integers(min_value=1, max_value=6))
def test_same_input_same_output(rows: list[list[Any]], limit: int) -> None:
    """Two caps fed the same rows in the same order emit identical rows (replay-safe)."""
    config = RateCapConfig(rows_per_minute=limit, max_keys=7)
    assert run(RateCap(config), rows) == run(RateCap(config), rows)
