"""B8, "ten million" (issue 45), its first part: one edge's familiar records in memory.

A tenant of 10M accounts with three places or clients each in 30 days is 30M familiar
exempts, and every edge holds every one. This measures, each in a fresh process (so the
resident growth and the peak are its own):

* ``rust``: the compiled engine's ``authpipe_engine.FamiliarStore`` reserved for N records
  (an edge can reserve from the topic's end offsets), loaded with N synthetic records
  generated in bulk (random 16-byte digests, as BLAKE2b's are; issued over the last 30
  days) through ``put_many`` in packed chunks: resident bytes per record, load seconds,
  the peak, a full ``prune`` and a bounded ``prune_step``, and the latency of one lookup
  from Python, hits and misses, by digest (``contains_at``) and by key (``familiar_at``,
  the digest computed in the engine);
* ``rust_grown``: the same without the reservation (the table grows by half each time);
* ``python``: today's edge, ``DecisionView.apply`` of encoded exempts (decode and the
  core's ``DecisionIndex`` on its dict, ``AUTHPIPE_ENGINE=python``) for a smaller N,
  extrapolated to the Rust side's N, with the latency of ``DecisionIndex.unfamiliar`` for
  hits and misses, and the decode alone per record (what a cold load from the topic pays
  per record before the store);
* ``edge_with_store``: the same edge with its familiar exempts in the store
  (``AUTHPIPE_ENGINE=rust``): what the view costs per record once they leave the dict;
* ``coldload``: the cold load through the engine's decoder (``DecisionView.apply_encoded``,
  ``FamiliarStore.put_encoded``), in process: N exempts encoded exactly as the worker
  encodes them (checked against ``dumps(decision_value(...))``), generated in chunks and
  applied in the feed's ``LOAD_CHUNK`` slices to a view reserved for N;
* ``coldload_kafka``: the same records (``--kafka-records``) produced once to a topic of a
  local broker started for the run, then read by ``DecisionFeed`` from start to ready;
  aiokafka's own read of the topic (no apply) and confluent-kafka's (bare, and with
  ``apply_encoded``) beside it, so the shell's per-record cost is measured apart;
* ``check``: the check on an edge's view holding N familiar exempts (``apply_encoded`` to
  a store reserved for N): ``known_records`` gives bench_edge's users 0 to ``--known``
  records from their own names (8 in 10 familiar at their own address, 1 a new place, 1
  no record: ``KINDS``), generated ones fill the rest; the answers asserted; then
  ``DecisionView.check`` per call (the 20,000 users bench_edge's HTTP client asks for,
  warm, and 100,000 at first sight), bench_edge's ``bench_check`` rates, and
  ``GET /v1/check`` served as ``edge serve`` serves it (``bench_edge.bench_http``, best
  p99 of ``--http-rounds``) at each of ``--rates``; ``check_all`` runs it on the known
  users' records alone and on N, each in its own process.

Run ``python -m bench.b8_familiar [--records 30000000] [--python-records 1000000]
[--kafka-records 3000000] [--variant all|coldload_all|check_all|...] [--known 120000]
[--rates 2000,10000] [--http-rounds 3] [--duration-s 10] [--out bench/results/<file>.json]``;
the last line printed is the JSON result.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench.procfs import status_kb
from pipeline.logs import configure_logging

RECORDS = 30_000_000
KAFKA_RECORDS = 3_000_000
GENERATE_CHUNK = 65_536
PYTHON_RECORDS = 1_000_000
CHUNK = 1_000_000
SAMPLES = 100_000
TENANT = "b8"
DAY_MS = 86_400_000
MONTH_MS = 30 * DAY_MS
NOW_MS = 1_796_601_600_000
"""2026-12-07T00:00Z: a fixed clock, so every run builds the same records."""
TARGETS = {"bytes_per_record": 64, "rss_mb_30m": 2048, "load_s_30m": 60}


def _mem_kb() -> dict[str, int]:
    return status_kb("self", ("VmRSS", "VmHWM"))


def _pcts(ns: list[int], overhead_ns: int) -> dict[str, float]:
    """p50, p99, p99.9 and max of one call, in microseconds, less the timer's own median."""
    ns = sorted(max(0, x - overhead_ns) for x in ns)

    def at(q: float) -> float:
        return round(ns[min(len(ns) - 1, int(q * len(ns)))] / 1000, 3)

    return {"p50_us": at(0.50), "p99_us": at(0.99), "p999_us": at(0.999), "max_us": at(1.0)}


