"""Ingest's backpressure: it waits while the account stage here is too far behind it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pipeline.core.policy import DEFAULT_POLICY
from pipeline.settings import Settings, WorkerSettings
from pipeline.stream import ingest_loop
from pipeline.stream.ingest import Ingest
from pipeline.stream.ingest_loop import IngestLoop, envelopes_ahead
from pipeline.stream.metrics import WorkerMetrics
from pipeline.topics import Topics


async def _never(*args: Any) -> Any:
    raise AssertionError("the hold sends nothing")


def _loop(applied: Any, limit: int = 4) -> IngestLoop:
    settings = Settings(
        worker=WorkerSettings(ingest_ahead_max_envelopes=limit, batch_max_wait_ms=1)
    )
    return IngestLoop(
        settings,
        Topics.from_settings(settings.kafka),
        Ingest.from_settings(settings, DEFAULT_POLICY),
        WorkerMetrics(),
        send_envelope=_never,
        send_dead=_never,
        applied=applied,
    )


def _held_s(loop: IngestLoop) -> float:
    return loop.metrics.ingest_held_seconds_total._value.get()  # type: ignore[no-any-return]


def test_envelopes_ahead_counts_only_partitions_the_stage_here_owns() -> None:
    """Sent-but-unapplied envelopes summed over owned partitions; others and caught-up ones add 0."""
    applied = {0: 10, 1: 7, 2: None, 3: 12}
    sent_next = {0: 15, 1: 7, 2: 40, 3: 11}
    assert envelopes_ahead(sent_next, applied.get) == 5
    assert envelopes_ahead({}, applied.get) == 0


def test_hold_returns_at_once_at_the_limit() -> None:
    """Exactly the limit ahead: no wait, nothing counted."""
    loop = _loop({0: 0}.get, limit=4)
    loop.sent_next = {0: 4}
    asyncio.run(loop._hold())
    assert _held_s(loop) == 0.0


def test_hold_waits_until_the_stage_catches_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the limit: ingest waits, and reads again as soon as the stage is within it."""
    monkeypatch.setattr(ingest_loop, "HOLD_MAX_MS", 60_000)
    expected = {0: 0}
    loop = _loop(expected.get, limit=4)
    loop.sent_next = {0: 9}

    async def scenario() -> bool:
        hold = asyncio.create_task(loop._hold())
        await asyncio.sleep(0)  # the hold starts waiting
        expected[0] = 2  # 7 ahead: still held
        loop.stage_progressed()
        await asyncio.sleep(0)
        still_held = not hold.done()
        expected[0] = 5  # 4 ahead: released
        loop.stage_progressed()
        await asyncio.wait_for(hold, 5)
        return still_held

    assert asyncio.run(scenario()) is True
    assert _held_s(loop) > 0.0


def test_hold_gives_up_after_hold_max_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage that never catches up holds ingest for HOLD_MAX_MS, then ingest reads on."""
    monkeypatch.setattr(ingest_loop, "HOLD_MAX_MS", 50)
    loop = _loop({0: 0}.get, limit=4)
    loop.sent_next = {0: 100}
    started = time.monotonic()
    asyncio.run(loop._hold())
    waited_s = time.monotonic() - started
    assert 0.05 <= waited_s < 1.0
    assert _held_s(loop) >= 0.05


def test_limit_zero_never_holds() -> None:
    """ingest_ahead_max_envelopes=0 turns the backpressure off."""
    loop = _loop({0: 0}.get, limit=0)
    loop.sent_next = {0: 1_000}
    asyncio.run(loop._hold())
    assert _held_s(loop) == 0.0


def test_the_setting_rejects_negative_limits() -> None:
    """A negative limit is a configuration error naming the field."""
    with pytest.raises(ValueError, match="ingest_ahead_max_envelopes"):
        WorkerSettings(ingest_ahead_max_envelopes=-1)
