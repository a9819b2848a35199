"""The canaries of the payload-limit check: a payload over Temporal's limit, sent on purpose, is
seen by the same checks every test runs: the in-process one (tests/conftest.py, a worker in the
test's process on a real dev server), and the one of the log of every server or worker process a
test starts (tests/payload_limits.py, a real `posttrain-env server`)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from posttrain_common.contracts.episode_calls import ToolCall
from posttrain_env.limits import TEMPORAL_PAYLOAD_LIMIT_BYTES
from posttrain_server.temporal.client import core_runtime
from tests.conftest import binary
from tests.gateway.mcp_helpers import create_episode
from tests.gateway.server import ServerProcess
from tests.payload_limits import payload_limit_violations, violations_in
from tests.startup import DEV_SERVER_STARTUP
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import episode_workflow_id


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
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
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


@pytest.mark.payload_limit_canary
async def test_the_server_log_check_sees_a_payload_over_temporals_limit(tmp_path: Path) -> None:
    """An update too large for Temporal, sent to an episode of a real server past the gateway's
    guard: the server's worker logs the refusal, and the check of its log (which stopping and
    killing every test server runs) fails on it."""
    server = ServerProcess(tmp_path / "server")
    server.start()
    try:
        episode = await create_episode(server)
        client = await Client.connect(
            server.temporal_address, data_converter=pydantic_data_converter
        )
        handle = client.get_workflow_handle_for(
            EpisodeWorkflow.run, episode_workflow_id(episode["episode_id"])
        )
        script = "x" * (TEMPORAL_PAYLOAD_LIMIT_BYTES + 100_000)
        call = ToolCall(request_id="canary", tool="jobs_submit", arguments={"script": script})
        update = asyncio.ensure_future(
            handle.execute_update(
                EpisodeWorkflow.call_tool, call, id=f"{episode['episode_id']}:canary"
            )
        )
        for _ in range(600):  # two minutes, on a loaded machine
            if violations_in(server.log_path):
                break
            await asyncio.sleep(0.2)
        update.cancel()
        with contextlib.suppress(BaseException):
            await update  # cancelled: its error is retrieved, not left unread
        await handle.terminate("canary over")
        assert "2097152" in violations_in(server.log_path)[0]
    finally:
        with pytest.raises(AssertionError, match="a payload over Temporal's limit"):
            server.stop()
