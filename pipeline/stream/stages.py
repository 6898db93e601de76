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

Replay = live: each stage partition applies its rows in event-time order, not in arrival
order. Rows go through a ``Sequencer`` (``pipeline.core.sequence``) that holds them until
every upstream partition has marked a later event time, then releases them sorted by
``(occurred_ms, event_id)``. Every upstream sends its mark to every downstream partition
(ingest to the account stage in its envelopes; the account and source stages to the
source stage and the rollup as mark rows), even with no rows for it. The marks and the
release position are in the changelog like the rest of the state; the held rows are not
(they are in the stage's input already): the commit record says which input message holds
the oldest of them (``[next, hold_from]``), a restore resumes the input there, and the
messages below ``next`` only hold their rows again (``Sequencer.rehold``: no outputs, no
changelog records), so the stage holds exactly what it held when it wrote the record.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pipeline.contracts.codec import dumps, loads
from pipeline.core.account import AccountShard
from pipeline.core.attempt import STEP_UP, Attempt, audit_outcome
from pipeline.core.dedupe import DEDUPE_CAPACITY, DEDUPE_HORIZON_MS
from pipeline.core.outbox import (
    ACCOUNT_SHARE,
    REDEEMED_SHARE,
    SOURCE_SHARE,
    STRANGER_SHARE,
    UNKNOWN_SHARE,
    Outbox,
)
from pipeline.core.policy import Policy, TenantPolicy
from pipeline.core.sequence import NO_MARK, Sequencer
from pipeline.core.source import SourceShard
from pipeline.stream.envelopes import (
    StageOutput,
    changelog_key,
    collect,
    commit_key,
    commit_record,
    commit_value,
)
from pipeline.stream.partitioning import source_partition
from pipeline.stream.progress import InputPosition


def _share_rows(
    out: Outbox, kind: str, partition: int, seq: int, attempt: Attempt, result: StageOutput
) -> None:
    """The shares one released row changed, stamped with its event time and order."""
    # ``kind`` names the stage's tenant shares; the others are the source stage's.
    for shares, share_kind in (
        (out.tenant_shares, kind),
        (out.unknown_shares, UNKNOWN_SHARE),
        (out.stranger_shares, STRANGER_SHARE),
        (out.redeemed_shares, REDEEMED_SHARE),
    ):
        for (tenant, window), share in shares.items():
            result.shares.append(
                [
                    tenant,
                    window,
                    share_kind,
                    partition,
                    share,
                    attempt.occurred_ms,
                    attempt.event_id,
                    seq,
                ]
            )
        shares.clear()


def partition_share(policy: Policy, partitions: int) -> Policy:
    """``policy`` with every tenant's ``entry_cap`` (and ``familiar.entry_cap``) split
    evenly over ``partitions``.

    The cap bounds a table per tenant, not per partition: a worker owning every partition
    holds at most ``entry_cap`` entries per table and tenant, as the policy says, and not
    ``partitions`` times that (8 x 100,000 entries per table at the defaults). Keys are
    spread evenly over partitions (account digests, CRC-32 of sources), so each shard
    holds its share."""

    def share(rules: TenantPolicy) -> TenantPolicy:
        familiar = rules.familiar.model_copy(
            update={"entry_cap": max(1, rules.familiar.entry_cap // partitions)}
        )
        return rules.model_copy(
            update={"entry_cap": max(1, rules.entry_cap // partitions), "familiar": familiar}
        )

    return policy.model_copy(
        update={
            "defaults": share(policy.defaults),
            "tenants": {name: share(rules) for name, rules in policy.tenants.items()},
        }
    )


class _Stage(InputPosition):
    """Shards by partition, upstream watermarks, rebuild from changelog records."""

    shard_type: type[AccountShard] | type[SourceShard]

    def __init__(
        self,
        policy: Policy,
        partitions: int,
        dedupe_horizon_ms: int = DEDUPE_HORIZON_MS,
        dedupe_capacity: int = DEDUPE_CAPACITY,
    ) -> None:
        self.policy = policy
        self.partitions = partitions
        self.shard_policy = partition_share(policy, partitions)
        self.dedupe_horizon_ms = dedupe_horizon_ms
        # ``dedupe_capacity`` bounds the event ids a worker remembers, whatever partitions
        # it owns: each partition's shard sees its share of the accounts (an event and its
        # duplicates share a partition), so it remembers its share of the ids.
        self.dedupe_capacity = max(1, dedupe_capacity // partitions)
        self.shards: dict[int, Any] = {}
        self.sequencers: dict[int, Sequencer] = {}
        self.sent_marks: dict[int, int] = {}
        self.inputs: dict[int, dict[int, int]] = {}
        # Envelopes must be applied in offset order with no gap (the upstream watermarks
        # above would otherwise skip the rows of an envelope that arrives after a later
        # one as replays): the input position, and the messages to hold rows again.
        InputPosition.__init__(self)

    def owns(self, partition: int) -> bool:
        return partition in self.shards

    def rebuild(self, partition: int, records: Iterable[tuple[bytes, bytes]]) -> StageOutput:
        """Build the shard of ``partition`` from its changelog records (key, value)."""
        shard = self.shard_type(
            self.shard_policy,
            part=partition,
            dedupe_horizon_ms=self.dedupe_horizon_ms,
            dedupe_capacity=self.dedupe_capacity,
        )
        inputs: dict[int, int] = {}
        next_envelope: int | None = None
        hold_from: int | None = None
        sequencer = Sequencer(self.upstreams)
        for raw_key, raw_value in records:
            key = loads(raw_key)
            if key[0] != partition or raw_value is None:
                continue
            value = loads(raw_value)
            if key[1] == "inputs":
                inputs = {int(p): int(o) for p, o in value["positions"].items()}
                sequencer.restore_meta(value["order"])
            elif key[1] == "next":
                next_envelope, hold_from = commit_value(value)
            elif key[1] == "held":  # a held row in a changelog written before hold_from
                sequencer.restore((key[2], key[3]), value)
            else:
                shard.restore(key[1:], value)
        sequencer.finish_restore()
        out = Outbox()
        shard.finish_restore(out)
        self.shards[partition] = shard
        self.sequencers[partition] = sequencer
        self.sent_marks[partition] = NO_MARK  # the first envelope sends the watermark again
        self.inputs[partition] = inputs
        self.resume(partition, next_envelope, hold_from)
        result = StageOutput()
        collect(out, result)
        return result

    def _reheld(self, partition: int, offset: int, result: StageOutput) -> StageOutput:
        """After ``_rehold`` pushed a message's rows: no outputs and no changelog records
        (the state is what the restored records say), only the stage's position."""
        self.advance(partition, offset)
        sequencer = self.sequencers[partition]
        if sequencer.released_ms > self.sent_marks.get(partition, NO_MARK):
            result.mark_ms = self.sent_marks[partition] = sequencer.released_ms
        result.held = len(sequencer)
        return result

    upstreams = 1  # upstream partitions feeding each partition (set by the subclass)

    def drop(self, partition: int) -> None:
        self.shards.pop(partition, None)
        self.sequencers.pop(partition, None)
        self.sent_marks.pop(partition, None)
        self.inputs.pop(partition, None)
        self.forget(partition)

    def expire(self, now_ms: int) -> list[tuple[bytes, None]]:
        """Tombstones for decisions past their expiry on the wall clock (no event needed),
        so an idle stream's topic forgets them. The index keeps them until the event-time
        watermark passes their expiry (that emits no second tombstone): the wall clock
        never changes what a later event is checked against."""
        from pipeline.core.keys import format_key

        lifted: list[tuple[bytes, None]] = []
        for shard in self.shards.values():
            for key in shard.index.announce_expired(now_ms):
                lifted.append((format_key(key).encode(), None))
        return lifted

    def _release(self, partition: int) -> list[tuple[int, int, Any]]:
        """The held rows the watermark now passes, in order (see the module docstring)."""
        return self.sequencers[partition].release()

    def _finish(
        self, partition: int, offset: int, shard: Any, out: Outbox, result: StageOutput
    ) -> None:
        self.advance(partition, offset)
        sequencer = self.sequencers[partition]
        shard.advance(shard.watermark_ms, out)
        collect(out, result)
        if sequencer.released_ms > self.sent_marks.get(partition, NO_MARK):
            result.mark_ms = self.sent_marks[partition] = sequencer.released_ms
        result.held = len(sequencer)
        # A crash may leave any prefix of these records written (they can span several
        # record batches); the restore counts them only once the commit record is there
        # (``commit_key``, written last): state, the upstream positions and release
        # position, then the next offset and the message holding the oldest held row.
        changelog = result.changelog
        for key, value in shard.take_dirty():
            changelog.append(
                (changelog_key(partition, key), dumps(value) if value is not None else None)
            )
        stale = sequencer.take_stale()
        result.held_records = len(stale)
        for upstream, position in stale:
            changelog.append((changelog_key(partition, ["held", upstream, position]), None))
        positions = {str(p): o for p, o in self.inputs[partition].items()}
        progress = {"positions": positions, "order": sequencer.meta()}
        changelog.append((changelog_key(partition, ["inputs"]), dumps(progress)))
        changelog.append((commit_key(partition), commit_record(offset + 1, sequencer)))

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
        self,
        policy: Policy,
        partitions: int,
        *,
        input_topic: str,
        dedupe_horizon_ms: int = DEDUPE_HORIZON_MS,
        dedupe_capacity: int = DEDUPE_CAPACITY,
    ) -> None:
        super().__init__(policy, partitions, dedupe_horizon_ms, dedupe_capacity)
        self.input_topic = input_topic
        self.version = policy.policy_version
        self.upstreams = partitions  # input partitions: the envelopes say how many

    def process(
        self,
        partition: int,
        offset: int,
        rows: list[list[Any]],
        marks: list[list[int]] | None = None,
        inputs: int | None = None,
    ) -> StageOutput:
        """Apply one envelope: hold its rows, take ingest's marks (``[input partition,
        watermark_ms]``; ``inputs`` is the input topic's partition count) and apply every
        row the watermark now passes, in event-time order."""
        shard: AccountShard = self.shards[partition]
        sequencer = self.sequencers[partition]
        if inputs is not None:
            sequencer.upstreams = inputs
        result = StageOutput()
        if self.reholding(partition, offset):
            for row in rows:
                sequencer.rehold(row[5], row[4], row[0], row[1], row, offset)
            for in_part, mark_ms in marks or ():
                sequencer.mark(in_part, mark_ms)
            return self._reheld(partition, offset, result)
        out = Outbox()
        released_ms = sequencer.released_ms
        for row in rows:
            in_part, in_off = row[0], row[1]
            if not self._fresh(partition, in_part, in_off):
                result.skipped += 1
                continue
            if row[5] < released_ms:
                result.note_late(in_part, in_off, row[5], released_ms)
            sequencer.push(row[5], row[4], in_part, in_off, row, offset)
        for in_part, mark_ms in marks or ():
            sequencer.mark(in_part, mark_ms)
        watermark = shard.watermark_ms
        for seq, occurred_ms, row in self._release(partition):
            service, plain = row[2], row[3]
            in_part, in_off = row[0], row[1]
            attempt = Attempt.from_row(row[4:])
            if occurred_ms > watermark:
                watermark = occurred_ms
            verdict = shard.step(attempt, watermark, out, seq)
            if out.forwards:
                self._forward(out.forwards, seq, partition, result)
            if out.tenant_shares:
                _share_rows(out, ACCOUNT_SHARE, partition, seq, attempt, result)
            if verdict is None:
                continue
            result.counted += 1
            result.audit.append(
                [
                    attempt.occurred_ms,
                    attempt.tenant,
                    service,
                    attempt.flow,
                    attempt.account,
                    plain,
                    attempt.source,
                    attempt.device or "",
                    attempt.trusted,
                    audit_outcome(attempt),
                    "" if attempt.failure_reason == STEP_UP else attempt.failure_reason or "",
                    verdict.applied,
                    1,
                    False,
                    self.version,
                    attempt.event_id,
                    self.input_topic,
                    in_part,
                    in_off,
                ]
            )
        self._finish(partition, offset, shard, out, result)
        return result

    def _forward(
        self, forwards: list[Attempt], seq: int, partition: int, result: StageOutput
    ) -> None:
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
        self.upstreams = partitions

    def process(self, partition: int, offset: int, rows: list[list[Any]]) -> StageOutput:
        """Apply one envelope of forwards ``[account partition, seq, *attempt]`` and marks
        ``[account partition, -1, watermark_ms]``, releasing rows in event-time order."""
        shard: SourceShard = self.shards[partition]
        sequencer = self.sequencers[partition]
        result = StageOutput()
        if self.reholding(partition, offset):
            for row in rows:
                if row[1] < 0:
                    sequencer.mark(row[0], row[2])
                else:
                    sequencer.rehold(row[3], row[2], row[0], row[1], row, offset)
            return self._reheld(partition, offset, result)
        out = Outbox()
        released_ms = sequencer.released_ms
        for row in rows:
            if row[1] < 0:
                sequencer.mark(row[0], row[2])
                continue
            if not self._fresh(partition, row[0], row[1]):
                result.skipped += 1
                continue
            if row[3] < released_ms:
                result.note_late(row[0], row[1], row[3], released_ms)
            sequencer.push(row[3], row[2], row[0], row[1], row, offset)
        watermark = shard.watermark_ms
        for seq, occurred_ms, row in self._release(partition):
            attempt = Attempt.from_row(row[2:])
            if occurred_ms > watermark:
                watermark = occurred_ms
            shard.step(attempt, watermark, out, seq)
            if (
                out.tenant_shares
                or out.unknown_shares
                or out.stranger_shares
                or out.redeemed_shares
            ):
                _share_rows(out, SOURCE_SHARE, partition, seq, attempt, result)
            result.counted += 1
        self._finish(partition, offset, shard, out, result)
        return result
