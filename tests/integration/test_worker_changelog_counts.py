"""The worker's changelog counters on the real broker: what each stage counts is what its
changelog topic holds, record for record, values and tombstones apart (issue 28)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipeline.topics import TABLES
from tests.integration.test_worker import as_messages, mixed_stream
from tests.plugins.waiting import wait_until
from tests.plugins.worker import StreamNames, WorkerProcess, produce, read_topic, start_worker

pytestmark = pytest.mark.integration

STAGES = {"account": "account-state", "source": "source-state", "rollup": "rollup-state"}


def on_topics(bootstrap: str, names: StreamNames) -> dict[str, tuple[int, int]]:
    """Per stage, (values, tombstones) on its changelog topic."""
    assert set(STAGES.values()) == set(TABLES)
    out = {}
    for stage, table in STAGES.items():
        records = read_topic(bootstrap, f"{names.app_id}-{table}-changelog")
        tombstones = sum(1 for record in records if record.value is None)
        out[stage] = (len(records) - tombstones, tombstones)
    return out


def counted(worker: WorkerProcess) -> dict[str, tuple[int, int]]:
    """Per stage, (values, tombstones) as the worker's /metrics counts them."""
    out = {}
    for stage in STAGES:
        label = f'{{stage="{stage}"}}'
        records = int(worker.metric(f"authpipe_changelog_records_total{label}"))
        tombstones = int(worker.metric(f"authpipe_changelog_tombstones_total{label}"))
        out[stage] = (records - tombstones, tombstones)
    return out


def test_each_stage_counts_exactly_the_values_and_tombstones_its_changelog_topic_holds(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[Any],
    tmp_path: Path,
) -> None:
    """Two bursts 40 minutes apart in event time (the first burst's windows expire under the
    second: tombstones); once both stages applied all 1,200 events, each stage's counters
    equal the values and tombstones on its changelog topic, and there are tombstones."""
    now = datetime.now(UTC)
    values = mixed_stream(600, 31, now - timedelta(minutes=40)) + mixed_stream(600, 32, now)
    worker = start_worker(workers, worker_env, tmp_path).wait_ready()
    produce(kafka_bootstrap, stream_names.input, as_messages(values))
    wait_until(
        lambda: worker.metric('authpipe_stage_rows_total{stage="account"}') == len(values),
        90,
        interval_s=0.5,
        description="the account stage applied all 1,200 events",
    )
    try:
        wait_until(
            lambda: on_topics(kafka_bootstrap, stream_names) == counted(worker),
            60,
            interval_s=1,
            description="changelog topics holding what the worker counted",
        )
    except AssertionError:
        assert on_topics(kafka_bootstrap, stream_names) == counted(worker)
        raise
    final = counted(worker)
    assert final["account"][0] > 0 and final["source"][0] > 0 and final["rollup"][0] > 0
    assert final["account"][1] > 0
