"""When this worker started the current activity attempt, on its own monotonic clock.

A Hub call's budget is what is left of its activity's start-to-close timeout
(`activities/backends/hf/calls.py`). Counted from the attempt's first Hub call, it would leave out
the
work an activity does before that call (the contamination check reads the episode's trail and
scans its scripts first; the retention sweep reads its records), and a Hub request could then
outlive the attempt, overlapping the retry Temporal starts. The worker's interceptor marks
each attempt as it starts. The server's `started_time` is not used: it is on the server's
clock (and on the time-skipping test server, on skipped time), and a worker whose clock ran
ahead would shorten every budget.

Kept apart from the Hub modules so that the worker installs it without importing
huggingface_hub.
"""

from __future__ import annotations

import contextvars
import time
from typing import Any

from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

_STARTED: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "posttrain_activity_attempt_started", default=None
)


class AttemptClock(Interceptor):
    """Installed on a worker (`interceptors=[AttemptClock()]`): every activity attempt it runs
    knows when it started (`attempt_started`)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _MarkStart(next)


class _MarkStart(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        # The attempt runs in a task of its own (a copy of the worker's context), so the mark
        # is this attempt's alone, and a synchronous activity's thread gets a copy of it too.
        _STARTED.set(time.monotonic())
        return await self.next.execute_activity(input)


def attempt_started() -> float | None:
    """`time.monotonic()` when this worker began the current activity attempt; None outside
    one, or on a worker without `AttemptClock`."""
    return _STARTED.get()
