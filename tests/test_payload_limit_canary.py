"""The canary of the payload-limit check: a payload over Temporal's limit, sent on purpose to a
real dev server, is seen by the same check every test runs (tests/conftest.py), and by the
check of the server processes' logs (tests/gateway/server.py)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest
from temporalio import workflow
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from posttrain_env.entrypoints.temporal_client import core_runtime
from posttrain_env.limits import TEMPORAL_PAYLOAD_LIMIT_BYTES
from tests.conftest import binary
from tests.payload_limits import payload_limit_violations


@workflow.defn(sandboxed=False)
class Swallow:
    def __init__(self) -> None:
        self._done = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._done)

    @workflow.update
    def put(self, text: str) -> int:
        return len(text)


@pytest.mark.payload_limit_canary
async def test_the_check_sees_a_payload_over_temporals_limit(core_log: Any) -> None:
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=binary("temporal"),
        runtime=core_runtime(),
    )
    async with env:
        queue = f"canary-{uuid.uuid4().hex[:8]}"
        async with Worker(env.client, task_queue=queue, workflows=[Swallow]):
            handle = await env.client.start_workflow(Swallow.run, id=queue, task_queue=queue)
            assert await handle.execute_update(Swallow.put, "small") == 5
            update = asyncio.ensure_future(
                handle.execute_update(Swallow.put, "x" * (TEMPORAL_PAYLOAD_LIMIT_BYTES + 100_000))
            )
            for _ in range(200):
                if payload_limit_violations(core_log.lines):
                    break
                await asyncio.sleep(0.05)
            update.cancel()
            await handle.terminate("canary over")
            with contextlib.suppress(BaseException):
                await update  # cancelled: its error is retrieved, not left unread
    violations = payload_limit_violations(core_log.lines)
    assert violations and "2097152" in violations[0]