def _timer_overhead_ns() -> int:
    clock = time.perf_counter_ns
    laps = []
    for _ in range(SAMPLES):
        t0 = clock()
        laps.append(clock() - t0)
    laps.sort()
    return laps[len(laps) // 2]


def _laps(call: Any, args: list[tuple[Any, ...]]) -> tuple[list[int], list[Any]]:
    """Nanoseconds of each ``call(*a)`` and what each returned."""
    clock = time.perf_counter_ns
    laps = []
    answers = []
    for a in args:
        t0 = clock()
        answer = call(*a)
        laps.append(clock() - t0)
        answers.append(answer)
    return laps, answers


def _latency(call: Any, args: list[tuple[Any, ...]], overhead_ns: int) -> dict[str, float]:
    return _pcts(_laps(call, args)[0], overhead_ns)


def _sample_keys(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """(account digest, source) of ``count`` users: 32 hex characters and an IPv4 address."""
    return [
        (f"{rng.getrandbits(128):032x}", f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
        for i in range(count)
    ]


# -- the compiled store ------------------------------------------------------------------


def bench_rust(records: int, reserve: bool) -> dict[str, Any]:
    import authpipe_engine as engine
    import numpy as np

    dtype = np.dtype([("key", "V16"), ("expires", "<i8"), ("since", "<i8"), ("fp", "<u8")])
    assert dtype.itemsize == engine.RECORD_BYTES
    gen = np.random.default_rng(8)
    rng = random.Random(8)
    hits = _sample_keys(rng, min(SAMPLES, records))
    misses = _sample_keys(rng, SAMPLES)
    hit_digests = [engine.familiar_digest(TENANT, a, s, None) for a, s in hits]
    miss_digests = [os.urandom(16) for _ in range(SAMPLES)]
    overhead_ns = _timer_overhead_ns()
    gc.collect()
    before = _mem_kb()
    started = time.perf_counter()
    store = engine.FamiliarStore(records if reserve else 0)
    generate_s = load_s = 0.0
    for first in range(0, records, CHUNK):
        n = min(CHUNK, records - first)
        t0 = time.perf_counter()
        chunk = np.empty(n, dtype)
        chunk["key"] = np.frombuffer(gen.bytes(16 * n), dtype="V16")
        if first == 0:  # the sampled users' pairs, with the digests a check computes
            chunk["key"][: len(hit_digests)] = np.frombuffer(b"".join(hit_digests), dtype="V16")
        issued = NOW_MS - gen.integers(0, MONTH_MS, n)
        chunk["expires"] = issued + MONTH_MS
        chunk["since"] = issued
        chunk["fp"] = gen.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
        packed = chunk.tobytes()
        del chunk, issued
        t1 = time.perf_counter()
        store.put_many(packed)
        load_s += time.perf_counter() - t1
        generate_s += t1 - t0
        del packed
    total_s = time.perf_counter() - started
    gc.collect()
    after = _mem_kb()
    rss_bytes = (after["VmRSS"] - before["VmRSS"]) * 1024
    result: dict[str, Any] = {
        "records": len(store),
        "reserved": reserve,
        "slots": store.slot_count(),
        "store_bytes": store.approx_bytes(),
        "store_bytes_per_record": round(store.approx_bytes() / len(store), 1),
        "rss_growth_mb": round(rss_bytes / 2**20, 1),
        "rss_bytes_per_record": round(rss_bytes / len(store), 1),
        "peak_rss_mb": round(after["VmHWM"] / 1024, 1),
        "rss_before_mb": round(before["VmRSS"] / 1024, 1),
        "load_s": round(load_s, 2),
        "load_ns_per_record": round(load_s / records * 1e9, 1),
        "generate_s": round(generate_s, 2),
        "build_s": round(total_s, 2),
    }
    if not reserve:
        return result
    result["timer_overhead_ns"] = overhead_ns
    result["contains_at_hit"] = _latency(
        store.contains_at, [(d, NOW_MS) for d in hit_digests], overhead_ns
    )
    result["contains_at_miss"] = _latency(
        store.contains_at, [(d, NOW_MS) for d in miss_digests], overhead_ns
    )
    result["familiar_at_hit"] = _latency(
        store.familiar_at, [(TENANT, a, s, None, NOW_MS) for a, s in hits], overhead_ns
    )
    result["familiar_at_miss"] = _latency(
        store.familiar_at, [(TENANT, a, s, None, NOW_MS) for a, s in misses], overhead_ns
    )
    assert all(store.familiar_at(TENANT, a, s, None, NOW_MS) for a, s in hits[:1000])
    assert not any(store.familiar_at(TENANT, a, s, None, NOW_MS) for a, s in misses[:1000])
    t0 = time.perf_counter()
    step = store.prune_step(NOW_MS + DAY_MS, 65_536)
    result["prune_step_65536_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    t0 = time.perf_counter()
    pruned = store.prune(NOW_MS + DAY_MS)
    result["prune_full_s"] = round(time.perf_counter() - t0, 2)
    result["pruned_one_day"] = pruned + step
    return result


# -- today's Python index ----------------------------------------------------------------


def bench_python(records: int) -> dict[str, Any]:
    from bench.edge_familiar import messages
    from pipeline.core.keys import parse_key
    from pipeline.core.policy import Policy
    from pipeline.edge.decode import decode_decision, decode_key
    from pipeline.edge.feed import settle_heap
    from pipeline.edge.view import DecisionView
    from pipeline.settings import Settings
    from pipeline.wiring import build_normaliser

    t0 = time.perf_counter()
    batch = messages(records, NOW_MS)
    generate_s = time.perf_counter() - t0
    norm = build_normaliser(Settings())
    overhead_ns = _timer_overhead_ns()
    gc.collect()
    before = _mem_kb()
    # [verify] enforce (the default): unfamiliar looks the pair up, as the edge's check does.
    view = DecisionView(norm, now_ms=lambda: NOW_MS, policy=Policy())
    t0 = time.perf_counter()
    for key, value in batch:
        view.apply(key, value)
    load_s = time.perf_counter() - t0
    settle_heap()
    gc.collect()
    after = _mem_kb()
    rss_bytes = (after["VmRSS"] - before["VmRSS"]) * 1024
    keys = (parse_key(k.decode()) for k, _ in batch)
    pairs = [k for k in keys if k[3] is not None][:SAMPLES]  # (account, place) pairs
    rng = random.Random(8)
    index = view.index
    hits = [(k[1], k[2] or "", k[3] or "", None, NOW_MS) for k in pairs]
    misses = [(t, f"{rng.getrandbits(128):032x}", s, None, n) for t, _, s, _, n in hits]
    assert all(not index.unfamiliar(*h).step_up for h in hits[:1000])
    assert all(index.unfamiliar(*m).step_up for m in misses[:1000])
    sample = batch[:SAMPLES]
    t0 = time.perf_counter()
    for key, value in sample:
        _, wire = decode_key(key)
        # The value's source is the key's own, which the view never checks twice.
        decode_decision(wire, value, lambda source: True)
    decode_s = time.perf_counter() - t0
    n = len(view)
    per_record = rss_bytes / n
    return {
        "records": n,
        "rss_growth_mb": round(rss_bytes / 2**20, 1),
        "rss_bytes_per_record": round(per_record, 1),
        "peak_rss_mb": round(after["VmHWM"] / 1024, 1),
        "load_s": round(load_s, 2),
        "apply_us_per_record": round(load_s / records * 1e6, 2),
        "decode_us_per_record": round(decode_s / len(sample) * 1e6, 2),
        "generate_s": round(generate_s, 2),
        "timer_overhead_ns": overhead_ns,
        "unfamiliar_hit": _latency(index.unfamiliar, hits, overhead_ns),
        "unfamiliar_miss": _latency(index.unfamiliar, misses, overhead_ns),
    }


# -- the cold load through the engine's decoder -------------------------------------------


class WorkerExempts:
    """Familiar exempts as the worker encodes them (``dumps(decision_value(...))`` with the
    default policy's familiar numbers: threshold 3, window 30 days, version ``default-1``),
    generated fast: the encoding with sentinels becomes a %-template, times come from
    per-day prefixes. Three of five are (account, place) pairs, two (account, client)."""

    VERSION = "default-1"

    def __init__(self, seed: int = 8, tenant: str = TENANT) -> None:
        self.rng = random.Random(seed)
        self.tenant = tenant
        first_day = (NOW_MS - MONTH_MS) // DAY_MS
        self.day_prefix = [
            _format_ms((first_day + d) * DAY_MS)[:11] for d in range(2 * MONTH_MS // DAY_MS + 2)
        ]
        self.first_day = first_day
        self.pair = self._template(("ACCTSENTINEL", "SRCSENTINEL", None))
        self.client = self._template(("ACCTSENTINEL", None, "DEVSENTINEL"))

    def _template(self, parts: tuple[str | None, str | None, str | None]) -> str:
        from pipeline.core.keys import format_key

        account, source, device = parts
        key = format_key(("familiar", self.tenant, account, source, device))
        text = self.encode("DIDSENTINEL", key, parts, 1_000_000_000_000, 1_100_000_000_000)
        text = text.replace("%", "%%").replace(key, "%(key)s").replace("DIDSENTINEL", "%(id)s")
        text = text.replace("ACCTSENTINEL", "%(account)s").replace("SRCSENTINEL", "%(source)s")
        text = text.replace("DEVSENTINEL", "%(device)s")
        text = text.replace(_format_ms(1_000_000_000_000), "%(issued)s")
        return text.replace(_format_ms(1_100_000_000_000), "%(expires)s")

    def encode(
        self,
        decision_id: str,
        key: str,
        parts: tuple[str | None, str | None, str | None],
        issued_ms: int,
        expires_ms: int,
    ) -> str:
        """The worker's own encoding (``pipeline.core.records.decision_value``)."""
        from pipeline.contracts.codec import dumps
        from pipeline.core.records import decision_value

        account, source, device = parts
        d = decision_value(
            decision_id, key, "familiar", "exempt", "familiar", self.tenant, account, source,
            device, 0, 3, MONTH_MS, issued_ms, expires_ms, self.VERSION,
        )  # fmt: skip
        return dumps(d).decode()

    def chunk(self, first: int, count: int) -> tuple[list[bytes | None], list[bytes | None]]:
        """Records ``first`` to ``first + count``: keys and values, issued over the last 30
        days and expiring 30 days later."""
        bits, randint = self.rng.getrandbits, self.rng.randrange
        pair, client, prefix, first_day = self.pair, self.client, self.day_prefix, self.first_day
        tenant = self.tenant
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        for i in range(first, first + count):
            issued = NOW_MS - randint(MONTH_MS)
            day, tod = divmod(issued, DAY_MS)
            seconds, milli = divmod(tod, 1000)
            clock = (
                f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{milli:03d}Z"
            )
            account = f"{bits(128):032x}"
            fields = {"id": f"{bits(128):032x}", "account": account}
            fields["issued"] = prefix[day - first_day] + clock
            fields["expires"] = prefix[day - first_day + 30] + clock
            if i % 5 < 3:
                source = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
                key = f"familiar|{tenant}|{account}|{source}|-"
                fields["source"], fields["key"] = source, key
                values.append((pair % fields).encode())
            else:
                device = f"{bits(128):032x}"
                key = f"familiar|{tenant}|{account}|-|{device}"
                fields["device"], fields["key"] = device, key
                values.append((client % fields).encode())
            keys.append(key.encode())
        return keys, values

    def check(self, keys: list[bytes | None], values: list[bytes | None]) -> None:
        """Each generated value is the worker's encoding of its own fields."""
        from pipeline.contracts.codec import decode_decision

        for key, value in zip(keys, values, strict=True):
            assert key is not None and value is not None
            d = decode_decision(value, source_ok=lambda source: True, key=key.decode())
            parts = (d.account_digest, d.source, d.device_id)
            again = self.encode(d.decision_id, d.key, parts, d.issued_at_ms, d.expires_at_ms)
            assert again.encode() == value, (again, value)


def _format_ms(ms: int) -> str:
    from pipeline.contracts.models import format_utc_ms, ms_to_datetime

    return format_utc_ms(ms_to_datetime(ms))


def _edge_view() -> Any:
    """An edge's view at the fixed clock, [verify] enforced, its exempts in the store."""
    from pipeline.core.policy import Policy
    from pipeline.edge.view import DecisionView
    from pipeline.settings import Settings
    from pipeline.wiring import build_normaliser

    return DecisionView(build_normaliser(Settings()), now_ms=lambda: NOW_MS, policy=Policy())


def _apply_chunks(view: Any, keys: list[bytes | None], values: list[bytes | None]) -> None:
    """``view.apply_encoded`` of the messages in the feed's ``LOAD_CHUNK`` slices."""
    from pipeline.edge.feed import LOAD_CHUNK

    apply = view.apply_encoded
    for start in range(0, len(keys), LOAD_CHUNK):
        apply(keys[start : start + LOAD_CHUNK], values[start : start + LOAD_CHUNK])


def bench_coldload(records: int) -> dict[str, Any]:
    """N worker-encoded exempts through ``DecisionView.apply_encoded`` in the feed's
    ``LOAD_CHUNK`` slices, into a view reserved for N (as the feed reserves it)."""
    from pipeline.edge.feed import LOAD_CHUNK

    maker = WorkerExempts()
    maker.check(*maker.chunk(0, 1_000))
    view = _edge_view()
    gc.collect()
    before = _mem_kb()
    cpu0 = time.process_time()
    view.index.reserve_familiar(records)
    generate_s = load_s = 0.0
    for first in range(0, records, GENERATE_CHUNK):
        t0 = time.perf_counter()
        keys, values = maker.chunk(first, min(GENERATE_CHUNK, records - first))
        t1 = time.perf_counter()
        _apply_chunks(view, keys, values)
        load_s += time.perf_counter() - t1
        generate_s += t1 - t0
        del keys, values
    cpu_s = time.process_time() - cpu0
    gc.collect()
    after = _mem_kb()
    outcomes = view.stats.outcomes
    assert (len(view), outcomes["put"], outcomes["bad"]) == (records, records, 0), outcomes
    rss = (after["VmRSS"] - before["VmRSS"]) * 1024
    return {
        "records": records,
        "load_s": round(load_s, 2),
        "load_ns_per_record": round(load_s / records * 1e9, 1),
        "records_per_s": round(records / load_s),
        "generate_s": round(generate_s, 2),
        "process_cpu_s_with_generation": round(cpu_s, 2),
        "rss_growth_mb": round(rss / 2**20, 1),
        "rss_bytes_per_record": round(rss / records, 1),
        "peak_rss_mb": round(after["VmHWM"] / 1024, 1),
        "chunk": LOAD_CHUNK,
    }


async def _fill(bootstrap: str, topic: str, records: int) -> float:
    """Produce the records once (confluent-kafka's producer: the fixture, not measured)."""
    from confluent_kafka import Producer

    from bench.bench_edge import PARTITIONS
    from pipeline.kafka_admin import TopicSpec, ensure_topics
    from pipeline.topics import DECISIONS_CONFIG

    await ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS, DECISIONS_CONFIG)])
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20, "acks": "all"}
    )
    maker = WorkerExempts()
    started = time.perf_counter()
    for first in range(0, records, GENERATE_CHUNK):
        keys, values = maker.chunk(first, min(GENERATE_CHUNK, records - first))
        for key, value in zip(keys, values, strict=True):
            while True:
                try:
                    producer.produce(topic, value=value, key=key)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(120)
    assert left == 0, f"{left} records not delivered"
    return time.perf_counter() - started


