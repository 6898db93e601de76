"""``authpipe sink``: run the ClickHouse sink until SIGTERM or SIGINT.

Crash tests (``tests/integration/test_audit_sink.py``) start the command with
``AUTHPIPE_FAULT_SINK_KILL_AFTER_INSERTS=N``: the process then SIGKILLs itself right
after its N-th successful non-empty insert, before the next commit. That variable is
read here, in the command, and nowhere else; the sink itself takes the hook as its
``after_insert`` argument. It is for tests only: never set it in a deployment.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Final

from pipeline.logs import get_logger
from pipeline.runtime import tune_gc
from pipeline.settings import Settings
from pipeline.sinks.loop import ClickHouseSink
from pipeline.sinks.plan import SinkError
from pipeline.sinks.writer import AfterInsert

log = get_logger("sink")

TEST_KILL_AFTER_INSERTS_ENV: Final = "AUTHPIPE_FAULT_SINK_KILL_AFTER_INSERTS"


def kill_after_inserts(count: int) -> AfterInsert:
    """A hook that SIGKILLs this process once ``count`` inserts succeeded (tests only)."""

    def after_insert(inserts: int, token: str) -> None:
        if inserts >= count:
            log.warning("sink_fault_kill", inserts=inserts, token=token)
            os.kill(os.getpid(), signal.SIGKILL)

    return after_insert


def _test_hook() -> AfterInsert | None:
    text = os.environ.get(TEST_KILL_AFTER_INSERTS_ENV, "") or "0"
    if not (text.isascii() and text.isdigit()):
        raise SinkError(
            f"{TEST_KILL_AFTER_INSERTS_ENV}={text[:20]!r} is not a whole number; it is a test "
            "hook (SIGKILL after N inserts): unset it"
        )
    count = int(text)
    return kill_after_inserts(count) if count > 0 else None


def run_sink(settings: Settings, *, after_insert: AfterInsert | None = None) -> int:
    """``authpipe sink``: run until SIGTERM or SIGINT; returns the exit code.
    ``after_insert`` defaults to the test hook of the environment (module docstring).

    The cycle collector is tuned as in the worker (``pipeline.runtime``): the sink holds
    up to ``BUFFER_FACTOR * flush_rows`` decoded rows (a list each), and encoding an
    insert allocates a column list per column, so CPython's default thresholds walk those
    rows again and again: 40 % of clickhouse-connect's encoding time per row in
    ``bench.bench_sink``.
    """
    tune_gc()
    hook = after_insert if after_insert is not None else _test_hook()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await ClickHouseSink(settings, after_insert=hook).run(stop)

    asyncio.run(main())
    return 0
