"""The one way the backend calls the (synchronous) Hub client: in a pool of its own threads, each
call under a budget that ends before its activity does, errors translated.

A Temporal activity that times out or is cancelled stops awaiting, but a thread cannot be
stopped: without a budget its request would go on, and a job-creation request that completed
after the retry had started a job would start a second, paid one. So every call gets a
`CallBudget` (what is left of the activity's start-to-close timeout, counted from the
attempt's start, minus a margin; HUB_CALL_TIMEOUT_S outside an activity) that
`activities/backends/hf/http.py` enforces on each of its requests, and a cancelled activity marks
its
call abandoned so that no further request of it starts.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from temporalio import activity

from activities.backends.hf.attempt_clock import attempt_started
from activities.backends.hf.errors import TRANSLATED, translate
from activities.backends.hf.http import (
    CURRENT_BUDGET,
    CallBudget,
    HubDeadlineExceeded,
    HubHttpLimits,
)

T = TypeVar("T")


# Activity attempts whose start this worker remembers (a few seconds each; oldest forgotten).
_REMEMBERED_ATTEMPTS = 4096


class HubCalls:
    def __init__(self, limits: HubHttpLimits | None = None) -> None:
        self.limits = limits or HubHttpLimits()
        self._pool = ThreadPoolExecutor(
            max_workers=self.limits.threads, thread_name_prefix="hf-hub"
        )
        self._attempt_started: OrderedDict[tuple[bytes, int], float] = OrderedDict()

    def call_seconds(self) -> float:
        """How long a call that starts now may take. Inside an activity: what is left of its
        start-to-close timeout, less the margin, measured on this worker's own clock from the
        attempt's start (`activities/backends/hf/attempt_clock.py`; the margin covers the moments
        between the server's start of the attempt and ours). On a worker without the attempt
        clock (a test's bare worker) it is measured from the attempt's first Hub call, which
        leaves out the work done before it. Outside an activity: HUB_CALL_TIMEOUT_S."""
        limits = self.limits
        if not activity.in_activity():
            return limits.call_s
        info = activity.info()
        if info.start_to_close_timeout is None:
            return limits.call_s
        now = time.monotonic()
        started = attempt_started()
        if started is None:
            attempt = (info.task_token, info.attempt)
            started = self._attempt_started.setdefault(attempt, now)
            self._attempt_started.move_to_end(attempt)
            while len(self._attempt_started) > _REMEMBERED_ATTEMPTS:
                self._attempt_started.popitem(last=False)
        left = info.start_to_close_timeout.total_seconds() - (now - started)
        return max(0.0, left - limits.activity_margin_s)

    async def call(
        self,
        doing: str,
        fn: Callable[..., T],
        /,
        *args: object,
        keep: tuple[type[Exception], ...] = (),
        in_namespace: str | None = None,
        **kwargs: object,
    ) -> T:
        """`fn(*args, **kwargs)` in a Hub thread under a budget. Errors are translated
        (`activities.backends.hf.errors.translate`, naming `in_namespace` or the call's `namespace`)
        except those of the `keep` types, which the caller handles itself."""
        where = in_namespace or kwargs.get("namespace")
        return await self._run(doing, lambda: fn(*args, **kwargs), keep, where)

    async def listing(
        self,
        doing: str,
        fn: Callable[..., Iterable[T]],
        /,
        *args: object,
        keep: tuple[type[Exception], ...] = (),
        in_namespace: str | None = None,
        **kwargs: object,
    ) -> list[T]:
        """As `call`, for listings: the iterable is consumed inside the thread, since its pages
        (and a log stream's events) are requests too."""
        where = in_namespace or kwargs.get("namespace")
        return await self._run(doing, lambda: list(fn(*args, **kwargs)), keep, where)

    async def _run(
        self,
        doing: str,
        thunk: Callable[[], T],
        keep: tuple[type[Exception], ...],
        namespace: object,
    ) -> T:
        budget = CallBudget(deadline=time.monotonic() + self.call_seconds())

        def in_thread() -> T:
            CURRENT_BUDGET.set(budget)  # in a copy of the caller's context: never leaks
            return thunk()

        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        # Awaited until the deadline and a little more (half the activity's margin, so still
        # before the activity's own timeout): the transport ends its own requests at the
        # deadline, with its own error; what it does not reach (hf_xet's upload of a job's
        # script, with a client, timeouts and retries of its own) is not awaited past it.
        grace = self.limits.activity_margin_s / 2
        running = loop.run_in_executor(self._pool, context.run, in_thread)
        try:
            done, _ = await asyncio.wait({running}, timeout=max(0.0, budget.remaining()) + grace)
            if not done:
                # The thread goes on until that client returns, but starts no Hub request
                # after this (BoundedTransport refuses it): no job is created after the
                # deadline. Its result, when it comes, is dropped.
                budget.ran_out = True
                running.cancel()
                raise HubDeadlineExceeded(
                    f"{doing}: the call's time ran out in work outside our HTTP client "
                    "(such as hf_xet's upload of the job's script)"
                )
            return running.result()
        except asyncio.CancelledError:
            budget.cancelled.set()  # the thread's next request, or next chunk, stops it
            running.cancel()  # its result, when it comes, is dropped
            raise
        except TRANSLATED as err:
            if keep and isinstance(err, keep):
                raise
            where = namespace if isinstance(namespace, str) else None
            raise translate(err, doing, where) from None
