"""A new deployment's warm start (docs/operations.md, "Warm start"): past successes
produced to the input topic before go-live make their places familiar, through the real
worker, for what remains of ``familiar.memory_ms`` after each success."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.core.policy_rules import DAY_MS
from tests.plugins.waiting import wait_until
from tests.plugins.worker import StreamNames, event, produce, read_topic, start_worker

pytestmark = pytest.mark.integration


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def test_a_backfill_of_past_successes_makes_their_places_familiar(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[Any],
    tmp_path: Path,
) -> None:
    """With ingest.max_past_skew_ms at 31 days, successes 20 and 3 days old publish familiar
    exempts expiring 30 days after each; one 40 days old is dead-lettered past_timestamp."""
    now = datetime.now(UTC).replace(microsecond=0)
    past = [
        event(1, now - timedelta(days=20), "alice@example.com", "192.0.2.7", ok=True, run="w"),
        event(2, now - timedelta(days=3), "bob@example.com", "198.51.100.4", ok=True, run="w"),
        event(3, now - timedelta(days=40), "carol@example.com", "203.0.113.8", ok=True, run="w"),
    ]
    start_worker(
        workers, worker_env, tmp_path, AUTHPIPE_INGEST_MAX_PAST_SKEW_MS=str(31 * DAY_MS)
    ).wait_ready()
    produce(kafka_bootstrap, stream_names.input, [(b"k", v) for v in past])

    def exempts() -> list[dict[str, Any]] | None:
        rows = [orjson.loads(m.value) for m in read_topic(kafka_bootstrap, stream_names.decisions)]
        found = [r for r in rows if r["scope"] == "familiar" and r["account_digest"]]
        return found if len(found) >= 2 else None

    found = wait_until(exempts, 60, interval_s=0.5, description="two familiar exempts")
    by_source = {r["source"]: r for r in found}
    assert sorted(by_source) == ["192.0.2.7", "198.51.100.4"]
    for source, age_days in (("192.0.2.7", 20), ("198.51.100.4", 3)):
        row = by_source[source]
        assert row["action"] == "exempt"
        occurred_ms = int((now - timedelta(days=age_days)).timestamp() * 1000)
        assert _ms(row["issued_at"]) == occurred_ms
        assert _ms(row["expires_at"]) == occurred_ms + 30 * DAY_MS
    dlq = wait_until(
        lambda: d if (d := read_topic(kafka_bootstrap, stream_names.dlq)) else None,
        30,
        interval_s=0.5,
        description="the 40-day-old success dead-lettered",
    )
    assert [(dict(m.headers)["error"], m.value) for m in dlq] == [(b"past_timestamp", past[2])]
