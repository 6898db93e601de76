"""Compressed input from a real librdkafka producer (Debian's kcat, installed by
scripts/setup): every codec is counted, and a batch the worker cannot decode becomes one
dead letter with its offset range instead of a crash loop (issue 15, item 4)."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.plugins.waiting import wait_until
from tests.plugins.worker import (
    StreamNames,
    ensure_stream_topics,
    event,
    read_topic,
    start_worker,
)

pytestmark = pytest.mark.integration

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def kcat_produce(bootstrap: str, topic: str, values: list[bytes], codec: str) -> None:
    """One kcat run: the values keyed by account, sent as batches compressed with ``codec``."""
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is missing: run `bash scripts/setup` (installs Debian's kcat)"
    lines = b"".join(orjson.loads(v)["account"].encode() + b"\t" + v + b"\n" for v in values)
    done = subprocess.run(
        [
            kcat,
            "-P",
            "-b",
            bootstrap,
            "-t",
            topic,
            "-z",
            codec,
            "-K",
            "\t",
            "-X",
            "linger.ms=100",
            "-X",
            "acks=all",
        ],
        input=lines,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()


def decisions_by_account(bootstrap: str, names: StreamNames) -> dict[str, Any]:
    return {
        orjson.loads(m.value)["key"]: orjson.loads(m.value)
        for m in read_topic(bootstrap, names.decisions)
    }


def test_every_codec_kcat_sends_is_decoded_and_counted(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[Any],
    tmp_path: Path,
) -> None:
    """Five failures per codec (none, gzip, snappy, lz4, zstd) give five (account, source)
    blocks (each account's seed 002 lock beside them), no dead letter."""
    start_worker(workers, worker_env, tmp_path).wait_ready()
    now = datetime.now(UTC)
    for n, codec in enumerate(CODECS):
        values = [
            event(
                10 * n + i,
                now + timedelta(milliseconds=i),
                f"{codec}-victim",
                f"203.0.113.{n + 1}",
                run=codec,
            )
            for i in range(5)
        ]
        kcat_produce(kafka_bootstrap, stream_names.input, values, codec)

    def all_blocked() -> list[Any] | None:
        found = [
            d
            for d in decisions_by_account(kafka_bootstrap, stream_names).values()
            if d["rule"] == "account_source"
        ]
        return found if len(found) == len(CODECS) else None

    decisions = wait_until(all_blocked, 60, interval_s=0.5, description="a block per codec")
    assert sorted((d["source"], d["action"], d["count"]) for d in decisions) == [
        (f"203.0.113.{n + 1}", "block", 5) for n in range(len(CODECS))
    ]
    assert read_topic(kafka_bootstrap, stream_names.dlq) == []


def test_a_batch_the_worker_cannot_decode_is_dead_lettered_not_a_crash(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[Any],
    tmp_path: Path,
) -> None:
    """A worker without the snappy library (cramjam hidden, as on the issue's machine) meets
    plain, snappy, plain batches of one partition in one fetch: the snappy batch becomes one
    dead letter with its offset range, the plain failures around it still add up to a
    block, and a restarted worker does not meet the batch again."""
    hidden = tmp_path / "no-cramjam"
    hidden.mkdir()
    (hidden / "cramjam.py").write_text(
        'raise ImportError("hidden by the test: no snappy, lz4 or zstd")\n'
    )
    ensure_stream_topics(kafka_bootstrap, stream_names, partitions=4)
    now = datetime.now(UTC)

    def failures(first: int, count: int, account: str) -> list[bytes]:
        return [
            event(i, now + timedelta(milliseconds=i), account, "198.51.100.9")
            for i in range(first, first + count)
        ]

    kcat_produce(kafka_bootstrap, stream_names.input, failures(0, 2, "carol"), "none")
    kcat_produce(kafka_bootstrap, stream_names.input, failures(2, 3, "carol"), "snappy")
    kcat_produce(kafka_bootstrap, stream_names.input, failures(5, 3, "carol"), "none")
    worker = start_worker(workers, worker_env, tmp_path, PYTHONPATH=str(hidden)).wait_ready()

    dlq = wait_until(
        lambda: read_topic(kafka_bootstrap, stream_names.dlq),
        60,
        interval_s=0.5,
        description="the dead letter of the snappy batch",
    )
    assert len(dlq) == 1
    headers = dict(dlq[0].headers)
    partition = int(headers["source_partition"])
    assert (headers["error"], headers["stage"]) == (b"undecodable_batch", b"ingest")
    assert (dlq[0].key, dlq[0].value) == (None, b"")  # the bytes stay in the input topic
    assert (headers["source_topic"], headers["source_offset"], headers["source_offset_last"]) == (
        stream_names.input.encode(),
        b"2",
        b"4",
    )
    assert headers["error_detail"].startswith(
        b"offsets 2..4 (codec snappy): UnsupportedCodecError: Libraries for snappy compression codec not found"
    )
    decisions = wait_until(
        lambda: read_topic(kafka_bootstrap, stream_names.decisions),
        60,
        interval_s=0.5,
        description="the block of carol",
    )
    decision = orjson.loads(decisions[0].value)
    assert (decision["action"], decision["count"]) == ("block", 5)
    assert worker.metric('authpipe_dead_letters_total{reason="undecodable_batch"}') == 3
    assert worker.metric("authpipe_events_total") == 5

    worker.kill()
    restarted = start_worker(workers, worker_env, tmp_path, PYTHONPATH=str(hidden)).wait_ready()
    kcat_produce(kafka_bootstrap, stream_names.input, failures(8, 1, "carol"), "none")
    wait_until(
        lambda: restarted.metric("authpipe_events_total") == 1,
        60,
        interval_s=0.5,
        description="the restarted worker to count the next event",
    )
    assert restarted.metric("authpipe_dead_letters_total") == 0
    assert len(read_topic(kafka_bootstrap, stream_names.dlq)) == 1
    assert {m.partition for m in read_topic(kafka_bootstrap, stream_names.input)} == {partition}
