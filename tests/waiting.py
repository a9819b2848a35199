"""Waiting in tests: on a condition, with a timeout, never for a guessed while.

`wait_until` (sync tests) and `eventually` (async tests) look at `check` until it holds and fail
naming `what` once `timeout_s` has passed. The pause between two looks is pacing, not a wait:
how long a test takes depends on when the condition holds, not on a sleep.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# How long a test waits for a real server's progress (a dev server's workflow tasks and
# activities, a worker's Schedule, a gateway's listing) that takes seconds on an idle machine.
# Beside 16 busy processes (scripts/ci-under-load) waits of 30 and 60 s ran out while the product
# did its work, only later. How fast it progresses is not these tests' subject (bench/ measures
# it), so the wait is generous: a passing test takes only as long as the condition does.
PROGRESS_S = 240.0


def wait_until(
    check: Callable[[], T | None], timeout_s: float, what: str, *, every_s: float = 0.05
) -> T:
    """The first truthy value `check()` returns; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


async def eventually(
    check: Callable[[], Awaitable[object]] | Callable[[], object],
    timeout_s: float,
    what: str,
    *,
    every_s: float = 0.1,
) -> None:
    """Return once `check()` (awaited if it is a coroutine function) is truthy; AssertionError
    naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(every_s)
