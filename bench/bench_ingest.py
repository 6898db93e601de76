"""Decoding cost: valid login_attempt events/s through decode + validate + normalise.

    .venv/bin/python -m bench.bench_ingest [--events N]

Measures the three steps separately (pydantic ``validate_json`` with the TypeAdapter
built once; normalisation with source rules and keyed digests; the whole ingest batch
including partitioning and row building) on realistic events, single-threaded.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import UTC, datetime, timedelta

import orjson

from pipeline.contracts.codec import decode_attempt
from pipeline.settings import Settings
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    raw = events(args.events)
    settings = Settings(ingest={"trusted_proxies": ("10.0.0.0/8",)})  # type: ignore[arg-type]
    normaliser = build_normaliser(settings)

    started = time.perf_counter()
    decoded = [decode_attempt(r) for r in raw]
    decode_s = time.perf_counter() - started

    started = time.perf_counter()
    for event in decoded:
        normaliser.normalise(event)
    normalise_s = time.perf_counter() - started

    ingest = Ingest(normaliser, partitions=8)
    records = [Record("auth.login-attempts", i % 8, i, None, r) for i, r in enumerate(raw)]
    started = time.perf_counter()
    for i in range(0, len(records), 5000):
        ingest.process(records[i : i + 5000], now_ms=NOW_MS)
    ingest_s = time.perf_counter() - started

    figures = {
        "events": args.events,
        "decode_events_per_s": round(rate(args.events, decode_s)),
        "normalise_events_per_s": round(rate(args.events, normalise_s)),
        "ingest_events_per_s": round(rate(args.events, ingest_s)),
        "decode_us_per_event": round(decode_s / args.events * 1e6, 2),
        "normalise_us_per_event": round(normalise_s / args.events * 1e6, 2),
        "ingest_us_per_event": round(ingest_s / args.events * 1e6, 2),
    }
    for key, value in figures.items():
        print(f"{key:>24}: {value}")
    print(json.dumps({"bench": "ingest", **figures}))


if __name__ == "__main__":
    main()
