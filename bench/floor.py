"""The shell's floor (issue 28): B1's messages through the worker's shell, no stage work.

Parts ``floor_faust``, ``floor_aiokafka`` and their ``_batched`` forms of ``bench.run``
(``bench.floor_run``); each shell runs as its own process (``bench.floor_faust``, on the
worker's faust app and agents; ``bench.floor_aiokafka``, on plain aiokafka clients). Both
read the pre-loaded B1 topic as the worker's ingest does (an aiokafka ``getmany`` loop:
batches of up to ``worker.batch_max_events``, lingering ``worker.batch_max_wait_ms``,
backpressure at ``worker.ingest_ahead_max_envelopes``, input offsets committed once the
batch's envelopes are acknowledged) and hand each batch's values on as an engine would
take them. Then, where the worker validates, normalises, counts and encodes, the floor
only sends pre-built bytes of B1's sizes, as many as B1 sent (``bench.floor_model`` over
``bench.floor_traffic``):

* per batch, one envelope per account partition (the rows split evenly);
* per account envelope of n rows: audit batches, decisions, alerts and notices at once;
  forwarded rows and tenant shares gathered per target partition for
  ``worker.forward_linger_ms`` (``pipeline.stream.batching.Batcher``) with a mark row to
  every target; its changelog records (a commit record and the state records B1 wrote
  per row) once all that is acknowledged (``pipeline.stream.chains``);
* per forward message and shares message, the source stage's and the rollup's the same.

A floor message carries its row count in its first four bytes, so each stage sends what
B1's stage sent for as many rows. The clock and the process CPU run from the first input
batch until every message is applied and every changelog written; the last line a shell
prints is JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.floor_model import MARK, ROWS, Message, Model, Record
from bench.floor_traffic import Traffic
from pipeline.settings import WorkerSettings
from pipeline.stream.batching import Batcher
from pipeline.stream.chains import ChangelogChains
from pipeline.stream.envelopes import MAX_ROWS_PER_MESSAGE
from pipeline.stream.ingest_loop import HOLD_MAX_MS, gather_batch

Send = Callable[[str, bytes | None, bytes | None, int | None], Awaitable[Awaitable[Any]]]
SendRecords = Callable[[str, int, list[Record]], Awaitable[list[Awaitable[Any]]]]
EXPLICIT = frozenset({"by_account", "by_source", "shares", "audit"})
"""The roles the worker sends to a partition it names; the others (decisions, alerts,
notices) go where the producer's partitioner puts them (murmur2 of the key)."""


