"""Every door that verifies a secret counts (issue 46, item 2): failed resets feed the
pair's and the ceiling's counters and rule 7's streak, never the lock's run."""

from __future__ import annotations

from pipeline.contracts.models import datetime_to_ms
from pipeline.core.account import AccountShard
from pipeline.core.engine import Engine
from pipeline.core.outbox import Outbox
from tests.unit.test_core_support import ACCOUNT, MIN, SEC, att, decisions

SOURCE = "203.0.113.9"


def failed_resets(n: int) -> tuple[AccountShard, Outbox]:
    """``n`` failed resets of ACCOUNT from one source, a second apart, through the
    account stage's reset-failure path (``AccountShard._reset_failure``)."""
    shard = AccountShard()
    shard.track_changes = False
    rules = shard.tenant("default")
    out = Outbox()
    for i in range(n):
        a = att(i * SEC, source=SOURCE, flow="reset", reason="other")
        shard.watermark_ms = a.occurred_ms
        shard._reset_failure(a, rules, out, i)
    return shard, out


def test_failed_resets_from_one_source_meet_the_pair_and_the_ceiling() -> None:
    """60 failed resets from one source in a minute: the pair's decision at the 5th, the
    ceiling's at the 50th with account_under_attack (before: nothing counted them); no
    lock and no lifetime hold (nothing refuses a reset, so its failures never hold the
    owner out)."""
    _, out = failed_resets(60)
    issued = [(d.rule, d.count) for _, d in out.decisions if d is not None]
    assert issued == [("account_source", 5), ("account", 50)]
    assert [(a.type, a.count) for a in out.alerts] == [("account_under_attack", 50)]
    assert [n.reason for n in out.notices] == ["account_ceiling"]


def test_failed_resets_count_in_rule_7s_streak() -> None:
    """100 failed resets reach rule 7's lifetime_bound alert (the alert only)."""
    shard, out = failed_resets(100)
    entry = shard.tenants["default"].acct.entries[("account", "default", ACCOUNT, None, None)]
    assert entry.streak == 100
    assert [a.type for a in out.alerts].count("lifetime_bound") == 1
    assert not any(d.scope == "lock" for _, d in out.decisions if d is not None)


def test_twenty_thousand_failed_resets_through_the_stage_meet_decisions() -> None:
    """The issue's probe through the account stage's dispatch (Engine): 20,000 failed
    resets from one source, ten a second: the pair's decision at the 5th and the
    ceiling's at the 50th, re-issued on rule 6's backoff as long as they go on (before:
    no decision at all); never a lock (the tenant's own verification record aside)."""
    engine = Engine()
    engine.step_batch(
        [att(i * 100, source=SOURCE, flow="reset", reason="other") for i in range(20_000)]
    )
    issued = [(d.rule, d.count) for d in decisions(engine.out) if d.scope != "tenant"]
    assert issued[:2] == [("account_source", 5), ("account", 50)]
    assert {rule for rule, _ in issued} == {"account_source", "account"}
    lengths = [
        (d.rule, (datetime_to_ms(d.expires_at) - datetime_to_ms(d.issued_at)) // MIN)
        for d in decisions(engine.out)
        if d.rule == "account"
    ]
    assert lengths == [("account", 15), ("account", 30)]
