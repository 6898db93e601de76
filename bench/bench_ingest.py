"""Decoding cost: valid login_attempt events/s through decode + validate + normalise.

    .venv/bin/python -m bench.bench_ingest [--events N] [--rounds R] [--decoder both]

Measures the three steps separately (``decode_attempt``; normalisation with source rules
and keyed digests; the whole ingest batch including partitioning and row building) on
realistic events in batches of 5,000, single-threaded, in CPU time. ``--decoder both`` (the default) is an A/B
of ``ingest.decoder``: each round measures msgspec and then pydantic (a fresh normaliser
each, so neither inherits the other's caches), and the best round of each is reported
with the ratio pydantic / msgspec. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import orjson

from pipeline.contracts.codec import decode_attempt
from pipeline.settings import DECODERS, Settings
from pipeline.stream.ingest import Ingest, Record
from pipeline.wiring import build_normaliser

START = datetime(2026, 11, 1, tzinfo=UTC)
NOW_MS = int((START + timedelta(days=1)).timestamp() * 1000)  # every event inside both skews


def events(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    start = START
    out = []
    for i in range(n):
        body = {
            "event_id": f"evt-{i:09d}",
            "occurred_at": (start + timedelta(milliseconds=i)).isoformat(),
            "tenant": "default",
            "service": "web-login",
            "flow": "login",
            "account": f"user{rng.randrange(200_000)}@example.com",
            "peer_ip": f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}",
            "forwarded_for": [f"198.51.{rng.randrange(256)}.{rng.randrange(256)}"],
            "device_id": f"dev-{rng.randrange(10**9):x}",
            "device_trusted": rng.random() < 0.6,
            "outcome": "success" if rng.random() < 0.9 else "failure",
            "user_agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36",
        }
        if body["outcome"] == "failure":
            body["failure_reason"] = "bad_password"
        out.append(orjson.dumps(body))
    return out


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def timed(step: Callable[[], object]) -> float:
    """CPU seconds of one call of ``step``."""
    started = time.process_time()
    step()
    return time.process_time() - started


def measure(raw: list[bytes], decoder: str, settings: Settings) -> dict[str, float]:
    """CPU seconds of each step over ``raw`` with ``ingest.decoder = decoder``, in batches
    of 5,000 as ingest reads them (holding every decoded event at once would time the
    cycle collector walking them too)."""
    fast = decoder == "msgspec"
    chunks = [raw[i : i + 5000] for i in range(0, len(raw), 5000)]
    normaliser = build_normaliser(settings)
    decode_s = normalise_s = 0.0
    for chunk in chunks:
        decode_s += timed(lambda c=chunk: [decode_attempt(r, fast=fast) for r in c])
        decoded = [decode_attempt(r, fast=fast) for r in chunk]
        normalise_s += timed(lambda d=decoded: [normaliser.normalise(event) for event in d])
    ingest = Ingest(build_normaliser(settings), partitions=8, decoder=decoder)
    records = [Record("auth.login-attempts", i % 8, i, None, r) for i, r in enumerate(raw)]
    batches = [records[i : i + 5000] for i in range(0, len(records), 5000)]
    ingest_s = timed(lambda: [ingest.process(batch, now_ms=NOW_MS) for batch in batches])
    return {"decode": decode_s, "normalise": normalise_s, "ingest": ingest_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--decoder",
        choices=("both", *DECODERS),
        default="both",
        help="the ingest.decoder to measure; both: the A/B, interleaved by round",
    )
    args = parser.parse_args()
    raw = events(args.events)
    settings = Settings(ingest={"trusted_proxies": ("10.0.0.0/8",)})  # type: ignore[arg-type]
    decoders = DECODERS if args.decoder == "both" else (args.decoder,)
    best = {d: {"decode": math.inf, "normalise": math.inf, "ingest": math.inf} for d in decoders}
    for _ in range(args.rounds):
        for decoder in decoders:
            for step, seconds in measure(raw, decoder, settings).items():
                best[decoder][step] = min(best[decoder][step], seconds)
    figures: dict[str, object] = {"events": args.events, "rounds": args.rounds}
    for decoder, steps in best.items():
        for step, seconds in steps.items():
            figures[f"{decoder}_{step}_us_per_event"] = round(seconds / args.events * 1e6, 2)
        figures[f"{decoder}_ingest_events_per_cpu_s"] = round(rate(args.events, steps["ingest"]))
    if len(decoders) == 2:
        for step in ("decode", "ingest"):
            figures[f"{step}_pydantic_over_msgspec"] = round(
                best["pydantic"][step] / best["msgspec"][step], 2
            )
    for key, value in figures.items():
        print(f"{key:>36}: {value}")
    print(json.dumps({"bench": "ingest", **figures}))


if __name__ == "__main__":
    main()
