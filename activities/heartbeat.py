"""Heartbeats for activities that wait on something else (another service, the jobs backend),
so that a worker killed mid-call is noticed within the caller's heartbeat timeout instead of
the call's whole start-to-close timeout.

The SDK sends at most one heartbeat per 80 % of the heartbeat timeout and drops the rest, so
beating every few seconds costs the Temporal server one call per attempt that lasts that long;
an attempt shorter than `first_after_s` costs none.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity


@contextlib.asynccontextmanager
async def heartbeating(every_s: float, first_after_s: float = 0.0) -> AsyncIterator[None]:
    """Heartbeat every `every_s` while the block runs, the first after `first_after_s`. Outside
    an activity (an activity method called as a plain method) it does nothing."""

    async def beat() -> None:
        await asyncio.sleep(first_after_s)
        while True:
            activity.heartbeat()
            await asyncio.sleep(every_s)

    if not activity.in_activity():
        yield
        return
    beating = asyncio.create_task(beat())
    try:
        yield
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
