"""B1 as an A/B in one run, on one broker and one pre-loaded topic.

    python -m bench.b1_ab --variant A::AUTHPIPE_INGEST_DECODER=pydantic \\
        --variant B::AUTHPIPE_INGEST_DECODER=msgspec [--events 300000] [--rounds 3]

``--flood`` runs B3's flood instead (``--events`` distinct claimed accounts from a tenth as
many sources, the tables' cap at 20,000) and reports each run's peak RSS too.

``--variant LABEL[:ROOT[:NAME=VALUE,...]]`` as in ``bench.latency``: the code of checkout
ROOT (this one when empty) with those worker settings. The mixed topic of B1 is pre-loaded
once; each round then runs every variant in turn, each a fresh worker and consumer group
reading the whole topic (``bench.stream.follow_until_done``), so the sides share the
machine's moment. Reports every run and, per variant, the median events per CPU-second
and per second. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bench import stream
from bench.latency import Variant, parse_variant


def bench_b1_ab(
    ctx: stream.Context,
    events: int,
    variants: tuple[Variant, ...],
    rounds: int,
    flood: bool = False,
) -> dict[str, Any]:
    """Every variant in turn over one pre-loaded topic, ``rounds`` times."""
    extra: dict[str, str] = {}
    if flood:  # B3's shape: a tenth as many sources, the tables' cap at 20,000
        names, preload_s, policy = stream.prepare_b3(ctx, events, events // 10, 20_000)
        extra = {"AUTHPIPE_POLICY_PATH": str(policy)}
    else:
        names, preload_s = stream.prepare_b1(ctx, events)
    runs: list[dict[str, Any]] = []
    for n in range(rounds):
        for v in variants:
            fresh = stream.Names.fresh(f"ab-{v.label}", input_topic=names.input)
            stream.create_topics(ctx.bootstrap, fresh, ctx.partitions)
            load_before = os.getloadavg()[0]
            run = ctx.worker(fresh, f"b1-{v.label}-{n + 1}", v.root, **extra, **dict(v.env))
            try:
                result = stream.follow_until_done(run, events, 900.0)
            finally:
                run.stop()
            counts = stream.summary_counts(result.pop("final"))
            runs.append(
                {
                    "variant": v.label,
                    "round": n + 1,
                    "load_average_before": round(load_before, 2),
                    "dead_letters": counts["dead_letters"],
                    **{k: result[k] for k in ("events_per_s", "events_per_cpu_s", "cpu_s", "rows")},
                    "peak_rss_mb": result.get("peak_rss_mb_sampled", {}).get("VmHWM"),
                }
            )
    medians = {
        v.label: {
            key: statistics.median(r[key] for r in runs if r["variant"] == v.label)
            for key in ("events_per_cpu_s", "events_per_s", "peak_rss_mb")
            if all(r[key] is not None for r in runs if r["variant"] == v.label)
        }
        for v in variants
    }
    return {"events": events, "preload_s": round(preload_s, 1), "runs": runs, "medians": medians}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.b1_ab", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flood", action="store_true", help="B3's flood instead of B1's mix")
    parser.add_argument(
        "--variant", action="append", required=True, help="LABEL[:ROOT[:NAME=VALUE,...]]"
    )
    args = parser.parse_args(argv)
    variants = tuple(parse_variant(text, ()) for text in args.variant)
    workdir = Path(tempfile.mkdtemp(prefix="authpipe-b1-ab-"))
    with stream.broker(args.bootstrap) as bootstrap:
        ctx = stream.Context(bootstrap, workdir)
        try:
            result = bench_b1_ab(ctx, args.events, variants, args.rounds, args.flood)
        finally:
            ctx.stop_all()
    shutil.rmtree(workdir, ignore_errors=True)
    for run in result["runs"]:
        print(
            f"{run['variant']:>10} round {run['round']}: {run['events_per_cpu_s']:,} events per "
            f"CPU-second, {run['events_per_s']:,}/s, peak RSS {run['peak_rss_mb']} MB "
            f"(load average {run['load_average_before']})"
        )
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
