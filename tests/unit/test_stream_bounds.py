"""A worker's stages stay within their bounds under a flood of attacker-chosen identifiers."""

from __future__ import annotations

import hashlib
from typing import Any

from pipeline.core.attempt import Attempt
from pipeline.core.policy import policy_from_toml
from pipeline.stream.partitioning import account_partition
from pipeline.stream.stages import AccountStage, SourceStage

PARTITIONS = 8
CAP = 800
DEDUPE_CAPACITY = 4_000
T0_MS = 1_790_000_000_000


def flood_rows(start: int, count: int) -> dict[int, list[list[Any]]]:
    """Untrusted failures of ``count`` distinct accounts from 300 sources, by account partition."""
    rows: dict[int, list[list[Any]]] = {}
    for i in range(start, start + count):
        digest = hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest()
        attempt = Attempt(
            event_id=f"flood-{i}",
            occurred_ms=T0_MS + i,
            tenant="default",
            account=digest,
            source=f"10.1.{i % 300 // 250}.{i % 250}",
            device=None,
            session=None,
            trusted=False,
            flow="login",
            success=False,
            failure_reason="unknown_account",
        )
        partition = account_partition(attempt.account, PARTITIONS)
        rows.setdefault(partition, []).append([0, i, "web", None, *attempt.to_row()])
    return rows


def test_the_policy_cap_is_split_over_partitions_for_every_tenant() -> None:
    """entry_cap 1,000 over 8 partitions is 125 per shard, in [defaults] and in a tenant."""
    policy = policy_from_toml("[defaults]\nentry_cap = 1000\n[tenants.acme]\nentry_cap = 4000\n")
    shard = AccountStage(policy, PARTITIONS, input_topic="in").shard_policy
    assert (shard.defaults.entry_cap, shard.for_tenant("acme").entry_cap) == (125, 500)
    assert shard.policy_version == policy.policy_version


def test_a_flood_holds_at_most_dedupe_capacity_ids_and_capped_tables() -> None:
    """50,000 distinct accounts and event ids through both stages of a worker owning every
    partition: at most dedupe_capacity ids remembered in all, none in the source stage, and
    every table at or under its share of the cap."""
    policy = policy_from_toml(f'policy_version = "bounds"\n[defaults]\nentry_cap = {CAP}\n')
    accounts = AccountStage(policy, PARTITIONS, input_topic="in", dedupe_capacity=DEDUPE_CAPACITY)
    sources = SourceStage(policy, PARTITIONS)
    offsets = dict.fromkeys(range(PARTITIONS), 0)
    source_offsets = dict.fromkeys(range(PARTITIONS), 0)
    for partition in range(PARTITIONS):
        accounts.rebuild(partition, [])
        sources.rebuild(partition, [])
    for start in range(0, 50_000, 2_500):
        # Marks past the batch release its rows at once (one input partition; every account partition).
        mark = T0_MS + start + 2_500
        for partition, rows in flood_rows(start, 2_500).items():
            result = accounts.process(partition, offsets[partition], rows, [[0, mark]], 1)
            offsets[partition] += 1
            for target, forwarded in result.forwards.items():
                marks = [[p, -1, mark] for p in range(PARTITIONS)]
                sources.process(target, source_offsets[target], forwarded + marks)
                source_offsets[target] += 1
    remembered = sum(len(shard.dedupe) for shard in accounts.shards.values())
    assert DEDUPE_CAPACITY // 2 <= remembered <= DEDUPE_CAPACITY
    assert [shard.dedupe for shard in sources.shards.values()] == [None] * PARTITIONS
    for stage in (accounts, sources):
        for shard in stage.shards.values():
            for tables in shard.tenants.values():
                assert max(len(table) for table in tables.tables()) <= CAP // PARTITIONS
    # The three account tables a flood fills (account_source, account, and the lock's
    # streaks) hold the cap each, over all partitions.
    assert sum(s.entries() for s in accounts.shards.values()) == 3 * CAP
    assert sum(s.metrics.counted for s in sources.shards.values()) == 50_000
