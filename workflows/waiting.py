"""Waiting in workflow code."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow


async def wait_until(condition: Callable[[], bool], limit: timedelta | None) -> bool:
    """Wait for `condition` at most `limit` (None: forever); True when it holds."""
    try:
        await workflow.wait_condition(condition, timeout=limit)
    except TimeoutError:  # wait_condition raises on timeout; callers branch on the result
        return condition()
    return True