async def _aiokafka_read(bootstrap: str, topic: str) -> dict[str, Any]:
    """aiokafka's own cost: the feed's consumer settings, every record fetched, none
    applied."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    from bench.bench_edge import PARTITIONS
    from pipeline.edge.feed import FeedConfig

    cfg = FeedConfig(bootstrap, topic)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
        fetch_max_wait_ms=cfg.fetch_max_wait_ms, fetch_max_bytes=cfg.fetch_max_bytes,
        max_partition_fetch_bytes=cfg.max_partition_fetch_bytes,
    )  # fmt: skip
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        total = sum(ends.values())
        started, cpu0 = time.perf_counter(), time.process_time()
        seen = 0
        while seen < total:
            batches = await consumer.getmany(timeout_ms=200, max_records=cfg.max_records_per_poll)
            seen += sum(len(records) for records in batches.values())
        wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu0
    finally:
        await consumer.stop()
    return {
        "records": seen,
        "wall_s": round(wall_s, 2),
        "cpu_s": round(cpu_s, 2),
        "records_per_s": round(seen / wall_s),
        "cpu_us_per_record": round(cpu_s / seen * 1e6, 2),
    }


def _confluent_read(bootstrap: str, topic: str, total: int, apply: bool) -> dict[str, Any]:
    """confluent-kafka's consume in batches of 10,000 (the next lever), bare or with each
    batch given to ``DecisionView.apply_encoded``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from bench.bench_edge import PARTITIONS

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"b8-coldload-{os.getpid()}-{apply}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 8 << 20,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    view = _edge_view() if apply else None
    if view is not None:
        view.index.reserve_familiar(total)
    started, cpu0 = time.perf_counter(), time.process_time()
    seen = 0
    try:
        while seen < total:
            messages = consumer.consume(10_000, 1.0)
            if view is not None and messages:
                view.apply_encoded([m.key() for m in messages], [m.value() for m in messages])
            seen += len(messages)
        wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu0
    finally:
        consumer.close()
    out: dict[str, Any] = {
        "records": seen,
        "wall_s": round(wall_s, 2),
        "cpu_s": round(cpu_s, 2),
        "records_per_s": round(seen / wall_s),
        "cpu_us_per_record": round(cpu_s / seen * 1e6, 2),
    }
    if view is not None:
        out["held"] = len(view)
    return out


