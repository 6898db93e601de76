"""What the floor's stages send for a message of n rows, at B1's rates and sizes
(``bench.floor_traffic.Traffic``), as pre-built bytes: no encoding, no policy."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from aiokafka.partitioner import DefaultPartitioner

from bench.floor_traffic import Traffic
from pipeline.stream.partitioning import tenant_partition

PARTITIONS = 8
TENANTS = ("default", "acme", "globex")  # B1's, by share of events: 70, 20, 10 %
KEYS = 64  # distinct decision and notice keys, so keyed sends spread over the partitions
ROWS = struct.Struct(">I")
MARK = -1  # a mark row among the row counts a Batcher gathers

Record = tuple[bytes, bytes | None]
Message = tuple[str, bytes | None, bytes | None, int]
"""(topic role, key, value, partition): the partition is the one the worker's send gets,
from Kafka's partitioner for a keyed message (computed once here, per key)."""


class Blobs:
    """Pre-built bytes of each size (made once), with a row count in front."""

    def __init__(self) -> None:
        self.made: dict[int, bytes] = {}

    def __call__(self, rows: int, size: int) -> bytes:
        size = max(size, ROWS.size)
        body = self.made.get(size)
        if body is None:
            body = self.made[size] = b"x" * size
        return ROWS.pack(rows) + body[ROWS.size :]


class Owed:
    """Whole messages owed at a fractional rate: the totals come out exact."""

    def __init__(self) -> None:
        self.left = 0.0

    def take(self, amount: float) -> int:
        self.left += amount
        whole = int(self.left)
        self.left -= whole
        return whole


@dataclass
class Out:
    """What one stage message makes the stage send."""

    now: list[Message] = field(default_factory=list)
    forwards: dict[int, int] = field(default_factory=dict)
    shares: dict[int, int] = field(default_factory=dict)
    changelog: list[Record] = field(default_factory=list)


class Model:
    """What each stage sends for a message of n rows, at B1's rates and sizes."""

    def __init__(self, traffic: Traffic, partitions: int = PARTITIONS) -> None:
        self.rates, self.sizes = traffic.rates, traffic.sizes
        self.partitions = partitions
        self.blob = Blobs()
        self.owed: dict[str, Owed] = {}
        self.turn = 0
        self.tenants = [tenant_partition(t, partitions) for t in TENANTS]
        size = self.sizes
        self.records = {
            stage: (
                self.blob(0, size[f"{stage}_changelog_key"]),
                self.blob(0, size[f"{stage}_changelog_value"]),
            )
            for stage in ("account", "source", "rollup")
        }
        self.keys = {role: self._keys(size[f"{role}_key"]) for role in ("decision", "notice")}
        self.values = {
            "decision": self.blob(0, size["decision_value"]),
            "notice": self.blob(0, size["notice_value"]),
            "alert": self.blob(0, size["alert"]),
        }
        self.sent = 0

    def _keys(self, size: int) -> list[tuple[bytes, int]]:
        """``KEYS`` distinct keys of ``size`` bytes and the partition Kafka's default
        partitioner (murmur2) gives each."""
        every = list(range(self.partitions))
        out = []
        for i in range(KEYS):
            key = f"{i:04d}".encode() + b"k" * max(size - 4, 0)
            out.append((key, DefaultPartitioner()(key, every, every)))
        return out

    def _take(self, name: str, rows: int) -> int:
        return self.owed.setdefault(name, Owed()).take(rows * self.rates[name])

    def _spread(self, total: int, targets: list[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for i in range(total):
            target = targets[(self.turn + i) % len(targets)]
            out[target] = out.get(target, 0) + 1
        self.turn += total
        return out

    def envelopes(self, events: int) -> list[tuple[int, bytes]]:
        """An ingest batch's envelopes: its rows split evenly over the account partitions."""
        base, extra = divmod(events, self.partitions)
        header, row = self.sizes["envelope_header"], self.sizes["envelope_row"]
        out = []
        for partition in range(self.partitions):
            rows = base + (partition < extra)
            out.append((partition, self.blob(rows, header + rows * row)))
        return out

    def _keyed(self, out: Out, role: str, topic: str, count: int) -> None:
        keys, value = self.keys[role], self.values[role]
        tombstones = self.owed.setdefault(f"{role}_tombstones", Owed())
        rate = self.rates["decision_tombstones"] if role == "decision" else 0.0
        for _ in range(count):
            key, partition = keys[self.sent % KEYS]
            self.sent += 1
            out.now.append((topic, key, None if tombstones.take(rate) else value, partition))

    def _changelog(self, out: Out, stage: str, rows: int) -> None:
        key, value = self.records[stage]
        records = 1 + self._take(f"{stage}_changelog", rows)  # the commit record first
        tombstones = self.owed.setdefault(f"{stage}_tombstones", Owed())
        rate = self.rates[f"{stage}_changelog_tombstones"]
        out.changelog = [(key, None if tombstones.take(rate) else value) for _ in range(records)]

    def account(self, rows: int, partition: int) -> Out:
        out, size = Out(), self.sizes
        # B1's audit batches: fewer than envelopes (an envelope whose rows are all held
        # has none), of B1's mean size, to the stage's partition
        audit = size["audit_rows"]
        for _ in range(self._take("audit_messages", rows)):
            blob = self.blob(audit, size["audit_header"] + audit * size["audit_row"])
            out.now.append(("audit", str(partition).encode(), blob, partition))
        self._keyed(out, "decision", "decisions", self._take("account_decisions", rows))
        for _ in range(self._take("alerts", rows)):  # unkeyed: any partition
            self.sent += 1
            out.now.append(("alerts", None, self.values["alert"], self.sent % self.partitions))
        self._keyed(out, "notice", "notices", self._take("notices", rows))
        out.forwards = self._spread(self._take("forwards", rows), list(range(self.partitions)))
        out.shares = self._spread(self._take("account_shares", rows), self.tenants)
        self._changelog(out, "account", rows)
        return out

    def source(self, rows: int) -> Out:
        out = Out()
        self._keyed(out, "decision", "decisions", self._take("source_decisions", rows))
        out.shares = self._spread(self._take("source_shares", rows), self.tenants)
        self._changelog(out, "source", rows)
        return out

    def rollup(self, entries: int) -> Out:
        out = Out()
        self._changelog(out, "rollup", entries)
        return out

    def gathered(self, kind: str, items: list[int]) -> tuple[int, bytes]:
        """A gathered forward or shares message: its data rows, and its bytes."""
        rows = sum(n for n in items if n != MARK)
        marks = len(items) - sum(1 for n in items if n != MARK)
        size = self.sizes
        if kind == "forward":
            bytes_ = size["forward_header"] + rows * size["forward_row"] + marks * size["mark_row"]
        else:
            # the shares' merge keeps each upstream's latest mark only (``latest_shares``)
            marks = min(marks, 2 * self.partitions)
            bytes_ = size["shares_header"] + rows * size["share_entry"] + marks * size["share_mark"]
        return rows, self.blob(rows, bytes_)
