"""The worker's faust app: how long its clients wait on one broker."""

from __future__ import annotations

from pathlib import Path

from pipeline.kafka_client import REQUEST_TIMEOUT_S
from pipeline.settings import Settings
from pipeline.stream.faust_app import new_app


def test_the_worker_retries_a_silent_broker_after_30_s_not_faust_s_20_minutes(
    tmp_path: Path,
) -> None:
    """Producer and consumer requests time out after 30 s (faust: 1,200 s and 90 s), so a
    partitioned broker's in-flight batch is retried on the new leader within the minute."""
    app = new_app(Settings(state_dir=tmp_path))
    assert REQUEST_TIMEOUT_S == 30.0
    assert (app.conf.producer_request_timeout, app.conf.broker_request_timeout) == (30.0, 30.0)
    producer = app._new_producer()
    assert producer._settings_default()["request_timeout_ms"] == 30_000
    assert producer._settings_extra()["enable_idempotence"] is True
