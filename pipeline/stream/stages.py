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
source stage and the rollup as mark rows), even with no rows for it. The held rows,
the marks and the release position are in the changelog like the rest of the state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pipeline.contracts.codec import dumps, encode, loads
from pipeline.contracts.models import AUDIT_COLUMNS
from pipeline.core.account import AccountShard
from pipeline.core.attempt import Attempt
from pipeline.core.dedupe import DEDUPE_CAPACITY, DEDUPE_HORIZON_MS
from pipeline.core.outbox import ACCOUNT_SHARE, SOURCE_SHARE, UNKNOWN_SHARE, Outbox
from pipeline.core.policy import Policy, TenantPolicy
from pipeline.core.rollup import TICK_MS, TenantRollup
from pipeline.core.sequence import NO_MARK, Sequencer
from pipeline.core.source import SourceShard
from pipeline.stream.partitioning import source_partition

# Rows per message on the internal and audit topics: a few hundred bytes each, so a
# message stays well under the broker's default 1 MB limit however a batch is skewed.
MAX_ROWS_PER_MESSAGE = 2000


def chunks(rows: list[Any], size: int = MAX_ROWS_PER_MESSAGE) -> list[list[Any]]:
    """``rows`` in order, in lists of at most ``size``."""
    if len(rows) <= size:
        return [rows]
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def account_envelopes(
    rows: dict[int, list[list[Any]]],
    marks: list[list[int]],
    partitions: int,
    size: int = MAX_ROWS_PER_MESSAGE,
) -> list[tuple[int, list[list[Any]], list[list[int]]]]:
    """``(account partition, rows, marks)`` of one ingest batch: every partition gets the
    marks, rows or not (its watermark is the minimum over every input partition), in
    messages of at most ``size`` rows. The marks ride on each partition's last message
    only: they cover every row of the batch, so an earlier message carrying them would
    make the rows of the later ones late."""
    out: list[tuple[int, list[list[Any]], list[list[int]]]] = []
    for partition in range(partitions):
        parts = chunks(rows.get(partition, []), size)
        for i, part in enumerate(parts):
            out.append((partition, part, marks if i == len(parts) - 1 else []))
    return out


