"""The rollup's changelog on the real broker: what it forgets is tombstoned, and a worker
restored from that log mid-stream still gives the replay's decisions and alerts."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.integration.test_replay_parity import killed_a_third_in
from tests.integration.test_sim_pipeline import live_equals_replay
from tests.plugins.worker import StreamNames, WorkerProcess, read_topic

pytestmark = pytest.mark.integration

# One-second windows, so a two-minute stream forgets: rule 8's shares after 5 windows,
# stuffing_tenant's after 4, the strangers tier's after about 73 (keep_windows 68, the
# horizon's 2, and its last settled window redeem_ms and one window back).
POLICY = """
policy_version = "forget-broker-1"
[defaults.stuffing]
tenant_window_ms = 1000
tenant_baseline_windows = 2
[defaults.tenant_spray]
window_ms = 1000
baseline_windows = 3
[defaults.strangers]
redeem_ms = 2000
span_ms = 5000
active_ms = 2000
max_wave_ms = 60000
quick_ms = 1000
quick_span_ms = 2000
"""
SPANS = {"a": 5, "s": 5, "u": 4, "x": 73, "r": 73}
"""The most windows a kind's live share records may span per tenant."""


@pytest.mark.timeout(900)
def test_the_rollups_tombstoned_changelog_restores_to_the_replays_outputs(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """The mixed scenario (2 simulated minutes, unpaced) under one-second rollup windows,
    the worker SIGKILLed a third of the way and restored from its changelogs: its
    decisions and alerts equal the replay's, and the rollup's changelog topic, compacted,
    holds only the windows each kind still looks at (and tombstones for the rest)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    worker_env = {
        **worker_env,
        "AUTHPIPE_POLICY_PATH": str(policy),
        "AUTHPIPE_WORKER_INPUT_IDLE_MS": "2000",  # as test_replay_parity: a stalled producer
    }
    env = {**worker_env, "AUTHPIPE_LOG_LEVEL": "warning"}
    _, truth = killed_a_third_in(kafka_bootstrap, stream_names, worker_env, workers, tmp_path)
    diff, _, _ = live_equals_replay(env, tmp_path, truth)
    parity = diff["live_vs_replay"]
    assert parity["decisions"]["live"] >= 5 and parity["alerts"]["live"] >= 1

    log: dict[bytes, bytes | None] = {}
    for record in read_topic(kafka_bootstrap, f"{stream_names.app_id}-rollup-state-changelog"):
        log[record.key] = record.value  # compacted: the last value per key
    keys = [orjson.loads(key) for key, value in log.items() if value is not None]
    shares = [key for key in keys if len(key) == 5 and key[2].__class__ is int]
    windows: dict[tuple[str, str], list[int]] = {}
    for _partition, tenant, window, kind, _part in shares:
        windows.setdefault((tenant, kind), []).append(window)
    spans = {slot: max(ws) - min(ws) for slot, ws in windows.items()}
    print("live share records", len(shares), "of", len(log), "keys; spans", spans)
    assert shares and all(span <= SPANS[kind] for (_, kind), span in spans.items()), spans
    assert sum(value is None for value in log.values()) > 2 * len(shares)