class Shell:
    """The worker's send path (``pipeline.stream.emit.Emitter``) over a ``Model``.

    ``batched`` False sends decisions, alerts, notices and audit batches one message
    each, as the worker does (a keyed one partitioned by the producer: murmur2 in
    Python); True sends them as record batches per partition, as the changelog is sent,
    with the partition the model computed once per key (an engine would compute it)."""

    def __init__(
        self,
        model: Model,
        send: Send,
        send_records: SendRecords,
        linger_ms: int,
        batched: bool = False,
    ) -> None:
        self.model = model
        self.send = send
        self.send_records = send_records
        self.batched = batched
        self.chains = ChangelogChains()
        rows = MAX_ROWS_PER_MESSAGE
        self.forwarder = Batcher(self._forward, linger_ms=linger_ms, max_rows=rows)
        self.sharer = Batcher(self._share, linger_ms=linger_ms, max_rows=rows)
        self.sent: Counter[str] = Counter()  # messages per topic role
        self.rows: Counter[str] = Counter()  # rows sent (role) and applied (role + "_applied")
        self.progressed = asyncio.Event()  # the account stage applied an envelope

    def ahead(self) -> int:
        """Envelopes ingest sent that the account stage has not applied yet."""
        return self.sent["by_account"] - self.rows["by_account_messages_applied"]

    async def _out(
        self, role: str, key: bytes | None, value: bytes | None, p: int | None
    ) -> Awaitable[Any]:
        self.sent[role] += 1
        return await self.send(role, key, value, p if role in EXPLICIT else None)

    async def _outputs(self, messages: list[Message]) -> list[Awaitable[Any]]:
        if not self.batched:
            return [await self._out(*message) for message in messages]
        grouped: dict[tuple[str, int], list[Record]] = {}
        for role, key, value, partition in messages:
            grouped.setdefault((role, partition), []).append((key, value))  # type: ignore[arg-type]
        pending = []
        for (role, partition), records in grouped.items():
            self.sent[role] += len(records)
            pending += await self.send_records(role, partition, records)
        return pending

    async def ingest(self, values: list[bytes]) -> list[Awaitable[Any]]:
        """One input batch's envelopes, sent; their acknowledgements."""
        self.rows["by_account"] += len(values)
        return [
            await self._out("by_account", str(p).encode(), envelope, p)
            for p, envelope in self.model.envelopes(len(values))
        ]

    async def apply(self, role: str, partition: int, value: bytes) -> None:
        """One stage message: its stage's outputs, then (acknowledged) its changelog."""
        (rows,) = ROWS.unpack_from(value)
        self.rows[f"{role}_applied"] += rows
        self.rows[f"{role}_messages_applied"] += 1
        if role == "by_account":
            self.progressed.set()
        model = self.model
        stage, out = (
            ("account", model.account(rows, partition))
            if role == "by_account"
            else ("source", model.source(rows))
            if role == "by_source"
            else ("rollup", model.rollup(rows))
        )
        pending = await self._outputs(out.now)
        gathering = {self.forwarder.add(t, [n]) for t, n in out.forwards.items()}
        gathering |= {self.sharer.add(t, [n]) for t, n in out.shares.items()}
        if stage != "rollup":  # a new mark to every downstream partition (Emitter.emit)
            for target in range(model.partitions):
                if stage == "account":
                    self.forwarder.add(target, [MARK])
                self.sharer.add(target, [MARK])
        pending.extend(gathering)
        records = out.changelog
        await self.chains.add(
            (stage, partition),
            pending,
            lambda: self._changelog(stage, partition, records),
        )

    async def _changelog(self, stage: str, partition: int, records: list[Record]) -> None:
        """The changelog after the outputs, not waited for (faust flushes its producer
        before it commits, the plain shell's producer flushes at the end)."""
        self.sent[f"{stage}_changelog"] += len(records)
        await self.send_records(f"{stage}_changelog", partition, records)

    async def _forward(self, target: int, items: list[int]) -> Awaitable[Any]:
        rows, value = self.model.gathered("forward", items)
        self.rows["by_source"] += rows
        self.rows["by_source_messages"] += 1
        return await self._out("by_source", str(target).encode(), value, target)

    async def _share(self, target: int, items: list[int]) -> Awaitable[Any]:
        rows, value = self.model.gathered("shares", items)
        self.rows["shares"] += rows
        self.rows["shares_messages"] += 1
        return await self._out("shares", str(target).encode(), value, target)

    def done(self, events: int) -> bool:
        """Every event applied, every gathered message sent and applied, every changelog
        written."""
        r = self.rows
        return (
            r["by_account_applied"] >= events
            and not self.forwarder.waiting()
            and not self.forwarder.flushes
            and not self.sharer.waiting()
            and not self.sharer.flushes
            and r["by_source_messages_applied"] == r["by_source_messages"]
            and r["shares_messages_applied"] == r["shares_messages"]
            and all(task.done() for tail in self.chains.tails.values() for task in tail)
        )


async def run_ingest(
    consumer: Any, shell: Shell, clock: Clock, worker: WorkerSettings, events: int
) -> None:
    """Ingest's loop (``IngestLoop.run``) without ingest's work: hold while the account
    stage is more than ``ingest_ahead_max_envelopes`` behind, gather a batch, hand its
    values on, send its envelopes, commit once they are acknowledged."""
    limit = worker.ingest_ahead_max_envelopes
    while shell.rows["by_account"] < events:
        deadline = time.monotonic() + HOLD_MAX_MS / 1000
        while limit and shell.ahead() > limit and time.monotonic() < deadline:
            shell.progressed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shell.progressed.wait(), deadline - time.monotonic())
        batch = await gather_batch(
            lambda t, m: consumer.getmany(timeout_ms=t, max_records=m), worker
        )
        if not batch:
            continue
        clock.start()
        values = [m.value for messages in batch.values() for m in messages]  # the hand-off
        await asyncio.gather(*await shell.ingest(values))
        await consumer.commit({tp: ms[-1].offset + 1 for tp, ms in batch.items() if ms})


@dataclass
class Clock:
    """Wall and process CPU from the first input batch to the end."""

    first_s: float = 0.0
    cpu_first_s: float = 0.0

    def start(self) -> None:
        if not self.first_s:
            self.first_s, self.cpu_first_s = time.perf_counter(), time.process_time()

    def result(self, name: str, events: int, shell: Shell) -> dict[str, Any]:
        seconds = time.perf_counter() - self.first_s
        cpu_s = time.process_time() - self.cpu_first_s
        return {
            "peer": name,
            "events": events,
            "seconds": round(seconds, 3),
            "events_per_s": round(events / seconds),
            "cpu_s": round(cpu_s, 2),
            "events_per_cpu_s": round(events / max(cpu_s, 1e-9)),
            "cpu_us_per_event": round(cpu_s / events * 1e6, 2),
            "sent_per_event": {
                role: round(n / events, 4) for role, n in sorted(shell.sent.items())
            },
        }


async def wait_done(shell: Shell, events: int, poll_s: float = 0.005) -> None:
    while not shell.done(events):
        await asyncio.sleep(poll_s)


def load_traffic(path: str) -> Traffic:
    data = orjson.loads(Path(path).read_bytes())
    return Traffic(data["rates"], data["sizes"])
