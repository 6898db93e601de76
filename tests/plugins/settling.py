"""Waiting for the worker to finish: no internal lag, and its outputs no longer growing.

``wait_for_outputs`` polls once a second until the worker's internal topics (the account,
source and tenant-share repartitions) have nothing uncommitted AND the summed end offsets of
the given output topics have kept one value for ``QUIET_S`` seconds; it raises
AssertionError after ``SETTLE_TIMEOUT_S`` that says which internal partitions still lagged
(and by how much) or how the outputs last moved, so a timeout in CI can be told apart. Each probe opens and closes its own aiokafka
clients, so nothing is left running between polls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.plugins.waiting import wait_until
from tests.plugins.worker import StreamNames

SETTLE_TIMEOUT_S = 240.0
QUIET_S = 6.0
INTERNAL_TOPICS = ("attempts-by-account", "attempts-by-source", "tenant-shares")


def end_offsets(bootstrap: str, topics: list[str]) -> int:
    """The sum of the end offsets of every partition of ``topics``."""

    async def run() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            await consumer._client.force_metadata_update()
            tps = [
                TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or ()
            ]
            return sum((await consumer.end_offsets(tps)).values()) if tps else 0
        finally:
            await consumer.stop()

    return asyncio.run(run())


def internal_lags(bootstrap: str, names: StreamNames) -> dict[str, int]:
    """Per lagging partition (``topic[partition]``) of the worker's internal topics, the
    messages its agents have not committed yet; empty when none lags."""
    internal = [f"{names.app_id}.{t}" for t in INTERNAL_TOPICS]

    async def run() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await admin.start()
        await consumer.start()
        try:
            await consumer._client.force_metadata_update()
            tps = [
                TopicPartition(t, p)
                for t in internal
                for p in consumer.partitions_for_topic(t) or ()
            ]
            ends = await consumer.end_offsets(tps)
            committed = await admin.list_consumer_group_offsets(names.app_id, partitions=tps)
            lags = {
                f"{tp.topic}[{tp.partition}]": end
                - (committed[tp].offset if tp in committed and committed[tp].offset >= 0 else 0)
                for tp, end in ends.items()
            }
            return {name: lag for name, lag in lags.items() if lag}
        finally:
            await consumer.stop()
            await admin.close()

    return asyncio.run(run())


def settled(probe: Callable[[], Any], quiet_s: float) -> Callable[[], bool]:
    """True once ``probe()`` has kept one value (other than None) for ``quiet_s`` seconds."""
    state: dict[str, Any] = {"value": object(), "since": time.monotonic()}

    def check() -> bool:
        value = probe()
        if value is None or value != state["value"]:
            state["value"], state["since"] = value, time.monotonic()
            return False
        return time.monotonic() - state["since"] >= quiet_s

    return check


def wait_for_outputs(
    bootstrap: str,
    names: StreamNames,
    outputs: list[str],
    description: str,
    caught_up: Callable[[], bool] | None = None,
) -> None:
    """Until the worker's internal topics have no lag (and ``caught_up()``, when given, is
    true) and the end offsets of ``outputs`` have not moved for ``QUIET_S`` seconds (polled
    every second, at most ``SETTLE_TIMEOUT_S``)."""

    seen: dict[str, Any] = {"last": "nothing probed"}
    moves: list[tuple[float, int]] = []  # (seconds into the wait, summed end offsets)
    started = time.monotonic()

    def probe() -> int | None:
        if caught_up is not None and not caught_up():
            seen["last"] = "caught_up() false"
            return None
        lags = internal_lags(bootstrap, names)
        if lags:
            seen["last"] = f"internal lag {lags}"
            return None
        ends = end_offsets(bootstrap, outputs)
        if not moves or moves[-1][1] != ends:
            moves.append((round(time.monotonic() - started, 1), ends))
        seen["last"] = f"no internal lag; outputs' end offsets at (s, sum): {moves[-8:]}"
        return ends

    try:
        wait_until(
            settled(probe, QUIET_S), SETTLE_TIMEOUT_S, interval_s=1.0, description=description
        )
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}; last probe: {seen['last']}") from None
