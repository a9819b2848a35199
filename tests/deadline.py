"""A deadline inside every async test, shorter than pytest-timeout's.

pytest-timeout ends a test that runs too long either with SIGALRM (its exception, raised inside
an event-loop callback, is swallowed by asyncio and the test hangs on) or, as configured here,
by ending the whole worker process. pytest-xdist then replaces the worker, and with
`--dist loadfile` that replacement can wedge the run (pytest-xdist#1189: a CI run hung at 96%
until its 90 minutes were up). So each async test runs under `asyncio.timeout` a little before
pytest-timeout's limit: a late test is cancelled at its own await, fails with the tasks that
were still running, its fixtures shut down, and the worker carries on. pytest-timeout stays as
the backstop for a test whose event loop itself is stuck.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import io
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

# Seconds before pytest-timeout's limit: room for the cancelled test's fixtures to shut down.
MARGIN_S = 20.0


def timeout_of(item: pytest.Item) -> float | None:
    """pytest-timeout's limit for this test (its marker, else the ini setting); None: none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    configured = item.config.getini("timeout")
    return float(configured) if configured else None


def deadline_s(timeout_s: float) -> float:
    """MARGIN_S before the timeout, or 90 % of a timeout shorter than 10 x MARGIN_S."""
    return max(timeout_s - MARGIN_S, timeout_s * 0.9)


def running_tasks() -> str:
    out = io.StringIO()
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.print_stack(limit=6, file=out)
    return out.getvalue()[-6000:]


def under_deadline(
    test: Callable[..., Awaitable[Any]], seconds: float, timeout_s: float
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(test)
    async def bounded(*args: Any, **kwargs: Any) -> Any:
        try:
            async with asyncio.timeout(seconds):
                return await test(*args, **kwargs)
        except TimeoutError:
            pytest.fail(
                f"the test ran past its deadline ({seconds:.3g} s, {timeout_s - seconds:.3g} s "
                f"before pytest-timeout's); tasks still running:\n{running_tasks()}",
                pytrace=False,
            )

    return bounded


def put_async_tests_under_deadlines(items: list[pytest.Item]) -> None:
    for item in items:
        test = getattr(item, "obj", None)
        if not inspect.iscoroutinefunction(test) or getattr(test, "is_hypothesis_test", False):
            continue
        timeout_s = timeout_of(item)
        if timeout_s:
            item.obj = under_deadline(test, deadline_s(timeout_s), timeout_s)  # type: ignore[attr-defined]