async def _feed_load(bootstrap: str, topic: str, total: int, bulk: bool = True) -> dict[str, Any]:
    """``DecisionFeed`` from start to ready, as the edge runs it: the cold load read as
    record batches by the engine (``bulk``, the default) or every record by the
    consumer."""
    from pipeline.edge.feed import DecisionFeed, FeedConfig

    view = _edge_view()
    feed = DecisionFeed(view, FeedConfig(bootstrap, topic, bulk_load=bulk))
    gc.collect()
    before = _mem_kb()
    started, cpu0 = time.perf_counter(), time.process_time()
    await feed.start()
    try:
        await feed.wait_ready(900)
        wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu0
    finally:
        await feed.stop()
    after = _mem_kb()
    outcomes = view.stats.outcomes
    assert (len(view), outcomes["bad"]) == (total, 0), (len(view), outcomes)
    return {
        "records": len(view),
        "wall_s": round(wall_s, 2),
        "cpu_s": round(cpu_s, 2),
        "records_per_s": round(total / wall_s),
        "cpu_us_per_record": round(cpu_s / total * 1e6, 2),
        "rss_growth_mb": round((after["VmRSS"] - before["VmRSS"]) / 1024, 1),
        "load_ms_reported": feed.load_ms,
        "bulk": None if feed.bulk is None else {
            "records": feed.bulk.records, "fetches": feed.bulk.fetches, "left": feed.bulk.left
        },
    }  # fmt: skip


