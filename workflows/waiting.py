"""Waiting in workflow code."""

from __future__ import annotations

import asyncio
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


class Alarm:
    """A timer that is never cancelled: waking early for another reason leaves it running, so
    the next wait reuses it. Cancelling a timer as a signal arrives is a race the test server
    mishandles (it rejects the workflow task, "invalid history builder state for action"), and
    an uncancelled timer also saves the cancel's history event."""

    def __init__(self) -> None:
        self._timer: asyncio.Future[None] | None = None

    async def wait(self, condition: Callable[[], bool], seconds: float) -> bool:
        """Wait for `condition` or the alarm (set `seconds` from now if none is pending);
        True when the condition holds."""
        if self._timer is None or self._timer.done():
            self._timer = asyncio.ensure_future(asyncio.sleep(seconds))
        timer = self._timer
        await workflow.wait_condition(lambda: condition() or timer.done())
        return condition()
