"""A worker's full garbage collections on a schedule of its own, instead of Python's.

A worker keeps every open workflow it runs in memory (`max_cached_workflows`): about 500
objects the garbage collector tracks per workflow. Python collects its oldest generation
whenever a quarter more objects have reached it since the last time, and a new workflow
brings hundreds: in a 1000x10 campaign (bench/watch_scale.py) each of two workflow processes
stopped for a full collection every one to three minutes, 0.8 s with about 2,000 workflows
cached and 2-2.5 s with about 3,000, and every workflow task it held waited through the stop.

Here the oldest generation is collected every `every_s` instead (and never by Python's
count): the same stop, but once in `every_s`. At 10 minutes, that campaign's workflow tasks
over 1 s went from 1,485 to 209 (of about 61,000 sampled), and its p99 from 1,310 to 778 ms
(one run each). The younger generations are collected as before, so short-lived cycles are
freed as soon as ever; what waits for the next full collection is only cyclic garbage that
was old when it died (a workflow closed or evicted after living for minutes).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

log = logging.getLogger(__name__)

# Python's count of collections of the middle generation before the oldest is collected
# (`gc.set_threshold`'s third value, 10 by default), set so high it is never reached: about
# 7 billion allocations.
NEVER = 1_000_000_000


@asynccontextmanager
async def full_collections_every(every_s: float) -> AsyncIterator[None]:
    """While inside, this process collects its oldest generation every `every_s` seconds and
    only then; Python's own thresholds are put back on the way out. `every_s` 0: Python's own
    schedule, unchanged."""
    if every_s < 0:
        raise ValueError(f"full collections need a period of 0 s or more, not {every_s}")
    if every_s == 0:
        yield
        return
    young, middle, oldest = gc.get_threshold()
    gc.set_threshold(young, middle, NEVER)
    collecting = asyncio.create_task(_collect_every(every_s))
    log.info(
        "full garbage collections every %g s (POSTTRAIN_WORKER_FULL_COLLECTION_EVERY_S)", every_s
    )
    try:
        yield
    finally:
        collecting.cancel()
        gc.set_threshold(young, middle, oldest)


async def _collect_every(every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        began = time.perf_counter()
        freed = gc.collect()
        log.debug(
            "full collection: %d objects freed in %.0f ms",
            freed,
            (time.perf_counter() - began) * 1000,
        )