def bench_coldload_kafka(records: int, feed_only: bool = False) -> dict[str, Any]:
    """The records produced once to a local broker's topic, then read four ways (the feed
    alone with ``feed_only``: run it with ``AUTHPIPE_ENGINE=python`` for today's decoder)."""
    import asyncio

    from bench.stream import broker

    topic = "b8-familiar"
    out: dict[str, Any] = {"records": records}
    with broker(None) as bootstrap:
        out["produce_s"] = round(asyncio.run(_fill(bootstrap, topic, records)), 2)
        if feed_only:
            out["engine"] = os.environ.get("AUTHPIPE_ENGINE", "auto")
            for round_ in (1, 2):
                for name, bulk in (("feed_start_to_ready", True), ("feed_consumer_only", False)):
                    run = asyncio.run(_feed_load(bootstrap, topic, records, bulk))
                    out[f"{name}_{round_}"] = run
            return out
        out["aiokafka_read_only"] = asyncio.run(_aiokafka_read(bootstrap, topic))
        out["feed_start_to_ready"] = asyncio.run(_feed_load(bootstrap, topic, records))
        out["feed_consumer_only"] = asyncio.run(_feed_load(bootstrap, topic, records, False))
        out["confluent_read_only"] = _confluent_read(bootstrap, topic, records, apply=False)
        out["confluent_with_apply_encoded"] = _confluent_read(bootstrap, topic, records, apply=True)
    scale = RECORDS / records
    out["extrapolated_30m_s"] = {
        name: round(out[name]["wall_s"] * scale, 1)
        for name in (
            "aiokafka_read_only",
            "feed_start_to_ready",
            "feed_consumer_only",
            "confluent_read_only",
            "confluent_with_apply_encoded",
        )
    }
    return out


