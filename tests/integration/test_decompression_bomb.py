"""A decompression bomb on the input topic (issue 26 item 4): a producer allowed to write
the input sends small compressed batches that inflate to hundreds of MiB (Debian's kcat,
as a real librdkafka producer would). The worker dead-letters each such batch as
``oversize`` (offset range, empty value: the bytes stay in the input topic), its peak
memory stays bounded, and the events after the bomb are still counted."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.test_compression import kcat_produce
from tests.plugins.waiting import wait_until
from tests.plugins.worker import StreamNames, ensure_stream_topics, event, read_topic, start_worker

pytestmark = pytest.mark.integration

BOMB_MIB = 64  # each bomb message inflates to this much
BOMBS = 8  # 512 MiB inflated in all, about 64 KiB (gzip) or less (zstd) on the wire
PEAK_LIMIT_KIB = 400 * 1024  # the worker's peak resident memory (VmHWM) must stay under


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set size (VmHWM) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def kcat_bombs(bootstrap: str, topic: str, codec: str, tmp_path: Path) -> None:
    """``BOMBS`` messages of ``BOMB_MIB`` MiB each (one repeated letter in a JSON object),
    one batch each: kcat sends each file it is given as one message (librdkafka's
    message.max.bytes raised, as an attacker would)."""
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is missing: run `bash scripts/setup` (installs Debian's kcat)"
    bomb = tmp_path / "bomb.json"
    bomb.write_bytes(b'{"pad":"' + b"a" * (BOMB_MIB * 1024 * 1024) + b'"}')
    done = subprocess.run(
        [kcat, "-P", "-b", bootstrap, "-t", topic, "-z", codec, "-k", "bomb",
         "-X", "message.max.bytes=1000000000", "-X", "acks=all", *[str(bomb)] * BOMBS],
        capture_output=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_a_decompression_bomb_is_dead_lettered_oversize_and_memory_stays_bounded(
    kafka_bootstrap: str,
    stream_names: StreamNames,
    worker_env: dict[str, str],
    workers: list[Any],
    tmp_path: Path,
    codec: str,
) -> None:
    """Eight 64 MiB messages compressed to a few KiB each, then five failures: every bomb
    batch is one ``oversize`` dead letter with an empty value, the five failures block
    their (account, source), and the worker's peak memory stays under 400 MiB."""
    ensure_stream_topics(kafka_bootstrap, stream_names)
    worker = start_worker(workers, worker_env, tmp_path).wait_ready()
    assert worker.proc is not None
    kcat_bombs(kafka_bootstrap, stream_names.input, codec, tmp_path)
    now = datetime.now(UTC)
    failures = [
        event(i, now + timedelta(milliseconds=i), "after-bomb", "203.0.113.50", run=codec)
        for i in range(5)
    ]
    kcat_produce(kafka_bootstrap, stream_names.input, failures, codec)

    def blocked() -> dict[str, Any] | None:
        assert worker.proc is not None and worker.proc.poll() is None, worker.log_tail()
        for m in read_topic(kafka_bootstrap, stream_names.decisions):
            decision = orjson.loads(m.value) if m.value else None
            if decision and decision["rule"] == "account_source":
                return dict(decision)
        return None

    decision = wait_until(blocked, 120, interval_s=0.5, description="the block after the bomb")
    assert (decision["source"], decision["count"]) == ("203.0.113.50", 5)
    dlq = read_topic(kafka_bootstrap, stream_names.dlq)
    headers = [dict(m.headers) for m in dlq]
    assert {h["error"] for h in headers} == {b"oversize"}
    assert [m.value for m in dlq] == [b""] * len(dlq)
    covered = sum(
        int(h.get("source_offset_last", h["source_offset"])) - int(h["source_offset"]) + 1
        for h in headers
    )
    assert covered == BOMBS
    peak = peak_rss_kib(worker.proc.pid)
    print(f"codec={codec} worker peak RSS {peak / 1024:.0f} MiB")
    assert peak < PEAK_LIMIT_KIB
