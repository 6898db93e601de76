"""The tenant rollup stage, free of faust: tenant shares in, rule 8's ``spray_tenant`` and
``stuffing_tenant`` alerts out, in event-time order (see ``pipeline.stream.stages`` for the
guarantees every stage keeps)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pipeline.contracts.codec import dumps, encode, loads
from pipeline.core.outbox import ACCOUNT_SHARE, SOURCE_KINDS, STRANGER_SHARE, UNKNOWN_SHARE
from pipeline.core.policy import Policy
from pipeline.core.rollup import TenantRollup
from pipeline.core.sequence import Sequencer
from pipeline.core.strangers_tier import EVERY_PART, QUICK_FIRED
from pipeline.stream.envelopes import (
    StageOutput,
    changelog_key,
    commit_key,
    commit_record,
    commit_value,
)
from pipeline.stream.progress import InputPosition

QUICK_SUM = "quick"
"""``[partition, "quick", tenant, window]``: the quick check's sum at that window."""


class RollupStage(InputPosition):
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
        # Like the other stages', messages are applied in offset order with no gap (a
        # message faust dropped would otherwise leave its shares unrecorded), and after a
        # restore those below the restored next one only hold their shares again.
        InputPosition.__init__(self)

    def owns(self, partition: int) -> bool:
        return partition in self.rollups

    def rebuild(self, partition: int, records: Iterable[tuple[bytes, bytes]]) -> None:
        rollup = TenantRollup(self.policy)
        sequencer = Sequencer(2 * self.partitions)
        shares: list[list[Any]] = []
        meta: list[Any] | None = None
        next_envelope: int | None = None
        hold_from: int | None = None
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
                elif key[4:] == [STRANGER_SHARE]:
                    rollup.tier.slow_fired.add((key[2], key[3]))
                elif key[4:] == [QUICK_FIRED]:
                    rollup.tier.quick_fired.add((key[2], key[3]))
                else:
                    rollup.fired.add((key[2], key[3]))
                    rollup.tier.rule8_fired.add((key[2], key[3]))
            elif key[1] == QUICK_SUM:  # [partition, "quick", tenant, window]
                rollup.tier.quick_sums.setdefault(key[2], {})[key[3]] = loads(raw_value)
            elif key[1] == "held":  # a changelog written before hold_from
                sequencer.restore((key[2], key[3]), loads(raw_value))
            elif key[1] == "order":
                meta = loads(raw_value)
            elif key[1] == "next":
                next_envelope, hold_from = commit_value(loads(raw_value))
        rollup.tier.restored()
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
            if len(meta) > 4:  # records before the wave challenge have no last share times
                rollup.last_share_ms.update(meta[4])
            if len(meta) > 5:  # nor, before the lead-in union, the last wave per tenant
                rollup.waves.update(meta[5])
            sequencer.restore_meta(order)
        sequencer.finish_restore()
        self.rollups[partition] = rollup
        self.sequencers[partition] = sequencer
        self.resume(partition, next_envelope, hold_from)

    def drop(self, partition: int) -> None:
        self.rollups.pop(partition, None)
        self.sequencers.pop(partition, None)
        self.forget(partition)

    def _rehold(self, partition: int, shares: list[list[Any]], offset: int) -> StageOutput:
        """A message below the restored next one: hold its shares that were held, no more."""
        sequencer = self.sequencers[partition]
        for share in shares:
            upstream = share[3] if share[2] == ACCOUNT_SHARE else self.partitions + share[3]
            if share[0] is None:
                sequencer.mark(upstream, share[1])
            else:
                position = _position(share)
                sequencer.rehold(share[5], share[6], upstream, position, share[:5], offset)
        self.advance(partition, offset)
        result = StageOutput()
        result.held = len(sequencer)
        return result

    def process(
        self, partition: int, shares: list[list[Any]], offset: int | None = None
    ) -> StageOutput:
        """Hold shares ``[tenant, window, kind, part, share, time_ms, event_id, seq]`` and
        take marks ``[None, watermark_ms, kind, part]``; record what the watermark passes.
        ``offset`` is the message's (the next one expected is recorded with the state)."""
        if offset is not None and self.reholding(partition, offset):
            return self._rehold(partition, shares, offset)
        rollup = self.rollups[partition]
        sequencer = self.sequencers[partition]
        result = StageOutput()
        origin = -1 if offset is None else offset
        for share in shares:
            upstream = share[3] if share[2] == ACCOUNT_SHARE else self.partitions + share[3]
            if share[0] is None:
                sequencer.mark(upstream, share[1])
            elif share[5] >= sequencer.released_ms or share[4] > rollup.recorded(*share[:4]):
                # (an older share re-sent after an upstream's restart carries nothing: skipped)
                position = _position(share)
                if share[5] < sequencer.released_ms:
                    result.note_late(upstream, position, share[5], sequencer.released_ms)
                sequencer.push(share[5], share[6], upstream, position, share[:5], origin)
        for _seq, time_ms, (tenant, window, kind, part, share) in sequencer.release():
            tick_ms = rollup.tick_ms
            alerts = rollup.advance(time_ms)
            if rollup.tick_ms != tick_ms:  # an evaluation: its records before this share's
                self._records(partition, rollup, alerts, result)
            rollup.update(tenant, window, kind, part, share, time_ms)
            result.changelog.append((dumps([partition, tenant, window, kind, part]), dumps(share)))
        self._records(partition, rollup, rollup.advance(sequencer.released_ms), result)
        for wire_key, decision in rollup.decisions:  # wave challenges (never tombstoned)
            result.decisions.append((wire_key.encode(), encode(decision)))
        rollup.decisions.clear()
        stale = sequencer.take_stale()  # the commit record last: _Stage._finish
        result.held_records = len(stale)
        for upstream, position in stale:
            result.changelog.append((changelog_key(partition, ["held", upstream, position]), None))
        meta = [
            rollup.tick_ms,
            [list(slot) for slot in rollup.touched],
            sequencer.meta(),
            [list(slot) for slot in rollup.touched_unknown],
            rollup.last_share_ms,
            rollup.waves,
        ]
        result.changelog.append((changelog_key(partition, ["order"]), dumps(meta)))
        if offset is not None:
            self.advance(partition, offset)
            result.changelog.append((commit_key(partition), commit_record(offset + 1, sequencer)))
        result.held = len(sequencer)
        return result

    def _records(
        self, partition: int, rollup: TenantRollup, alerts: list[Any], result: StageOutput
    ) -> None:
        """An evaluation's alerts, and its changelog records in the order it made them:
        what fired, then tombstones for the shares and fired windows it forgot (its
        changelog holds no more than its memory: a window is recorded until nothing looks
        at it, and a window that fired and was forgotten in one batch ends deleted)."""
        for alert in alerts:
            result.alerts.append(encode(alert))
            if alert.type != "stuffing_tenant":
                continue
            # What TenantStuffing.fired holds (it may fire once more); a window forgotten
            # since (in the same evaluation) has its tombstone below.
            window = _window(alert)
            state = rollup.stuffing.fired.get((alert.tenant, window))
            if state is not None:
                result.changelog.append(
                    (dumps([partition, "fired", alert.tenant, window, UNKNOWN_SHARE]), dumps(state))
                )
        for tenant, window in rollup.newly_fired:  # rule 8's, alerted or not
            result.changelog.append((dumps([partition, "fired", tenant, window]), b"1"))
        rollup.newly_fired.clear()
        tier = rollup.tier
        for tenant, window in tier.newly_slow_fired:  # the slow tier's
            result.changelog.append(
                (dumps([partition, "fired", tenant, window, STRANGER_SHARE]), b"1")
            )
        tier.newly_slow_fired.clear()
        for tenant, window in tier.newly_quick_fired:  # the slow tier's quick check
            result.changelog.append(
                (dumps([partition, "fired", tenant, window, QUICK_FIRED]), b"1")
            )
        tier.newly_quick_fired.clear()
        for tenant, window, total in tier.newly_quick_sums:
            key = dumps([partition, QUICK_SUM, tenant, window])
            result.changelog.append((key, None if total is None else dumps(total)))
        tier.newly_quick_sums.clear()
        for kind, tenant, window, part in rollup.forgotten_shares:
            for each in range(self.partitions) if part == EVERY_PART else (part,):
                result.changelog.append((dumps([partition, tenant, window, kind, each]), None))
        rollup.forgotten_shares.clear()
        for tag, tenant, window in rollup.forgotten_fired:
            fired = [partition, "fired", tenant, window]
            result.changelog.append((dumps([*fired, tag] if tag else fired), None))
        rollup.forgotten_fired.clear()


def _position(share: list[Any]) -> int:
    """A held share's position under its upstream: one source row may change its source,
    unknown-account, stranger and redeemed shares, so each kind has its own slot."""
    kind: str = share[2]
    seq: int = share[7]
    return 4 * seq + (SOURCE_KINDS.index(kind) if kind != ACCOUNT_SHARE else 0)


def _window(alert: Any) -> int:
    """The tumbling window index of a ``spray_tenant`` alert."""
    from pipeline.contracts.models import datetime_to_ms

    start = datetime_to_ms(alert.window_start)
    return start // (datetime_to_ms(alert.window_end) - start)