def _one_then_other(
    part: str, one: tuple[str, Callable[[], Any]], other: tuple[str, Callable[[], Any]]
) -> dict[str, Any]:
    """``part``'s result: ``one``'s run, then ``other``'s, with the load average around
    them."""
    load_before = os.getloadavg()
    started = datetime.now(UTC)
    first = one[1]()
    load_mid = os.getloadavg()
    second = other[1]()
    return {
        "part": part,
        "started_at": started.isoformat(timespec="seconds"),
        "load_before": [round(x, 2) for x in load_before],
        "load_between": [round(x, 2) for x in load_mid],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "nproc": os.cpu_count(),
        one[0]: first,
        other[0]: second,
    }


def bench_coldload_all(args: argparse.Namespace) -> dict[str, Any]:
    """Both cold loads, each in its own process, with the load average around them."""
    out = _one_then_other(
        "b8_coldload",
        ("coldload", lambda: _child("coldload", args)),
        ("coldload_kafka", lambda: _child("coldload_kafka", args)),
    )
    out["target_load_s_30m"] = TARGETS["load_s_30m"]
    inproc = out["coldload"]
    if "error" not in inproc:
        out["met_in_process"] = inproc["load_s"] * RECORDS / inproc["records"] <= 60
    return out


# -- the check at N records, in process and over HTTP ------------------------------------

CHECK_TENANT = "default"
"""The tenant of a check that names none: bench_edge's HTTP client names none."""
KNOWN = 120_000
"""Users ``bench_edge.Workload.user(i)``, i < KNOWN, given records from their own names:
the first ``POOL`` (20,000) are those bench_edge's HTTP client asks for (and the warm
in-process set), the rest are checked once each in process (first sight)."""
KINDS = ("familiar",) * 8 + ("new_place", "unknown")
"""User i's standing, ``KINDS[i % 10]``: familiar at their own address; an account
familiar at another place only (a new place); an account without any record."""
HTTP_RATES = (2_000, 10_000)
HTTP_ROUNDS = 3
HTTP_DURATION_S = 10.0
WARM_PASSES = 5
B4_HTTP_2000 = {"p50_ms": 0.875, "p99_ms": 1.635, "target_p99_ms": 5.0}
"""B4 at 2,000 requests/s (results/2026-11-30.json, 100,000 decisions, quiet machine)."""


def known_records(
    view: Any, maker: WorkerExempts, known: int
) -> tuple[list[bytes | None], list[bytes | None]]:
    """The records of users 0 to ``known`` by ``KINDS``, encoded as the worker encodes
    them (``maker.encode``), their digests and sources as the view computes a check's."""
    from bench.bench_edge import Workload
    from pipeline.core.keys import format_key

    norm = view.normaliser
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    for i in range(known):
        kind = KINDS[i % 10]
        if kind == "unknown":
            continue
        account, address, _ = Workload.user(i)
        if kind == "new_place":
            address = f"192.168.{i >> 8 & 255}.{i & 255}"
        digest = norm.account_digest(CHECK_TENANT, account)
        source = norm.sources.source_of(address, ())
        key = format_key(("familiar", CHECK_TENANT, digest, source, None))
        issued = NOW_MS - DAY_MS * (1 + i % 28)
        value = maker.encode(f"{i:032x}", key, (digest, source, None), issued, issued + MONTH_MS)
        keys.append(key.encode())
        values.append(value.encode())
    return keys, values


def _answer(verdict: Any) -> str:
    """``familiar`` (allowed, nothing to ask) or ``step_up``; anything else is a bug here."""
    if verdict.allowed and verdict.challenge is None and not verdict.step_up:
        return "familiar"
    assert verdict.allowed and verdict.challenge == "step_up", verdict
    return "step_up"


def _by_kind(
    users: range, laps: list[int], answers: list[Any], passes: int, overhead_ns: int
) -> dict[str, Any]:
    """Latency per user kind, each kind's answers asserted (familiar: allowed, nothing to
    ask; the others: step_up)."""
    out: dict[str, Any] = {"calls": len(laps), "all": _pcts(laps, overhead_ns)}
    kinds = [KINDS[i % 10] for i in users] * passes
    for kind in dict.fromkeys(KINDS):
        mine = [n for n, k in enumerate(kinds) if k == kind]
        want = "familiar" if kind == "familiar" else "step_up"
        assert all(_answer(answers[n]) == want for n in mine), kind
        out[kind] = _pcts([laps[n] for n in mine], overhead_ns) | {"calls": len(mine)}
    return out


def _http_answers(view: Any, users: list[int]) -> dict[str, str]:
    """The body the edge's fast path writes for ``GET /v1/check`` of each user (the
    function ``EdgeSite`` answers with), by kind; asserts familiar users get the plain
    allowed body and the others a step-up."""
    from bench.bench_edge import Workload
    from pipeline.edge.handlers import ALLOWED_BODY, EDGE_KEY, create_app
    from pipeline.edge.health import AlwaysReady

    edge = create_app(view, AlwaysReady())[EDGE_KEY]
    out = {}
    for i in users:
        account, address, _ = Workload.user(i)
        body = edge.quick_check({"account": account, "ip": address}, None)
        assert body is not None
        kind = KINDS[i % 10]
        if kind == "familiar":
            assert body == ALLOWED_BODY, body
        else:
            assert orjson.loads(body)["challenge"] == "step_up", body
        out[kind] = body.decode()
    return out


