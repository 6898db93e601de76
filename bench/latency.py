"""B7: from the broker's acknowledgement of the tripping failure to the edge refusing.

One ``authpipe worker`` and one ``authpipe edge serve`` (subprocesses) on the broker, per
background load (default 0, 50, 1,000 and 10,000 events/s of mixed traffic from a second
process, ``bench.stream --load``). A probe sends four failures of a fresh (account,
source), waits for their acknowledgement, sends the tripping fifth and, from the broker's
acknowledgement of it, polls the edge's ``GET /v1/check`` every ``POLL_S`` until the next
attempt of that pair is refused. Probes run one at a time (``--probes`` per load, 30 by
default, after ``WARMUP_PROBES`` reported apart), so a probe's own failures are the only
input at 0 events/s.

Per probe, a trace of where the time went: ``to_worker_send`` (the acknowledgement to the
decision's record timestamp, which the worker's producer stamps when it sends),
``to_topic`` (to a consumer of the decisions topic reading it) and ``to_edge`` (to the
first refused answer). All times are on this host's clock (one machine).

Run alone: ``python -m bench.run --parts b7`` (about 8 minutes on 2 cores: 90 s of load
before the probes at each loaded step), or ``python -m bench.latency [--bootstrap
HOST:PORT] [--loads 0,50] [--probes 30] [--warmup-s 90]`` (prints JSON). The load average (1 min) is recorded at the start and end of every load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench.stream import (
    REPO_ROOT,
    Context,
    Names,
    WorkerRun,
    broker,
    create_topics,
    failure,
    free_port,
    latency_summary,
    start_load,
)
from pipeline.clock import wall_ms
from pipeline.contracts.codec import encode
from pipeline.manual import Target, manual_decision
from pipeline.settings import Settings
from pipeline.wiring import build_normaliser

LOADS = (0, 50, 1000, 10_000)
PROBES = 30
WARMUP_PROBES = 3
"""Probes run first at every load and reported apart (``warmup``), not in the percentiles:
a worker's first seconds (its groups settling, the load generator's first batches handed
over late, so the live marks are off for ``worker.input_idle_ms``) are its start, not its
steady state. B7 on 2026-12-02: 2-4 of the first 4 probes at 200-900 ms, at most 1 of
the next 36."""
POLL_S = 0.005
PROBE_TIMEOUT_S = 5.0
_NORMALISER = build_normaliser(Settings())
"""The operator's grouping of the feed probe's source (the defaults, as the bench's edge)."""
WARMUP_S = 15.0
"""Seconds between the worker and edge being ready and the first probe at 0 events/s: the
priming burst below, then quiet (on 2026-12-07, with 3 s and no burst, the 1st to 4th
probes after the warm-up ones took up to 207 ms, the rest at most 135; bench/README.md)."""
PRIME_RATE = 200
PRIME_S = 3
"""At 0 events/s, a burst of ``PRIME_RATE`` events/s for ``PRIME_S`` s at the start of the
settle: each run's topics are new, and the first append to a partition costs the broker
more than a later one, which production's long-lived topics never pay again (on
2026-12-07, without it, the first 1 to 4 probes after 15 s of settle took up to 218 ms,
the rest at most 145)."""
LOAD_WARMUP_S = 90.0
"""Seconds the background load flows before the first probe (``--warmup-s``): the steady
state, not a new deployment's first minute. ``bench.stream``'s load draws from 50,000
users, and nearly every success in its first minute is the first of its (account, place)
and publishes a familiar exempt (issue 24); on 2026-12-03, at 1,000 events/s, 3 s of load
first gave p99 1,263 ms with the account stage busy 0.79, 90 s gave 182 ms and 0.32.
``--warmup-s 3`` measures the cold minute."""
# A fixed key for the benchmark's worker and edge (they must share it; never a real one).
ACCOUNT_BUSY = 'authpipe_stage_seconds_total{stage="account"}'
SLOW_ARRIVALS = "authpipe_ingest_slow_arrivals_total"
DIGEST_KEY = "bench-b7-digest-key-0123456789abcdefghij"


def load_1min() -> float:
    return round(os.getloadavg()[0], 2)


class EdgeRun:
    """One ``authpipe edge serve`` subprocess following ``decisions`` on ``bootstrap``."""

    def __init__(
        self,
        bootstrap: str,
        decisions: str,
        log_path: Path,
        env: dict[str, str],
        root: Path = REPO_ROOT,
    ):
        self.root = root
        self.port = free_port()
        self.env = {
            **os.environ,
            "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "AUTHPIPE_KAFKA_DECISIONS_TOPIC": decisions,
            "AUTHPIPE_IDENTITY_DIGEST_KEY": DIGEST_KEY,
            "AUTHPIPE_LOG_FORMAT": "json",
            "AUTHPIPE_LOG_LEVEL": "warning",
            **env,
        }
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> EdgeRun:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline.cli", "edge", "serve", "--port", str(self.port)],
                env=self.env,
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.perf_counter() + timeout_s
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"edge exited: {self.log_path.read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                url = f"http://127.0.0.1:{self.port}/readyz"
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            if time.perf_counter() > deadline:
                raise RuntimeError(f"edge not ready in {timeout_s} s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


class CheckClient:
    """A keep-alive HTTP/1.1 connection to the edge: ``GET /v1/check``'s ``allowed``, and
    the block-list feed long-polled as ``examples/gateway/sync-blocklist.sh`` does."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, target: str, headers: str = "") -> tuple[bytes, bytes]:
        """(head, body) of ``GET target``; any status."""
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(f"GET {target} HTTP/1.1\r\nHost: b7\r\n{headers}\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        return head, await self.reader.readexactly(length)

    async def allowed(self, account: str, ip: str) -> bool:
        head, body = await self.get(f"/v1/check?account={account}&ip={ip}")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"edge answered {head[:40]!r} {body[:200]!r}")
        return bool(orjson.loads(body)["allowed"])

    async def feed_lists(self, ip: str, timeout_s: float) -> bool:
        """Long-poll ``/v1/blocklist?format=text`` (``If-None-Match``, ``wait_ms``) until
        its body lists ``ip``; False after ``timeout_s``."""
        deadline = time.perf_counter() + timeout_s
        etag = ""
        line = ip.encode() + b"\n"
        while (left_ms := int((deadline - time.perf_counter()) * 1000)) > 0:
            conditional = f"If-None-Match: {etag}\r\n" if etag else ""
            wait = f"&wait_ms={left_ms}" if etag else ""
            head, body = await self.get(f"/v1/blocklist?format=text{wait}", conditional)
            if head.startswith(b"HTTP/1.1 200"):
                if line in body:
                    return True
                for h in head.split(b"\r\n"):
                    if h.lower().startswith(b"etag:"):
                        etag = h.split(b":", 1)[1].strip().decode()
            elif not head.startswith(b"HTTP/1.1 304"):
                raise RuntimeError(f"edge feed answered {head[:40]!r} {body[:200]!r}")
        return False

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()


async def run_probes(
    bootstrap: str,
    names: Names,
    edge_port: int,
    probes: int,
    gap_s: float = 0.05,
    warmup: int = WARMUP_PROBES,
) -> dict[str, Any]:
    """``warmup`` then ``probes`` probes, one at a time; per probe the trace in the module
    docstring (the warm-up probes' traces apart, under ``warmup``)."""
    consumer = AIOKafkaConsumer(
        names.decisions,
        bootstrap_servers=bootstrap,
        auto_offset_reset="latest",
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=-1, linger_ms=0)
    await asyncio.gather(producer.start(), consumer.start())
    client = CheckClient(edge_port)
    feed_client = CheckClient(edge_port)
    feeds: list[float | None] = []
    acked_wall: dict[str, int] = {}
    acked_at: dict[str, float] = {}
    to_topic: dict[str, float] = {}
    to_worker_send: dict[str, float] = {}

    async def read_topic() -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=100)
            now = time.perf_counter()
            for messages in batch.values():
                for m in messages:
                    if m.value and b'"scope":"account_source"' in m.value:
                        ip = orjson.loads(m.value).get("source")
                        if ip in acked_at and ip not in to_topic:
                            to_topic[ip] = now - acked_at[ip]
                            to_worker_send[ip] = (m.timestamp - acked_wall[ip]) / 1000

    reader = asyncio.create_task(read_topic())
    traces: list[dict[str, Any]] = []
    warm: list[dict[str, Any]] = []
    timed_out = 0
    try:
        # the consumer's position is set (auto_offset_reset=latest) before the first probe
        await consumer.getmany(timeout_ms=200)
        run_tag = uuid.uuid4().hex[:6]
        for i in range(warmup + probes):
            if i == warmup:
                warm, traces, feeds, timed_out = traces, [], [], 0
            account = f"b7-{run_tag}-{i}@example.com"
            ip = f"172.20.{i // 250}.{i % 250 + 1}"
            await send_five(producer, names.input, f"b7{run_tag}-{i}", account, ip, gap_s)
            acked = time.perf_counter()
            acked_at[ip], acked_wall[ip] = acked, wall_ms()
            refused_s = None
            while time.perf_counter() - acked < PROBE_TIMEOUT_S:
                if not await client.allowed(account, ip):
                    refused_s = time.perf_counter() - acked
                    break
                await asyncio.sleep(POLL_S)
            feed_ms = await feed_probe(producer, names, feed_client, f"{run_tag}-{i}", i)
            feeds.append(feed_ms)
            if refused_s is None:
                timed_out += 1
                continue
            # the topic reader may see the decision just after the edge refused
            deadline = time.perf_counter() + 1.0
            while ip not in to_topic and time.perf_counter() < deadline:
                await asyncio.sleep(0.005)
            traces.append(
                {
                    "to_worker_send_ms": round(to_worker_send[ip] * 1000, 1)
                    if ip in to_worker_send
                    else None,
                    "to_topic_ms": round(to_topic[ip] * 1000, 1) if ip in to_topic else None,
                    "to_edge_ms": round(refused_s * 1000, 1),
                }
            )
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await client.close()
        await feed_client.close()
        await asyncio.gather(producer.stop(), consumer.stop(), return_exceptions=True)

    def column(name: str) -> list[float]:
        return [t[name] / 1000 for t in traces if t[name] is not None]

    return {
        "probes": probes,
        "refused": len(traces),
        "timed_out": timed_out,
        "to_edge": latency_summary(column("to_edge_ms")),
        "to_topic": latency_summary(column("to_topic_ms")),
        "to_worker_send": latency_summary(column("to_worker_send_ms")),
        # the block-list feed: an operator's block of a fresh source to the feed listing it
        "to_feed": latency_summary([ms / 1000 for ms in feeds if ms is not None]),
        "feed_timed_out": sum(ms is None for ms in feeds),
        "feed_ms": feeds,
        "traces": traces,
        "warmup": warm,
    }


async def send_five(
    producer: AIOKafkaProducer,
    topic: str,
    tag: str,
    account: str,
    ip: str,
    gap_s: float,
    **fields: str,
) -> None:
    """Four failures of (account, ip), their acknowledgements, ``gap_s``, then the
    tripping fifth, returning at its acknowledgement (acks=all)."""
    now = wall_ms()
    sends = []
    for n in range(4):
        key, value, ts = failure(f"{tag}-{n}", account, ip, now + n, **fields)
        sends.append(await producer.send(topic, key=key, value=value, timestamp_ms=ts))
    await asyncio.gather(*sends)
    await asyncio.sleep(gap_s)
    key, value, ts = failure(f"{tag}-4", account, ip, wall_ms(), **fields)
    await producer.send_and_wait(topic, key=key, value=value, timestamp_ms=ts)


async def feed_probe(
    producer: AIOKafkaProducer, names: Names, client: CheckClient, tag: str, i: int
) -> float | None:
    """An operator blocks a fresh source (``pipeline.manual``'s decision, published to the
    decisions topic as ``authpipe decisions add`` does); from the broker's acknowledgement,
    ms until the edge's block-list feed lists the source. None: not within
    ``PROBE_TIMEOUT_S``.

    Since issue 44 (1eb5324) no rule puts a source on the feed: a source's failed CAPTCHAs
    earn it a CAPTCHA at the edge, not a block. Operators' blocks are what the feed
    serves, so they are what this probe times (the topic to nginx's view; the worker is
    not on this path)."""
    ip = f"172.21.{i // 250}.{i % 250 + 1}"
    decision = manual_decision(
        Target("default", source=ip),
        _NORMALISER,
        ttl_ms=600_000,
        reason=f"b7 feed probe {tag}",
        operator="bench",
        now_ms=wall_ms(),
    )
    await producer.send_and_wait(names.decisions, key=decision.key.encode(), value=encode(decision))
    acked = time.perf_counter()
    if not await client.feed_lists(ip, PROBE_TIMEOUT_S):
        return None
    return round((time.perf_counter() - acked) * 1000, 1)


def bench_one(
    ctx: Context,
    rate_per_s: int,
    probes: int,
    root: Path = REPO_ROOT,
    warmup_s: float = LOAD_WARMUP_S,
    fresh: bool = False,
    **worker_env: str,
) -> dict[str, Any]:
    """One load: a fresh worker and edge (the code of ``root``), the load flowing for
    ``warmup_s`` (``WARMUP_S`` at 0 events/s), then probes; ``fresh``: every ordinary
    user of the load signs in at a new place (``bench.stream.MixedTraffic``)."""
    names = Names.fresh(f"b7-{rate_per_s}")
    create_topics(ctx.bootstrap, names, ctx.partitions)
    label = f"b7-{rate_per_s}-{names.app_id[-8:]}"
    run: WorkerRun = ctx.worker(
        names, label, root, AUTHPIPE_IDENTITY_DIGEST_KEY=DIGEST_KEY, **worker_env
    )
    edge = EdgeRun(ctx.bootstrap, names.decisions, ctx.workdir / f"edge-{label}.log", {}, root)
    load: subprocess.Popen[bytes] | None = None
    try:
        edge.start()
        run.wait_ready()
        edge.wait_ready()
        # At 0 events/s a short burst first writes every partition of the run's new topics
        # (PRIME_*), then nothing flows while the probes run.
        rate, seconds = (rate_per_s, 600) if rate_per_s else (PRIME_RATE, PRIME_S)
        load = start_load(ctx.bootstrap, names.input, rate, seconds, fresh=fresh)
        waited_s = warmup_s if rate_per_s else WARMUP_S
        time.sleep(waited_s)
        load_start = load_1min()
        before, t0 = run.metrics(), time.perf_counter()
        cpu0 = run.cpu_s()
        result = asyncio.run(run_probes(ctx.bootstrap, names, edge.port, probes))
        after, span_s = run.metrics(), time.perf_counter() - t0
        key = "authpipe_events_total"
        result |= {
            "background_rate_per_s": rate_per_s,
            "load_warmup_s": waited_s,
            "worker_events_per_s_during": round((after.get(key, 0) - before.get(key, 0)) / span_s),
            "worker_cpu_share": round((run.cpu_s() - cpu0) / span_s, 2),
            # seconds ingest waited for the account stage (backpressure) during the probes
            "ingest_held_s": round(
                after.get("authpipe_ingest_held_seconds_total", 0)
                - before.get("authpipe_ingest_held_seconds_total", 0),
                2,
            ),
            # share of the span the account stage spent applying envelopes
            "account_stage_busy": round(
                (after.get(ACCOUNT_BUSY, 0) - before.get(ACCOUNT_BUSY, 0)) / span_s, 2
            ),
            # events handed to ingest later than the live slack (each turns the live marks
            # off for input_idle_ms: rows released by the idle rule, about 500 ms later)
            "slow_arrivals": int(after.get(SLOW_ARRIVALS, 0) - before.get(SLOW_ARRIVALS, 0)),
            "late_rows": int(after.get("authpipe_reorder_late_rows", 0)),
            "forced_rows": int(after.get("authpipe_reorder_forced_rows", 0)),
            "load_average_start": load_start,
            "load_average_end": load_1min(),
            "span_s": round(span_s, 1),
        }
        return result
    finally:
        if load is not None and load.poll() is None:
            os.killpg(load.pid, signal.SIGKILL)
            load.wait()
        edge.stop()
        run.stop()


@dataclass(frozen=True)
class Variant:
    """One side of an A/B run: a label, the checkout whose code runs, worker settings."""

    label: str
    root: Path = REPO_ROOT
    env: tuple[tuple[str, str], ...] = ()


def bench_b7(
    ctx: Context,
    loads: tuple[int, ...] = LOADS,
    probes: int = PROBES,
    variants: tuple[Variant, ...] = (Variant(""),),
    rounds: int = 1,
    warmup_s: float = LOAD_WARMUP_S,
    fresh: bool = False,
) -> dict[str, Any]:
    """B7 at every load in ``loads``, each variant in turn (``rounds`` times, so an A/B
    comparison shares the machine's moment); a load that fails is recorded, the others
    go on. Results by ``"<load>"`` or, with variants, ``"<load>/<label>[/<round>]"``."""
    out: dict[str, Any] = {
        "loads": list(loads),
        "probes_per_load": probes,
        "load_warmup_s": warmup_s,
        "load_fresh": fresh,
        "by_load": {},
    }
    for rate in loads:
        for n in range(rounds):
            for v in variants:
                name = "/".join(
                    x for x in (str(rate), v.label, str(n + 1) if rounds > 1 else "") if x
                )
                try:
                    out["by_load"][name] = bench_one(
                        ctx, rate, probes, v.root, warmup_s, fresh, **dict(v.env)
                    )
                except Exception as exc:  # one load failing must not lose the others
                    out["by_load"][name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    return out


def table(result: dict[str, Any]) -> list[str]:
    """B7 as markdown rows: load, p50/p99 to the edge, to the topic, late rows, load average."""
    lines = [
        "| background load (events/s) | achieved | p50 to edge | p99 to edge | p99 to topic "
        "| p99 ack to worker send | refused / probes | late rows | slow arrivals | load average "
        "| feed p50 / p99 (listed / probes) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rate, part in result.get("by_load", {}).items():
        if "error" in part:
            lines.append(f"| {rate} | **error** {part['error'][:200]} | | | | | | | | | |")
            continue
        feed = part.get("to_feed") or {}
        lines.append(
            f"| {rate} | {part['worker_events_per_s_during']:,} "
            f"| {part['to_edge']['p50_ms']} ms | {part['to_edge']['p99_ms']} ms "
            f"| {part['to_topic']['p99_ms']} ms | {part['to_worker_send']['p99_ms']} ms "
            f"| {part['refused']} / {part['probes']} | {part['late_rows']} "
            f"| {part.get('slow_arrivals', '')} "
            f"| {part['load_average_start']} / {part['load_average_end']} "
            f"| {feed.get('p50_ms')} / {feed.get('p99_ms')} ms "
            f"({part['probes'] - part.get('feed_timed_out', 0)} / {part['probes']}) |"
        )
    return lines


def _pair(text: str) -> tuple[str, str]:
    name, _, value = text.partition("=")
    return name, value


def parse_variant(text: str, base: tuple[tuple[str, str], ...]) -> Variant:
    label, _, rest = text.partition(":")
    root, _, env = rest.partition(":")
    pairs = tuple(_pair(item) for item in env.split(",") if item)
    return Variant(label, Path(root) if root else REPO_ROOT, base + pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.latency", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--loads", default=",".join(map(str, LOADS)))
    parser.add_argument("--probes", type=int, default=PROBES)
    parser.add_argument(
        "--worker-env", action="append", default=[], help="NAME=VALUE for the worker (A side)"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="LABEL[:ROOT[:NAME=VALUE,...]]: an A/B side (the code of checkout ROOT, worker "
        "settings); every variant runs at each load in turn",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the variants per load")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=LOAD_WARMUP_S,
        help=f"seconds the load flows before the first probe (default {LOAD_WARMUP_S:g}: "
        "the steady state; 3 measures a new deployment's first minute)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="every ordinary user of the load signs in at a new place (first sign-ins)",
    )
    args = parser.parse_args(argv)
    loads = tuple(int(x) for x in args.loads.split(","))
    base = tuple(_pair(item) for item in args.worker_env)
    variants = tuple(parse_variant(text, base) for text in args.variant) or (Variant("", env=base),)
    workdir = Path(tempfile.mkdtemp(prefix="authpipe-b7-"))
    with broker(args.bootstrap) as bootstrap:
        ctx = Context(bootstrap, workdir)
        try:
            result = bench_b7(
                ctx, loads, args.probes, variants, args.rounds, args.warmup_s, args.fresh
            )
        finally:
            ctx.stop_all()
    sys.stdout.write("\n".join(table(result)) + "\n")
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
