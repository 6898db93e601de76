"""Polling helpers: wait on a condition with a timeout instead of sleeping a fixed time.

Both return the predicate's first truthy value and raise AssertionError on timeout, with
the description and the last value seen, so a failing test says what it waited for.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

DEFAULT_INTERVAL_S = 0.05


def _timeout_error(description: str, timeout_s: float, last: object) -> AssertionError:
    return AssertionError(
        f"timed out after {timeout_s:g}s waiting for {description}; last: {last!r}"
    )


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    description: str = "the condition",
) -> T:
    """Call ``predicate`` every ``interval_s`` until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timeout_error(description, timeout_s, value)
        time.sleep(interval_s)


@overload
async def wait_until_async(
    predicate: Callable[[], Awaitable[T]],
    timeout_s: float,
    *,
    interval_s: float = ...,
    description: str = ...,
) -> T: ...


@overload
async def wait_until_async(
    predicate: Callable[[], T],
    timeout_s: float,
    *,
    interval_s: float = ...,
    description: str = ...,
) -> T: ...


async def wait_until_async(
    predicate: Callable[[], Any],
    timeout_s: float,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    description: str = "the condition",
) -> Any:
    """Async twin of ``wait_until``; ``predicate`` may be a plain or an async callable."""
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = predicate()
        value = await outcome if inspect.isawaitable(outcome) else outcome
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timeout_error(description, timeout_s, value)
        await asyncio.sleep(interval_s)