async def _http(
    view: Any, rates: tuple[int, ...], rounds: int, duration_s: float, users: int
) -> Any:
    """Each request asks for a different one of the ``users`` known users, each round
    its own draw (first sight for the edge's caches, as a gateway of millions sees)."""
    from bench.bench_edge import bench_http

    out: dict[str, Any] = {}
    for rate in rates:
        runs = [
            await bench_http(view, rate, duration_s, users=users, seed=round_)
            for round_ in range(rounds)
        ]
        best = min(runs, key=lambda r: r["http_p99_ms"])  # as bench_edge: best of the rounds
        best["http_rounds_p99_ms"] = [r["http_p99_ms"] for r in runs]
        best["http_rounds_p50_ms"] = [r["http_p50_ms"] for r in runs]
        best["http_rounds_achieved_rps"] = [r["http_achieved_rps"] for r in runs]
        out[str(rate)] = best
    return out


def bench_check(
    records: int,
    known: int = KNOWN,
    rates: tuple[int, ...] = HTTP_RATES,
    rounds: int = HTTP_ROUNDS,
    duration_s: float = HTTP_DURATION_S,
    calls: int = 300_000,
) -> dict[str, Any]:
    """An edge's view holding ``records`` familiar exempts (the known users' and
    generated ones), applied with ``apply_encoded`` to a store reserved first: the check's
    latency in process (``DecisionView.check``: the warm set, and first sight), bench_edge's
    ``bench_check`` rates, and ``GET /v1/check`` served as ``edge serve`` serves it
    (``bench_edge.bench_http``) at each rate."""
    import asyncio

    from bench.bench_edge import POOL, Workload
    from bench.bench_edge import bench_check as bench_edge_check
    from pipeline.edge.feed import settle_heap
    from pipeline.settings import Settings

    maker = WorkerExempts(tenant=CHECK_TENANT)
    maker.check(*maker.chunk(0, 100))
    view = _edge_view()
    keys, values = known_records(view, maker, known)
    filler = max(0, records - len(keys))
    gc.collect()
    before = _mem_kb()
    started = time.perf_counter()
    view.index.reserve_familiar(len(keys) + filler)
    _apply_chunks(view, keys, values)
    for first in range(known, known + filler, GENERATE_CHUNK):
        _apply_chunks(view, *maker.chunk(first, min(GENERATE_CHUNK, known + filler - first)))
    build_s = time.perf_counter() - started
    held = len(view)
    assert (held, view.stats.outcomes["bad"]) == (len(keys) + filler, 0), view.stats
    del keys, values
    gc.collect()
    loaded = _mem_kb()
    settle_heap()  # as the feed does once it has caught up
    warm = range(min(POOL, known))
    first_sight = range(len(warm), known)
    attempt = [
        (CHECK_TENANT, *Workload.user(i)[:2], (), None, False, "login") for i in range(known)
    ]
    overhead_ns = _timer_overhead_ns()
    # The answers asserted before any timing: every warm user's, by kind (and its caches
    # warmed), and the HTTP fast path's body for one user of each kind.
    _by_kind(warm, [0] * len(warm), [view.check(*attempt[i]) for i in warm], 1, 0)
    bodies = _http_answers(view, [0, 8, 9])
    laps, answers = _laps(view.check, [attempt[i] for i in first_sight])
    first_out = _by_kind(first_sight, laps, answers, 1, overhead_ns) if laps else {}
    for i in warm:  # first sight's 100,000 pushed the warm set out of the view's caches
        view.check(*attempt[i])
    laps, answers = _laps(view.check, [attempt[i] for i in warm] * WARM_PASSES)
    warm_out = _by_kind(warm, laps, answers, WARM_PASSES, overhead_ns)
    rates_out = bench_edge_check(view, Workload(6, Settings()), calls)
    load_before = os.getloadavg()
    http = asyncio.run(_http(view, rates, rounds, duration_s, known))
    after = _mem_kb()
    return {
        "records": held,
        "known_users": known,
        "known_records": held - filler,
        "generated_records": filler,
        "build_s": round(build_s, 2),
        "rss_mb": round(loaded["VmRSS"] / 1024, 1),
        "rss_growth_mb": round((loaded["VmRSS"] - before["VmRSS"]) / 1024, 1),
        "rss_end_mb": round(after["VmRSS"] / 1024, 1),
        "peak_rss_mb": round(after["VmHWM"] / 1024, 1),
        "timer_overhead_ns": overhead_ns,
        "http_bodies": bodies,
        "check_first_sight": first_out,
        "check_warm": warm_out | {"users": len(warm), "passes": WARM_PASSES},
        "bench_edge_check": rates_out,
        "load_before_http": [round(x, 2) for x in load_before],
        "load_after_http": [round(x, 2) for x in os.getloadavg()],
        "http": http,
    }