def latest_shares(shares: list[list[Any]]) -> list[list[Any]]:
    """Tenant shares ``[tenant, window, kind, partition, share, time_ms, event_id, seq]``,
    each subject's latest per second of event time only (a share is the shard's absolute
    count and rule 8 is evaluated at second boundaries, so an older one of the same
    subject and second carries nothing), then each upstream's latest mark
    ``[None, watermark_ms, kind, partition]``.

    The marks go last: a mark says nothing earlier follows, and the batch may be sent as
    several messages (``chunks``), so a mark moved ahead of shares sent after it in an
    earlier chunk would make them late. Moving a mark later only delays a release."""
    latest: dict[tuple[Any, ...], list[Any]] = {}
    marks: dict[tuple[Any, ...], list[Any]] = {}
    for share in shares:
        if share[0] is None:
            subject: tuple[Any, ...] = (share[2], share[3])
            old = marks.get(subject)
            if old is None or old[1] < share[1]:
                marks[subject] = share
        else:
            latest[(share[0], share[1], share[2], share[3], share[5] // TICK_MS)] = share
    return [*latest.values(), *marks.values()]


def _share_rows(
    out: Outbox, kind: str, partition: int, seq: int, attempt: Attempt, result: StageOutput
) -> None:
    """The shares one released row changed, stamped with its event time and order."""
    # ``kind`` names the stage's tenant shares; unknown-account shares are the source stage's.
    for shares, share_kind in ((out.tenant_shares, kind), (out.unknown_shares, UNKNOWN_SHARE)):
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
    # The stage partition's new watermark, to send to every downstream partition (None:
    # unchanged). Everything it will still send is at or after it in event time.
    mark_ms: int | None = None
    counted: int = 0
    skipped: int = 0
    held: int = 0

    def audit_message(self) -> bytes | None:
        """All audit rows as one batch message (see ``audit_messages`` for the sizes sent)."""
        if not self.audit:
            return None
        return dumps({"v": 1, "columns": AUDIT_COLUMNS, "rows": self.audit})

    def audit_messages(self) -> list[bytes]:
        """The audit rows as batch messages of at most MAX_ROWS_PER_MESSAGE rows."""
        if not self.audit:
            return []
        return [
            dumps({"v": 1, "columns": AUDIT_COLUMNS, "rows": rows}) for rows in chunks(self.audit)
        ]


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

    return policy.model_copy(
        update={
            "defaults": share(policy.defaults),
            "tenants": {name: share(rules) for name, rules in policy.tenants.items()},
        }
    )


def _changelog_key(partition: int, key: list[Any]) -> bytes:
    return dumps([partition, *key])


class _Stage:
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
            self.shard_policy,
            part=partition,
            dedupe_horizon_ms=self.dedupe_horizon_ms,
            dedupe_capacity=self.dedupe_capacity,
        )
        inputs: dict[int, int] = {}
        next_envelope: int | None = None
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
                next_envelope = int(value)
            elif key[1] == "held":
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
        self.next_envelope[partition] = next_envelope
        result = StageOutput()
        _collect(out, result)
        return result

    upstreams = 1  # upstream partitions feeding each partition (set by the subclass)

    def drop(self, partition: int) -> None:
        self.shards.pop(partition, None)
        self.sequencers.pop(partition, None)
        self.sent_marks.pop(partition, None)
        self.inputs.pop(partition, None)
        self.next_envelope.pop(partition, None)

    def expected(self, partition: int) -> int | None:
        """Offset of the next envelope to apply on ``partition`` (None: not yet known)."""
        return self.next_envelope.get(partition)

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
        self.next_envelope[partition] = offset + 1
        sequencer = self.sequencers[partition]
        shard.advance(shard.watermark_ms, out)
        _collect(out, result)
        if sequencer.released_ms > self.sent_marks.get(partition, NO_MARK):
            result.mark_ms = self.sent_marks[partition] = sequencer.released_ms
        result.held = len(sequencer)
        # A crash may leave any prefix of these records written, so their order matters:
        # state, then rows newly held, then ONE record with the upstream positions and the
        # release position together, then the envelope offset, then the rows released
        # from the held set (a restart discards stale ones by the release cursor).
        for key, value in shard.take_dirty():
            result.changelog.append(
                (_changelog_key(partition, key), dumps(value) if value is not None else None)
            )
        added, removed = sequencer.take_changes()
        for (upstream, position), held in added:
            result.changelog.append(
                (_changelog_key(partition, ["held", upstream, position]), dumps(held))
            )
        positions = {str(p): o for p, o in self.inputs[partition].items()}
        progress = {"positions": positions, "order": sequencer.meta()}
        result.changelog.append((_changelog_key(partition, ["inputs"]), dumps(progress)))
        result.changelog.append((_changelog_key(partition, ["next"]), dumps(offset + 1)))
        for upstream, position in removed:
            result.changelog.append((_changelog_key(partition, ["held", upstream, position]), None))

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
        out = Outbox()
        for row in rows:
            in_part, in_off = row[0], row[1]
            if not self._fresh(partition, in_part, in_off):
                result.skipped += 1
                continue
            sequencer.push(row[5], row[4], in_part, in_off, row)
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
                    "success" if attempt.success else "failure",
                    attempt.failure_reason or "",
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
        out = Outbox()
        for row in rows:
            if row[1] < 0:
                sequencer.mark(row[0], row[2])
                continue
            if not self._fresh(partition, row[0], row[1]):
                result.skipped += 1
                continue
            sequencer.push(row[3], row[2], row[0], row[1], row)
        watermark = shard.watermark_ms
        for seq, occurred_ms, row in self._release(partition):
            attempt = Attempt.from_row(row[2:])
            if occurred_ms > watermark:
                watermark = occurred_ms
            shard.step(attempt, watermark, out, seq)
            if out.tenant_shares or out.unknown_shares:
                _share_rows(out, SOURCE_SHARE, partition, seq, attempt, result)
            result.counted += 1
        self._finish(partition, offset, shard, out, result)
        return result


class RollupStage:
    """Tenant shares in, ``spray_tenant`` (rule 8) and ``stuffing_tenant`` alerts out.
    Shares are absolute values (each shard's latest count), so replays and duplicates are
    harmless. They are held by a ``Sequencer`` over every account and source partition and
    recorded in event-time order; rule 8 is evaluated at second boundaries
    (``TenantRollup.advance``), ``stuffing_tenant`` too, so the alerts do not depend on
    which partition's shares arrived first or how they were cut."""

    def __init__(self, policy: Policy, partitions: int = 1) -> None:
        self.policy = policy
        self.partitions = partitions
        self.rollups: dict[int, TenantRollup] = {}
        self.sequencers: dict[int, Sequencer] = {}
        # Per partition: the offset of the next shares message to apply (None until
        # known). Like the other stages', messages are applied in offset order with no
        # gap: a message faust dropped would otherwise leave its shares unrecorded.
        self.next_envelope: dict[int, int | None] = {}

    def owns(self, partition: int) -> bool:
        return partition in self.rollups

    def expected(self, partition: int) -> int | None:
        """Offset of the next shares message to apply on ``partition`` (None: not known)."""
        return self.next_envelope.get(partition)

    def rebuild(self, partition: int, records: Iterable[tuple[bytes, bytes]]) -> None:
        rollup = TenantRollup(self.policy)
        sequencer = Sequencer(2 * self.partitions)
        shares: list[list[Any]] = []
        meta: list[Any] | None = None
        next_envelope: int | None = None
        for raw_key, raw_value in records:
            key = loads(raw_key)
            if key[0] != partition or raw_value is None:
                continue
            if len(key) == 5 and key[2].__class__ is int:
                # [partition, tenant, window, kind, part]: a share (any tenant name,
                # "fired" or "order" included, is told apart by the window's type)
                shares.append([*key[1:], loads(raw_value)])
            elif key[1] == "fired":
                # [partition, "fired", tenant, window, kind]; records before stuffing_tenant
                # have no kind (rule 8's).
                if key[4:] == [UNKNOWN_SHARE]:
                    rollup.stuffing.fired[(key[2], key[3])] = loads(raw_value)
                else:
                    rollup.fired.add((key[2], key[3]))
            elif key[1] == "held":
                sequencer.restore((key[2], key[3]), loads(raw_value))
            elif key[1] == "order":
                meta = loads(raw_value)
            elif key[1] == "next":
                next_envelope = int(loads(raw_value))
        for tenant, window, kind, part, share in shares:
            rollup.update(tenant, window, kind, part, share)
        rollup.touched.clear()
        rollup.touched_unknown.clear()
        if meta is not None:
            tick_ms, touched, order = meta[:3]
            rollup.tick_ms = tick_ms
            rollup.touched.update(((tenant, window), None) for tenant, window in touched)
            touched_unknown = meta[3] if len(meta) > 3 else ()
            rollup.touched_unknown.update(
                ((tenant, window), None) for tenant, window in touched_unknown
            )
            sequencer.restore_meta(order)
        sequencer.finish_restore()
        self.rollups[partition] = rollup
        self.sequencers[partition] = sequencer
        self.next_envelope[partition] = next_envelope

    def drop(self, partition: int) -> None:
        self.rollups.pop(partition, None)
        self.sequencers.pop(partition, None)
        self.next_envelope.pop(partition, None)

    def process(
        self, partition: int, shares: list[list[Any]], offset: int | None = None
    ) -> StageOutput:
        """Hold shares ``[tenant, window, kind, part, share, time_ms, event_id, seq]`` and
        take marks ``[None, watermark_ms, kind, part]``; record what the watermark passes.
        ``offset`` is the message's (the next one expected is recorded with the state)."""
        rollup = self.rollups[partition]
        sequencer = self.sequencers[partition]
        result = StageOutput()
        for share in shares:
            upstream = share[3] if share[2] == ACCOUNT_SHARE else self.partitions + share[3]
            if share[0] is None:
                sequencer.mark(upstream, share[1])
            elif share[5] >= sequencer.released_ms or share[4] > rollup.recorded(*share[:4]):
                # (an older share re-sent after an upstream's restart carries nothing: skipped)
                # One source row may change its source and its unknown-account share under one upstream
                # position: the held row's position tells them apart.
                position = 2 * share[7] + (share[2] == UNKNOWN_SHARE)
                sequencer.push(share[5], share[6], upstream, position, share[:5])
        alerts: list[Any] = []
        for _seq, time_ms, (tenant, window, kind, part, share) in sequencer.release():
            alerts.extend(rollup.advance(time_ms))
            rollup.update(tenant, window, kind, part, share)
            result.changelog.append((dumps([partition, tenant, window, kind, part]), dumps(share)))
        alerts.extend(rollup.advance(sequencer.released_ms))
        for alert in alerts:
            result.alerts.append(encode(alert))
            window = _window(alert)
            if (
                alert.type == "stuffing_tenant"
            ):  # what TenantStuffing.fired holds (it may fire once more)
                state = rollup.stuffing.fired[(alert.tenant, window)]
                result.changelog.append(
                    (dumps([partition, "fired", alert.tenant, window, UNKNOWN_SHARE]), dumps(state))
                )
            else:
                result.changelog.append((dumps([partition, "fired", alert.tenant, window]), b"1"))
        added, removed = sequencer.take_changes()  # in the order _Stage._finish explains
        for (upstream, position), held in added:
            result.changelog.append(
                (_changelog_key(partition, ["held", upstream, position]), dumps(held))
            )
        meta = [
            rollup.tick_ms,
            [list(slot) for slot in rollup.touched],
            sequencer.meta(),
            [list(slot) for slot in rollup.touched_unknown],
        ]
        result.changelog.append((_changelog_key(partition, ["order"]), dumps(meta)))
        if offset is not None:
            self.next_envelope[partition] = offset + 1
            result.changelog.append((_changelog_key(partition, ["next"]), dumps(offset + 1)))
        for upstream, position in removed:
            result.changelog.append((_changelog_key(partition, ["held", upstream, position]), None))
        result.held = len(sequencer)
        return result


def _window(alert: Any) -> int:
    """The tumbling window index of a ``spray_tenant`` alert."""
    from pipeline.contracts.models import datetime_to_ms

    start = datetime_to_ms(alert.window_start)
    return start // (datetime_to_ms(alert.window_end) - start)
