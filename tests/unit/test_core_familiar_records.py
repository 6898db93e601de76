"""The familiar tables' changelog records are the same whether the table keeps entries
as objects or packed (issue 45 item 2): a changelog written by either restores into the
other. The records below were written by the tuple-keyed table of StreakState."""

from __future__ import annotations

from typing import Any

from pipeline.core.account import AccountShard
from pipeline.core.decision_keys import keys_for
from pipeline.core.outbox import Outbox
from pipeline.core.source import SourceShard
from tests.unit.test_core_support import MIN, att, policy

DEV = "d" * 32
POLICY = policy(wave={"captcha_pass_ms": 3_600_000})
RECORDS: list[tuple[list[Any], list[Any]]] = [
    (
        [
            "familiar",
            "familiar",
            "default",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "198.51.100.7",
            None,
        ],
        [
            0,
            1792592000000,
            "78d21291dc6164714799f0426109b7e2",
            "familiar",
            1790086400000,
            1792592000000,
            0,
            0,
            0,
            0,
            0,
            0,
        ],
    ),
    (
        [
            "familiar",
            "familiar",
            "default",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            None,
            "dddddddddddddddddddddddddddddddd",
        ],
        [
            0,
            1792592000000,
            "38a6939d70b8c27125eccad0b58bd380",
            "familiar",
            1790086400000,
            1792592000000,
            0,
            0,
            0,
            0,
            0,
            0,
        ],
    ),
    (
        ["familiar", "familiar", "default", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", None, None],
        # A new password: kept familiar.memory_ms (30 days) from the reset, not forever.
        [0, 1790086460000, "", "", 0, 1792592060000, 1, 0, 0, 0, 0, 0],
    ),
    (
        [
            "familiar",
            "passed",
            "default",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            None,
            "dddddddddddddddddddddddddddddddd",
        ],
        [
            0,
            1790003720000,
            "c1acc93612ccb674701af81d668c3aac",
            "familiar",
            1790001920000,
            1790003720000,
            2,
            0,
            0,
            0,
            0,
            0,
        ],
    ),
    (
        [
            "familiar",
            "familiar",
            "default",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "203.0.113.9",
            None,
        ],
        [
            0,
            1792592180000,
            "3be8f5550dc1ef535d8fc57e6b0100e3",
            "familiar",
            1790086580000,
            1792592180000,
            3,
            0,
            0,
            0,
            0,
            0,
        ],
    ),
    (
        ["familiar", "familiar", "default", None, "198.51.100.7", None],
        [0, 1792592000000, "", "familiar", 1790086400000, 1792592000000, 0, 0, 0, 0, 0, 0],
    ),
    (
        ["familiar", "familiar", "default", None, "203.0.113.9", None],
        [0, 1792592180000, "", "familiar", 1790086580000, 1792592180000, 3, 0, 0, 0, 0, 0],
    ),
]
"""A pair and a client made familiar, a new password, a passed CAPTCHA, a second place,
and the source stage's two known places."""


def _shards() -> tuple[AccountShard, SourceShard]:
    """The two stages after a success with a cookie, a recovery, a passed CAPTCHA, a
    success at a second place and a failure."""
    acc, src, out = AccountShard(POLICY), SourceShard(POLICY), Outbox()
    steps = [
        att(0, success=True, reason=None, device=DEV, event_id="e1"),
        att(1 * MIN, success=True, reason=None, flow="recovery", event_id="e2"),
        att(2 * MIN, success=True, reason=None, flow="challenge", device=DEV, event_id="e3"),
        att(3 * MIN, source="203.0.113.9", success=True, reason=None, event_id="e4"),
        att(4 * MIN, event_id="e5"),
    ]
    for seq, attempt in enumerate(steps):
        acc.step(attempt, attempt.occurred_ms, out, seq)
        for forward in out.forwards:
            src.step(forward, forward.occurred_ms, out, seq)
        out.forwards.clear()
    return acc, src


def test_the_familiar_records_written_are_the_objects_tables_records() -> None:
    """Both stages write exactly RECORDS for their familiar tables (key and value)."""
    acc, src = _shards()
    written = [(k, v) for k, v in acc.take_dirty() + src.take_dirty() if k[0] == "familiar"]
    assert written == RECORDS


def test_the_records_restore_and_read_back_the_same() -> None:
    """RECORDS restored into fresh stages: each entry reads back its record, the exempts
    are indexed again until their expiry, and the familiar pair is exempt from the wave."""
    acc, src, out = AccountShard(POLICY), SourceShard(POLICY), Outbox()
    for key, value in RECORDS:
        (acc if key[3] is not None else src).restore(key, value)
    acc.watermark_ms = src.watermark_ms = att(4 * MIN).occurred_ms
    acc.finish_restore(out)
    src.finish_restore(out)
    for key, value in RECORDS:
        shard = acc if key[3] is not None else src
        entry = shard.tenant(key[2]).familiar.get(tuple(key[1:]))
        assert entry is not None and entry.dump() == value
    indexed = {
        tuple(key[1:]): (active.action, active.expires_ms)
        for key, _ in RECORDS
        if (active := acc.index.get(tuple(key[1:]))) is not None
    }
    assert sorted(indexed.values()) == [
        ("exempt", 1790003720000),
        ("exempt", 1792592000000),
        ("exempt", 1792592000000),
        ("exempt", 1792592180000),
    ]
    assert out.decisions == []
    verdict = acc.index.check(keys_for(att(5 * MIN)), att(5 * MIN).occurred_ms)
    assert (verdict.allowed, verdict.challenge) == (True, None)
