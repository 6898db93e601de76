"""The stages of the stream, free of faust: envelope in, outputs and changelog records out.

Each stage holds one core shard per partition it owns. The faust agents in
``pipeline.stream.app`` are thin shells over these classes, and the in-memory twin in
``pipeline.stream.memory`` drives the same classes without a broker, so one test suite
checks the logic both ways.

Exactly-once effect on state, with at-least-once delivery:

* every row carries its upstream coordinates; a stage remembers, per upstream
  partition, the highest position it applied (``inputs``) and skips anything at or
  below it, so an upstream replay after a crash is never counted twice;
* every core entry remembers the ``seq`` of the last row applied to it, so a replay of
  this stage's own input after a partial changelog flush skips per key;
* changelog records are written after the envelope's decisions and alerts are
  acknowledged by the broker, and faust flushes the producer before it commits input
  offsets: a crash anywhere replays, and replays are skipped as above.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pipeline.contracts.codec import dumps, encode, loads
from pipeline.contracts.models import AUDIT_COLUMNS
from pipeline.core.attempt import Attempt
from pipeline.core.engine import AccountShard, Outbox, SourceShard, TenantRollup
from pipeline.core.policy import Policy, TenantPolicy
from pipeline.stream.partitioning import source_partition

ROWS_PER_ENVELOPE = 1 << 16  # seq = offset * this + row index; envelopes never hold more
# Rows per message on the internal and audit topics: a few hundred bytes each, so a
# message stays well under the broker's default 1 MB limit however a batch is skewed.
MAX_ROWS_PER_MESSAGE = 2000


def chunks(rows: list[Any], size: int = MAX_ROWS_PER_MESSAGE) -> list[list[Any]]:
    """``rows`` in order, in lists of at most ``size``."""
    if len(rows) <= size:
        return [rows]
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def latest_shares(shares: list[list[Any]]) -> list[list[Any]]:
    """Tenant shares ``[tenant, window, kind, partition, share]``, each subject's latest
    only: a share is the shard's absolute count, so an older one of the same subject
    carries nothing (order of first appearance kept)."""
    latest: dict[tuple[Any, ...], list[Any]] = {}
    for share in shares:
        latest[(share[0], share[1], share[2], share[3])] = share
    return list(latest.values())


@dataclass
class StageOutput:
    """What one envelope produced, ready to send. Decision values of None are tombstones."""

    decisions: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    alerts: list[bytes] = field(default_factory=list)
    notices: list[tuple[bytes, bytes]] = field(default_factory=list)
    audit: list[list[Any]] = field(default_factory=list)
    forwards: dict[int, list[list[Any]]] = field(default_factory=dict)
    shares: list[list[Any]] = field(default_factory=list)
    changelog: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    counted: int = 0
    skipped: int = 0

    def audit_message(self) -> bytes | None:
        """All audit rows as one batch message (see ``audit_messages`` for the sizes sent)."""
        if not self.audit:
            return None
        return dumps({"v": 1, "columns": AUDIT_COLUMNS, "rows": self.audit})

    def audit_messages(self) -> list[bytes]:
        """The audit rows as batch messages of at most MAX_ROWS_PER_MESSAGE rows."""
        if not self.audit:
            return []
        return [dumps({"v": 1, "columns": AUDIT_COLUMNS, "rows": rows}) for rows in chunks(self.audit)]


def _collect(out: Outbox, result: StageOutput) -> None:
    for key, decision in out.decisions:
        result.decisions.append((key.encode(), encode(decision) if decision else None))
    result.alerts.extend(encode(alert) for alert in out.alerts)
    result.notices.extend((n.account_digest.encode(), encode(n)) for n in out.notices)
    out.decisions.clear()
    out.alerts.clear()
    out.notices.clear()


def partition_share(policy: Policy, partitions: int) -> Policy:
    """``policy`` with every tenant's ``entry_cap`` split evenly over ``partitions``.

    The cap bounds a table per tenant, not per partition: a worker owning every partition
    holds at most ``entry_cap`` entries per table and tenant, as the policy says, and not
    ``partitions`` times that (8 x 100,000 entries per table at the defaults). Keys are
    spread evenly over partitions (account digests, CRC-32 of sources), so each shard
    holds its share."""

    def share(rules: TenantPolicy) -> TenantPolicy:
        return rules.model_copy(update={"entry_cap": max(1, rules.entry_cap // partitions)})

    return policy.model_copy(update={
        "defaults": share(policy.defaults),
        "tenants": {name: share(rules) for name, rules in policy.tenants.items()},
    })  # fmt: skip


def _changelog_key(partition: int, key: list[Any]) -> bytes:
    return dumps([partition, *key])


class _Stage:
    """Shards by partition, upstream watermarks, rebuild from changelog records."""

    shard_type: type[AccountShard] | type[SourceShard]

    def __init__(
        self, policy: Policy, partitions: int, dedupe_horizon_ms: int = 3_600_000,
        dedupe_capacity: int = 1_000_000,
    ) -> None:  # fmt: skip
        self.policy = policy
        self.partitions = partitions
        self.shard_policy = partition_share(policy, partitions)
        self.dedupe_horizon_ms = dedupe_horizon_ms
        # ``dedupe_capacity`` bounds the event ids a worker remembers, whatever partitions
        # it owns: each partition's shard sees its share of the accounts (an event and its
        # duplicates share a partition), so it remembers its share of the ids.
        self.dedupe_capacity = max(1, dedupe_capacity // partitions)
        self.shards: dict[int, Any] = {}
        self.inputs: dict[int, dict[int, int]] = {}
        # Per partition: the offset of the next envelope of this stage's own input to
        # apply (None until known). Envelopes must be applied in offset order with no
        # gap: the upstream watermarks above would otherwise skip the rows of an envelope
        # that arrives after a later one as replays.
        self.next_envelope: dict[int, int | None] = {}

    def owns(self, partition: int) -> bool:
        return partition in self.shards

    def rebuild(self, partition: int, records: Iterable[tuple[bytes, bytes]]) -> StageOutput:
        """Build the shard of ``partition`` from its changelog records (key, value)."""
        shard = self.shard_type(
            self.shard_policy, part=partition, dedupe_horizon_ms=self.dedupe_horizon_ms,
            dedupe_capacity=self.dedupe_capacity,
        )  # fmt: skip
        inputs: dict[int, int] = {}
        next_envelope: int | None = None
        for raw_key, raw_value in records:
            key = loads(raw_key)
            if key[0] != partition or raw_value is None:
                continue
            value = loads(raw_value)
            if key[1] == "inputs":
                inputs = {int(p): int(o) for p, o in value.items()}
            elif key[1] == "next":
                next_envelope = int(value)
            else:
                shard.restore(key[1:], value)
        out = Outbox()
        shard.finish_restore(out)
        self.shards[partition] = shard
        self.inputs[partition] = inputs
        self.next_envelope[partition] = next_envelope
        result = StageOutput()
        _collect(out, result)
        return result

    def drop(self, partition: int) -> None:
        self.shards.pop(partition, None)
        self.inputs.pop(partition, None)
        self.next_envelope.pop(partition, None)

    def expected(self, partition: int) -> int | None:
        """Offset of the next envelope to apply on ``partition`` (None: not yet known)."""
        return self.next_envelope.get(partition)

    def expire(self, now_ms: int) -> list[tuple[bytes, None]]:
        """Tombstones for decisions past their expiry on the wall clock (no event needed)."""
        from pipeline.core.keys import format_key

        lifted: list[tuple[bytes, None]] = []
        for shard in self.shards.values():
            for key in shard.index.prune(now_ms):
                lifted.append((format_key(key).encode(), None))
        return lifted

    def _finish(
        self, partition: int, offset: int, shard: Any, out: Outbox, result: StageOutput
    ) -> None:
        self.next_envelope[partition] = offset + 1
        shard.advance(shard.watermark_ms, out)
        _collect(out, result)
        for key, value in shard.take_dirty():
            result.changelog.append(
                (_changelog_key(partition, key), dumps(value) if value is not None else None)
            )
        inputs = {str(p): o for p, o in self.inputs[partition].items()}
        result.changelog.append((_changelog_key(partition, ["inputs"]), dumps(inputs)))
        result.changelog.append((_changelog_key(partition, ["next"]), dumps(offset + 1)))

    def _fresh(self, partition: int, upstream: int, position: int) -> bool:
        """True once per upstream position: replays at or below the watermark are skipped."""
        applied = self.inputs[partition]
        if position <= applied.get(upstream, -1):
            return False
        applied[upstream] = position
        return True


class AccountStage(_Stage):
    """Rows partitioned by account: rules 1-4, mfa, escalation, lifetime; audit rows;
    forwards untrusted password failures and successes to the source stage."""

    shard_type = AccountShard

    def __init__(
        self, policy: Policy, partitions: int, *, input_topic: str,
        dedupe_horizon_ms: int = 3_600_000, dedupe_capacity: int = 1_000_000,
    ) -> None:  # fmt: skip
        super().__init__(policy, partitions, dedupe_horizon_ms, dedupe_capacity)
        self.input_topic = input_topic
        self.version = policy.policy_version

    def process(self, partition: int, offset: int, rows: list[list[Any]]) -> StageOutput:
        shard: AccountShard = self.shards[partition]
        result = StageOutput()
        out = Outbox()
        base_seq = offset * ROWS_PER_ENVELOPE
        watermark = shard.watermark_ms
        for index, row in enumerate(rows):
            in_part, in_off, service, plain = row[0], row[1], row[2], row[3]
            if not self._fresh(partition, in_part, in_off):
                result.skipped += 1
                continue
            attempt = Attempt.from_row(row[4:])
            if attempt.occurred_ms > watermark:
                watermark = attempt.occurred_ms
            seq = base_seq + index
            verdict = shard.step(attempt, watermark, out, seq)
            if out.forwards:
                self._forward(out.forwards, seq, partition, result)
            if verdict is None:
                continue
            result.counted += 1
            result.audit.append([
                attempt.occurred_ms, attempt.tenant, service, attempt.flow, attempt.account,
                plain, attempt.source, attempt.device or "", attempt.trusted,
                "success" if attempt.success else "failure", attempt.failure_reason or "",
                verdict.applied, 1, False, self.version, attempt.event_id, self.input_topic,
                in_part, in_off,
            ])  # fmt: skip
        for (tenant, window), share in out.partials.items():
            result.shares.append([tenant, window, "a", partition, share])
        out.partials.clear()
        self._finish(partition, offset, shard, out, result)
        return result

    def _forward(self, forwards: list[Attempt], seq: int, partition: int, result: StageOutput) -> None:
        for attempt in forwards:
            target = source_partition(attempt.tenant, attempt.source, self.partitions)
            result.forwards.setdefault(target, []).append([partition, seq, *attempt.to_row()])
        forwards.clear()


class SourceStage(_Stage):
    """Forwarded failures partitioned by source: spray and credential stuffing.

    No event-id dedupe here (as in the core's ``Engine``): the account stage counted
    each event once before forwarding it, and a replayed forward is skipped by its
    upstream position. A second memory of every id seen would double the worker's
    largest per-identifier structure under a flood."""

    shard_type = SourceShard

    def __init__(self, policy: Policy, partitions: int) -> None:
        super().__init__(policy, partitions, dedupe_horizon_ms=0)

    def process(self, partition: int, offset: int, rows: list[list[Any]]) -> StageOutput:
        shard: SourceShard = self.shards[partition]
        result = StageOutput()
        out = Outbox()
        base_seq = offset * ROWS_PER_ENVELOPE
        watermark = shard.watermark_ms
        for index, row in enumerate(rows):
            if not self._fresh(partition, row[0], row[1]):
                result.skipped += 1
                continue
            attempt = Attempt.from_row(row[2:])
            if attempt.occurred_ms > watermark:
                watermark = attempt.occurred_ms
            shard.step(attempt, watermark, out, base_seq + index)
            result.counted += 1
        for (tenant, window), share in out.partials.items():
            result.shares.append([tenant, window, "s", partition, share])
        out.partials.clear()
        for (tenant, window), share in out.unknown_partials.items():
            result.shares.append([tenant, window, "u", partition, share])
        out.unknown_partials.clear()
        self._finish(partition, offset, shard, out, result)
        return result


class RollupStage:
    """Tenant shares in, ``spray_tenant`` (rule 8) and ``stuffing_tenant`` alerts out. Shares are absolute values
    (each shard's latest count), so replays and duplicates are harmless."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.rollups: dict[int, TenantRollup] = {}

    def owns(self, partition: int) -> bool:
        return partition in self.rollups

    def rebuild(self, partition: int, records: Iterable[tuple[bytes, bytes]]) -> None:
        rollup = TenantRollup(self.policy)
        shares: list[list[Any]] = []
        for raw_key, raw_value in records:
            key = loads(raw_key)
            if key[0] != partition or raw_value is None:
                continue
            if key[1] == "fired":
                # [partition, "fired", tenant, window, kind]; records before stuffing_tenant
                # have no kind (rule 8's).
                if key[4:] == ["u"]:
                    rollup.stuffing.fired[(key[2], key[3])] = loads(raw_value)
                else:
                    rollup.fired.add((key[2], key[3]))
            else:
                shares.append([*key[1:], loads(raw_value)])
        for tenant, window, kind, part, share in shares:
            rollup.update(tenant, window, kind, part, share)
        self.rollups[partition] = rollup

    def drop(self, partition: int) -> None:
        self.rollups.pop(partition, None)

    def process(self, partition: int, shares: list[list[Any]]) -> StageOutput:
        rollup = self.rollups[partition]
        result = StageOutput()
        for tenant, window, kind, part, share in shares:
            alert = rollup.update(tenant, window, kind, part, share)
            result.changelog.append((dumps([partition, tenant, window, kind, part]), dumps(share)))
            if alert is not None:
                result.alerts.append(encode(alert))
                if kind == "u":  # what TenantStuffing.fired holds now (it may fire once more)
                    state = rollup.stuffing.fired[(tenant, window)]
                    fired_record = (dumps([partition, "fired", tenant, window, "u"]), dumps(state))
                else:
                    fired_record = (dumps([partition, "fired", tenant, window]), b"1")
                result.changelog.append(fired_record)
        return result
