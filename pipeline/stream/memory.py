"""The in-memory twin of the worker: the same ingest and stages, wired by lists.

It runs what ``pipeline.stream.app`` runs, minus faust and the broker, so tests can pin
the stream's logic (partitioning, envelopes, upstream watermarks, rebuild from
changelog records) against the single-process ``Engine`` quickly, and the integration
suite then checks the same answers on the real broker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.contracts.codec import loads
from pipeline.core.policy import Policy
from pipeline.settings import Settings
from pipeline.stream.app import build_normaliser, hash_tenant
from pipeline.stream.ingest import DeadLetter, Ingest, Record
from pipeline.stream.stages import AccountStage, RollupStage, SourceStage, StageOutput


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
    """Feed records in batches; stages see one envelope per (batch, partition)."""

    def __init__(self, settings: Settings, policy: Policy) -> None:
        kafka = settings.kafka
        self.partitions = kafka.partitions
        self.ingest = Ingest(
            normaliser=build_normaliser(settings, policy), partitions=kafka.partitions,
            max_event_bytes=settings.ingest.max_event_bytes,
            max_future_skew_ms=settings.ingest.max_future_skew_ms,
            max_past_skew_ms=settings.ingest.max_past_skew_ms,
            tenants=frozenset(settings.ingest.tenants), max_tenants=settings.ingest.max_tenants,
        )  # fmt: skip
        self.accounts = AccountStage(policy, kafka.partitions, input_topic=kafka.input_topic)
        self.sources = SourceStage(policy, kafka.partitions)
        self.rollup = RollupStage(policy)
        self.changelog: dict[str, dict[bytes, bytes | None]] = {"a": {}, "s": {}}
        self.offsets: dict[tuple[str, int], int] = {}
        self.out = MemoryOutputs()

    def _offset(self, topic: str, partition: int) -> int:
        offset = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = offset + 1
        return offset

    def feed(self, records: list[Record], now_ms: int) -> None:
        result = self.ingest.process(records, now_ms)
        self.out.dead.extend(result.dead)
        for partition, rows in sorted(result.rows.items()):
            self._account(partition, rows)

    def _account(self, partition: int, rows: list[list[Any]]) -> None:
        if not self.accounts.owns(partition):
            self._collect(self.accounts.rebuild(partition, self._records("a", partition)), "a")
        result = self.accounts.process(partition, self._offset("a", partition), rows)
        self._collect(result, "a")
        for target, forwarded in sorted(result.forwards.items()):
            if not self.sources.owns(target):
                self._collect(self.sources.rebuild(target, self._records("s", target)), "s")
            self._collect(self.sources.process(target, self._offset("s", target), forwarded), "s")

    def _records(self, stage: str, partition: int) -> list[tuple[bytes, bytes]]:
        return [
            (k, v) for k, v in self.changelog[stage].items()
            if v is not None and loads(k)[0] == partition
        ]  # fmt: skip

    def _collect(self, result: StageOutput, stage: str) -> None:
        self.out.decisions.extend(result.decisions)
        self.out.alerts.extend(result.alerts)
        self.out.audit_rows.extend(result.audit)
        for key, value in result.changelog:
            self.changelog[stage][key] = value
        for share in result.shares:
            part = hash_tenant(share[0], self.partitions)
            if not self.rollup.owns(part):
                self.rollup.rebuild(part, [])
            self.out.alerts.extend(self.rollup.process(part, [share]).alerts)

    def restart(self) -> None:
        """Forget every shard, as a crashed worker would; state comes back from the
        changelog at the next envelope."""
        for partition in list(self.accounts.shards):
            self.accounts.drop(partition)
        for partition in list(self.sources.shards):
            self.sources.drop(partition)
