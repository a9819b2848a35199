"""Waiting on a Temporal Schedule in tests: until it exists, and for its first run's result."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio.client import Client, ScheduleActionExecutionStartWorkflow, ScheduleHandle
from temporalio.service import RPCError

from tests.waiting import eventually

T = TypeVar("T")


async def once_it_answers(probe: Callable[[], Awaitable[T]], timeout_s: float = 20.0) -> T:
    """`probe()`'s answer once it stops failing with an RPCError (the schedule is created by a
    task of the worker's start: it may not exist yet); its RPCError after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await probe()
        except RPCError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)  # pacing between two probes


async def first_run(client: Client, schedule: ScheduleHandle, result_type: type[T]) -> T:
    """The result of the first workflow the schedule started (one is started within 30 s)."""
    started: list[str] = []

    async def run_started() -> bool:
        for action in (await schedule.describe()).info.recent_actions:
            if isinstance(action.action, ScheduleActionExecutionStartWorkflow):
                started.append(action.action.workflow_id)
                return True
        return False

    await eventually(run_started, 30, "the schedule to start a run", every_s=0.2)
    return await client.get_workflow_handle(started[0], result_type=result_type).result()
