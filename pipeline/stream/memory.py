"""The in-memory twin of the worker: the same ingest and stages, wired by lists.

It runs what ``pipeline.stream.app`` runs, minus faust and the broker, so tests can pin
the stream's logic (partitioning, envelopes, upstream watermarks, rebuild from
changelog records, event-time marks) against the single-process ``Engine`` quickly, and
the integration suite then checks the same answers on the real broker.

Each stage partition has a log of envelopes (a topic partition) and a read position.
``pump`` delivers them in offset order; given a random generator it picks the next
partition at random, so a test can try arbitrary interleavings across partitions, as the
broker may deliver. After ``restart`` each stage reads its log again from the offset its
changelog names (the message with the oldest row it held), as the worker does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from pipeline.contracts.codec import loads
from pipeline.core.outbox import ACCOUNT_SHARE, SOURCE_SHARE
from pipeline.core.policy import Policy
from pipeline.settings import Settings
from pipeline.stream.envelopes import (
    MAX_ROWS_PER_MESSAGE,
    StageOutput,
    account_envelopes,
)
from pipeline.stream.ingest import DeadLetter, Ingest, Record
from pipeline.stream.marks import InputMarks
from pipeline.stream.partitioning import tenant_partition
from pipeline.stream.rollup_stage import RollupStage
from pipeline.stream.stages import AccountStage, SourceStage

# The stage partitions' queues and changelogs, by stage.
_ACCOUNTS, _SOURCES, _ROLLUP = "a", "s", "r"


@dataclass
class MemoryOutputs:
    decisions: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    alerts: list[bytes] = field(default_factory=list)
    audit_rows: list[list[Any]] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)

    def active_decisions(self) -> dict[bytes, bytes]:
        """What a compacted decision topic converges to: the last value per key, minus
        tombstones."""
        latest: dict[bytes, bytes | None] = {}
        for key, value in self.decisions:
            latest[key] = value
        return {k: v for k, v in latest.items() if v is not None}


class MemoryPipeline:
    """Feed records in batches; stages see the envelopes of each (batch, partition), at most
    ``envelope_rows`` rows each, as the worker sends them."""

    def __init__(
        self,
        settings: Settings,
        policy: Policy,
        rng: random.Random | None = None,
        input_partitions: int | None = None,
        envelope_rows: int = MAX_ROWS_PER_MESSAGE,
    ) -> None:
        kafka = settings.kafka
        self.partitions = kafka.partitions
        self.input_partitions = input_partitions or kafka.partitions
        self.ingest = Ingest.from_settings(settings, policy)
        self.accounts = AccountStage(policy, kafka.partitions, input_topic=kafka.input_topic)
        self.sources = SourceStage(policy, kafka.partitions)
        self.rollup = RollupStage(policy, kafka.partitions)
        self.marks = InputMarks()
        self.rng = rng
        self.envelope_rows = envelope_rows
        self.changelog: dict[str, dict[bytes, bytes | None]] = {
            _ACCOUNTS: {},
            _SOURCES: {},
            _ROLLUP: {},
        }
        self.logs: dict[tuple[str, int], list[Any]] = {}
        self.positions: dict[tuple[str, int], int] = {}
        self.out = MemoryOutputs()

    def _send(self, stage: str, partition: int, message: Any) -> None:
        self.logs.setdefault((stage, partition), []).append(message)

    def feed(self, records: list[Record], now_ms: int, *, pump: bool = True) -> None:
        """Ingest one batch: an envelope with ingest's marks to every account partition."""
        result = self.ingest.process(records, now_ms)
        self.out.dead.extend(result.dead)
        for rows in result.rows.values():
            for row in rows:
                self.marks.observe(row[0], row[5], 0)  # type: ignore[arg-type]
        marks = self.marks.marks(range(self.input_partitions), (), 0)
        self._envelopes(result.rows, marks)
        if pump:
            self.pump()

    def finish(self) -> None:
        """Every input partition read to its end and idle: everything is released."""
        every = range(self.input_partitions)
        self.marks.marks(every, every, 1 << 40)  # read to the end from now on...
        marks = self.marks.marks(every, every, (1 << 40) + self.marks.idle_ms)  # ...and idle since
        self._envelopes({}, marks)
        self.pump()

    def _envelopes(self, rows: dict[int, list[list[Any]]], marks: list[list[int]]) -> None:
        for partition, part, part_marks in account_envelopes(
            rows, marks, self.partitions, self.envelope_rows
        ):
            self._send(_ACCOUNTS, partition, (part, part_marks))

    def pump(self) -> None:
        """Deliver every queued envelope (in a random partition order when given a rng)."""
        while True:
            ready = sorted(k for k, log in self.logs.items() if self.positions.get(k, 0) < len(log))
            if not ready:
                return
            stage, partition = self.rng.choice(ready) if self.rng is not None else ready[0]
            offset = self.positions.get((stage, partition), 0)
            self.positions[(stage, partition)] = offset + 1
            message = self.logs[(stage, partition)][offset]
            if stage == _ACCOUNTS:
                self._account(partition, offset, *message)
            elif stage == _SOURCES:
                self._source(partition, offset, message)
            else:
                self._rollup(partition, offset, message)

    def _account(
        self, partition: int, offset: int, rows: list[list[Any]], marks: list[list[int]]
    ) -> None:
        if not self.accounts.owns(partition):
            self._collect(
                self.accounts.rebuild(partition, self._records(_ACCOUNTS, partition)), _ACCOUNTS
            )
        result = self.accounts.process(partition, offset, rows, marks, self.input_partitions)
        self._collect(result, _ACCOUNTS)
        for target in range(self.partitions):
            forwarded = list(result.forwards.get(target, []))
            if result.mark_ms is not None:
                forwarded.append([partition, -1, result.mark_ms])
            if forwarded:
                self._send(_SOURCES, target, forwarded)
        self._shares(result, ACCOUNT_SHARE, partition)

    def _source(self, partition: int, offset: int, rows: list[list[Any]]) -> None:
        if not self.sources.owns(partition):
            self._collect(
                self.sources.rebuild(partition, self._records(_SOURCES, partition)), _SOURCES
            )
        result = self.sources.process(partition, offset, rows)
        self._collect(result, _SOURCES)
        self._shares(result, SOURCE_SHARE, partition)

    def _shares(self, result: StageOutput, kind: str, partition: int) -> None:
        by_target: dict[int, list[list[Any]]] = {}
        for share in result.shares:
            by_target.setdefault(tenant_partition(share[0], self.partitions), []).append(share)
        for target in range(self.partitions):
            shares = by_target.get(target, [])
            if result.mark_ms is not None:
                shares.append([None, result.mark_ms, kind, partition])
            if shares:
                self._send(_ROLLUP, target, shares)

    def _rollup(self, partition: int, offset: int, shares: list[list[Any]]) -> None:
        if not self.rollup.owns(partition):
            self.rollup.rebuild(partition, self._records(_ROLLUP, partition))
        self._collect(self.rollup.process(partition, shares, offset), _ROLLUP)

    def _records(self, stage: str, partition: int) -> list[tuple[bytes, bytes]]:
        return [
            (k, v)
            for k, v in self.changelog[stage].items()
            if v is not None and loads(k)[0] == partition
        ]

    def _collect(self, result: StageOutput, stage: str) -> None:
        self.out.decisions.extend(result.decisions)
        self.out.alerts.extend(result.alerts)
        self.out.audit_rows.extend(result.audit)
        for key, value in result.changelog:
            self.changelog[stage][key] = value

    def restart(self) -> None:
        """Forget every shard, as a crashed worker would, and rebuild each from its
        changelog; each stage partition reads its log again from the offset it names."""
        for partition in list(self.accounts.shards):
            self.accounts.drop(partition)
            self._collect(
                self.accounts.rebuild(partition, self._records(_ACCOUNTS, partition)), _ACCOUNTS
            )
            self.positions[(_ACCOUNTS, partition)] = self.accounts.expected(partition) or 0
        for partition in list(self.sources.shards):
            self.sources.drop(partition)
            self._collect(
                self.sources.rebuild(partition, self._records(_SOURCES, partition)), _SOURCES
            )
            self.positions[(_SOURCES, partition)] = self.sources.expected(partition) or 0
        for partition in list(self.rollup.rollups):
            self.rollup.drop(partition)
            self.rollup.rebuild(partition, self._records(_ROLLUP, partition))
            self.positions[(_ROLLUP, partition)] = self.rollup.expected(partition) or 0
