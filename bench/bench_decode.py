"""Benchmark of the one decision decoder, ``pipeline.contracts.codec.decode_decision``.

Run as ``python -m bench.bench_decode [--rounds 25] [--calls 2000]``. It decodes a rule's
account decision and a source decision as the worker writes them, with the grouping
check (``within_grouping``, /32 and /64) and with a check that accepts the Kafka key's own
source first (what a reader that has validated the key already can pass), and prints the
best per-decode time of interleaved rounds in microseconds (a busy neighbour slows every
case alike). The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import functools
import timeit
from collections.abc import Callable

import orjson

from pipeline.contracts.codec import decode_decision, encode
from pipeline.contracts.models import Decision, ms_to_datetime
from pipeline.core.grouping import within_grouping
from pipeline.core.keys import format_key

T0_MS = 1_790_000_000_000
ONE_SOURCE = functools.partial(within_grouping, ipv4_prefix=32, ipv6_prefix=64)


def _decision(scope: str, account: str | None, source: str | None) -> tuple[str, bytes]:
    key = format_key((scope, "default", account, source, None))
    decision = Decision(
        decision_id="d" * 32,
        key=key,
        tenant="default",
        scope=scope,  # type: ignore[arg-type]
        account_digest=account,
        source=source,
        device_id=None,
        applies_to="untrusted" if scope == "account" else "all",
        action="block",
        rule=scope,
        count=5,
        threshold=5,
        window_ms=900_000,
        issued_at=ms_to_datetime(T0_MS),
        expires_at=ms_to_datetime(T0_MS + 900_000),
        policy_version="bench-1",
    )
    return key, encode(decision)


def cases() -> dict[str, Callable[[], object]]:
    account_key, account = _decision("account", "a" * 32, None)
    source_key, source = _decision("source", None, "203.0.113.9")

    def accept_key_source(text: str) -> bool:
        return text == "203.0.113.9" or ONE_SOURCE(text)

    return {
        "account": lambda: decode_decision(account, source_ok=ONE_SOURCE, key=account_key),
        "source": lambda: decode_decision(source, source_ok=ONE_SOURCE, key=source_key),
        "source_key_checked": lambda: decode_decision(
            source, source_ok=accept_key_source, key=source_key
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    timed = cases()
    best = dict.fromkeys(timed, float("inf"))
    for _ in range(args.rounds):
        for name, call in timed.items():
            seconds = timeit.timeit(call, number=args.calls) / args.calls
            best[name] = min(best[name], seconds * 1e6)
    for name, us in best.items():
        print(f"decode_decision {name:20s} {us:6.2f} us")
    print(orjson.dumps({name: round(us, 2) for name, us in best.items()}).decode())


if __name__ == "__main__":
    main()
