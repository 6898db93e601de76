"""The rollup's changelog holds no more than its memory: the shares and fired windows it
forgets are tombstoned, and a restore from what is left gives the Engine's outputs."""

from __future__ import annotations

import random
from typing import Any

import orjson

from pipeline.contracts.codec import dumps, loads
from pipeline.core.outbox import ACCOUNT_SHARE, SOURCE_SHARE, UNKNOWN_SHARE
from pipeline.core.policy import policy_from_toml
from pipeline.core.rollup import TenantRollup
from pipeline.core.strangers_tier import EVERY_PART
from pipeline.settings import Settings
from pipeline.stream.ingest import Record
from pipeline.stream.memory import MemoryPipeline
from pipeline.stream.rollup_stage import RollupStage
from tests.unit.test_stream_memory import NOW_MS, records
from tests.unit.test_stream_order import engine_outputs, outputs

# Ten-second windows and short horizons: a ten-minute stream forgets rule 8's windows
# after 5, stuffing_tenant's after 4 and the slow tier's after 15.
POLICY = policy_from_toml("""
policy_version = "forget-1"
[defaults.source]
threshold = 20
[defaults.stuffing]
tenant_window_ms = 10000
tenant_baseline_windows = 2
tenant_min_unknown = 5
[defaults.tenant_spray]
min_accounts = 5
min_sources = 1
window_ms = 10000
baseline_windows = 3
factor = 3.0
min_history_windows = 0
recount_ms = 0
[defaults.strangers]
redeem_ms = 10000
span_ms = 20000
active_ms = 10000
min_sources = 2
min_history_ms = 0
max_wave_ms = 60000
quick_ms = 5000
quick_span_ms = 10000
quick_min_sources = 2
""")
TIER_KEEP_WINDOWS = 11 + 2 + 2
"""keep_windows ((max_wave_ms + span_ms) / window_ms + baseline_windows), the 2 of the
horizon, counted from the last settled window (redeem_ms and one window back)."""


def unknown_records(n: int, seed: int) -> list[Record]:
    """``records`` with one failure in four for an account that does not exist."""
    rng = random.Random(seed)
    out = []
    for record in records(n, seed):
        body = orjson.loads(record.value)
        if body["outcome"] == "failure" and rng.random() < 0.25:
            body["failure_reason"] = "unknown_account"
            body["account"] = f"nobody{rng.randrange(100_000)}"
        out.append(
            Record(record.topic, record.partition, record.offset, record.key, orjson.dumps(body))
        )
    return out


RECORDS = unknown_records(3000, seed=9)


def run(restart_every: int) -> MemoryPipeline:
    twin = MemoryPipeline(Settings(), POLICY, rng=random.Random(restart_every))
    for batch, start in enumerate(range(0, len(RECORDS), 100)):
        twin.feed(RECORDS[start : start + 100], NOW_MS)
        if batch % restart_every == restart_every - 1:
            twin.restart()
    twin.finish()
    return twin


def live_keys(twin: MemoryPipeline) -> list[list[Any]]:
    rollup_log = twin.changelog["r"]
    return [loads(key) for key, value in rollup_log.items() if value is not None]


def test_restarts_from_the_tombstoned_changelog_give_the_engines_outputs() -> None:
    """Restored every 3 or 7 batches from a changelog that forgot most windows, the twin
    gives the Engine's decisions and alerts, every kind of tenant alert among them."""
    expected = engine_outputs(RECORDS, POLICY)
    kinds = {loads(alert)["type"] for alert in expected[1]}
    assert {"spray_tenant", "stuffing_tenant", "strangers_tenant"} <= kinds
    for restart_every in (3, 7):
        twin = run(restart_every)
        got = outputs([v for _, v in twin.out.decisions if v is not None], twin.out.alerts)
        assert got == expected


def test_the_changelog_keeps_only_the_windows_the_rollup_still_looks_at() -> None:
    """After ten minutes of ten-second windows, no share or fired record is older than
    the slow tier's horizon, and rule 8's and stuffing's shares none older than theirs."""
    twin = run(5)
    keys = live_keys(twin)
    shares = [key for key in keys if len(key) == 5 and key[2].__class__ is int]
    fired = [key for key in keys if key[1] == "fired"]
    last = max(key[2] for key in shares)
    by_kind: dict[str, int] = {}
    for key in shares:
        by_kind[key[3]] = min(by_kind.get(key[3], last), key[2])
    assert last - by_kind[ACCOUNT_SHARE] <= 3 + 2
    assert last - by_kind[SOURCE_SHARE] <= 3 + 2
    assert last - by_kind[UNKNOWN_SHARE] <= 2 + 2
    assert all(last - key[2] <= TIER_KEEP_WINDOWS for key in shares)
    assert all(last - key[3] <= TIER_KEEP_WINDOWS for key in fired)
    dead = sum(value is None for value in twin.changelog["r"].values())
    assert dead > 10 * len(shares)


def test_a_forgotten_window_names_its_shares_and_firings_for_the_changelog() -> None:
    """Rule 8's new window forgets the shares before its horizon by key, the tier's
    windows go with every part, and stuffing's fired window with its tag."""
    rollup = TenantRollup(POLICY)
    rollup.update("t", 0, ACCOUNT_SHARE, 1, 4, 1_000)
    rollup.update("t", 0, SOURCE_SHARE, 2, 3, 1_000)
    rollup.update("t", 0, UNKNOWN_SHARE, 2, 9, 1_000)
    rollup.stuffing.fired[("t", 0)] = 9
    rollup.advance(2_000)
    rollup.forgotten_shares.clear()
    rollup.update("t", 6, ACCOUNT_SHARE, 1, 1, 60_000)
    rollup.update("t", 6, UNKNOWN_SHARE, 0, 1, 60_000)
    rollup.advance(61_000)
    assert rollup.forgotten_shares == [
        (ACCOUNT_SHARE, "t", 0, 1),
        (SOURCE_SHARE, "t", 0, 2),
        (UNKNOWN_SHARE, "t", 0, 2),
    ]
    assert rollup.forgotten_fired == [(UNKNOWN_SHARE, "t", 0)]


def test_the_stage_tombstones_every_parts_share_of_a_forgotten_tier_window() -> None:
    """``EVERY_PART``: the x and r shares of the window from each upstream partition, and
    a forgotten firing's record by its tag (rule 8's has none)."""
    stage = RollupStage(POLICY, partitions=2)
    stage.rebuild(0, [])
    rollup = stage.rollups[0]
    rollup.forgotten_shares.extend([("x", "t", 4, EVERY_PART), ("a", "t", 4, 1)])
    rollup.forgotten_fired.extend([("", "t", 4), ("q", "t", 5)])
    result = stage.process(0, [[None, 2_000, "a", 0]], offset=0)
    tombstones = [key for key, value in result.changelog if value is None]
    assert tombstones == [
        dumps([0, "t", 4, "x", 0]),
        dumps([0, "t", 4, "x", 1]),
        dumps([0, "t", 4, "a", 1]),
        dumps([0, "fired", "t", 4]),
        dumps([0, "fired", "t", 5, "q"]),
    ]