def bench_check_all(args: argparse.Namespace) -> dict[str, Any]:
    """The check on the known users' records alone, then with ``--records`` in the store,
    each in its own process, with the load average around them."""
    out = _one_then_other(
        "b8_check",
        ("small", lambda: _child("check", args, records=0)),
        ("full", lambda: _child("check", args)),
    )
    out["b4_http_2000"] = B4_HTTP_2000
    small, full = out["small"], out["full"]
    if "error" not in small and "error" not in full:
        out["compared"] = {
            f"http_{rate}_p99_ms": [run["http"][rate]["http_p99_ms"] for run in (small, full)]
            for rate in full["http"]
        } | {
            f"check_{part}_{kind}_p99_us": [run[part][kind]["p99_us"] for run in (small, full)]
            for part in ("check_warm", "check_first_sight")
            for kind in ("familiar", "new_place", "unknown")
            if full[part] and small[part]
        }
    return out


# -- the whole part ----------------------------------------------------------------------


def _child(
    variant: str, args: argparse.Namespace, engine: str = "auto", records: int | None = None
) -> dict[str, Any]:
    records = args.records if records is None else records
    command = [sys.executable, "-m", "bench.b8_familiar", "--variant", variant]
    command += ["--records", str(records), "--python-records", str(args.python_records)]
    command += ["--kafka-records", str(args.kafka_records), "--known", str(args.known)]
    command += ["--rates", ",".join(map(str, args.rates)), "--http-rounds", str(args.http_rounds)]
    command += ["--duration-s", str(args.duration_s)]
    env = {**os.environ, "AUTHPIPE_ENGINE": engine}  # DecisionIndex's familiar storage
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
    result: dict[str, Any] = orjson.loads(lines[-1])
    return result


def bench_b8(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    started = datetime.now(UTC)
    rust = _child("rust", args)
    grown = _child("rust_grown", args)
    python = _child("python", args, engine="python")
    edge_with_store = _child("python", args, engine="rust")
    coldload = bench_coldload_all(args)
    check = bench_check_all(args)
    out: dict[str, Any] = {
        "part": "b8_familiar",
        "started_at": started.isoformat(timespec="seconds"),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "nproc": os.cpu_count(),
        "rust": rust,
        "rust_grown": grown,
        "python": python,
        "edge_with_store": edge_with_store,
        "coldload": coldload,
        "check": check,
        "targets": TARGETS,
    }
    if "error" not in rust and "error" not in python:
        scale = rust["records"]
        out["python_extrapolated"] = {
            "records": scale,
            "rss_gb": round(python["rss_bytes_per_record"] * scale / 2**30, 1),
            "apply_s": round(python["apply_us_per_record"] * scale / 1e6),
            "decode_only_s": round(python["decode_us_per_record"] * scale / 1e6),
        }
        out["ratio_bytes_per_record"] = round(
            python["rss_bytes_per_record"] / rust["rss_bytes_per_record"], 1
        )
        out["met"] = {
            "bytes_per_record": rust["rss_bytes_per_record"] <= TARGETS["bytes_per_record"],
            "rss_30m": rust["rss_growth_mb"] * RECORDS / scale <= TARGETS["rss_mb_30m"],
            "load_30m": rust["load_s"] * RECORDS / scale <= TARGETS["load_s_30m"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=RECORDS)
    parser.add_argument("--python-records", type=int, default=PYTHON_RECORDS)
    parser.add_argument("--kafka-records", type=int, default=KAFKA_RECORDS)
    parser.add_argument(
        "--variant",
        choices=(
            "all", "rust", "rust_grown", "python", "coldload", "coldload_kafka",
            "coldload_kafka_feed", "coldload_all", "check", "check_all"
        ),
        default="all",
    )  # fmt: skip
    parser.add_argument("--known", type=int, default=KNOWN, help="check: users with records")
    parser.add_argument(
        "--rates",
        type=lambda text: tuple(int(r) for r in text.split(",") if r),
        default=HTTP_RATES,
        help="check: HTTP requests/s, a comma list (empty: no HTTP)",
    )
    parser.add_argument("--http-rounds", type=int, default=HTTP_ROUNDS)
    parser.add_argument("--duration-s", type=float, default=HTTP_DURATION_S)
    parser.add_argument("--out", type=Path, help="also write the result (JSON) here")
    args = parser.parse_args(argv)
    # Here, not in the parts: a part run in a test's process must leave its logging alone.
    # As bench_edge: challenged checks log at info, the figures are taken at warning.
    configure_logging("warning", "json")
    if args.variant == "rust":
        result = bench_rust(args.records, reserve=True)
    elif args.variant == "rust_grown":
        result = bench_rust(args.records, reserve=False)
    elif args.variant == "python":
        result = bench_python(args.python_records)
    elif args.variant == "coldload":
        result = bench_coldload(args.records)
    elif args.variant == "coldload_kafka":
        result = bench_coldload_kafka(min(args.kafka_records, args.records))
    elif args.variant == "coldload_kafka_feed":
        result = bench_coldload_kafka(min(args.kafka_records, args.records), feed_only=True)
    elif args.variant == "coldload_all":
        result = bench_coldload_all(args)
    elif args.variant == "check":
        result = bench_check(
            args.records, args.known, args.rates, args.http_rounds, args.duration_s
        )
    elif args.variant == "check_all":
        result = bench_check_all(args)
    else:
        result = bench_b8(args)
    text = orjson.dumps(result, option=orjson.OPT_INDENT_2 if args.out else 0)
    if args.out:
        args.out.write_bytes(text + b"\n")
    print(orjson.dumps(result).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
