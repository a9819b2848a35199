"""Long tool calls over real HTTP: past openenv-core's 30 s cut-off and the 15 s stream ping.
In a file of its own so that it runs beside the restart tests, not after them."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from tests.gateway.server import ServerProcess, wait_until_ended

SUBMIT = {"script": "print('training')\n", "flavor": "cpu-basic", "timeout_minutes": 5}


@pytest.mark.slow  # minutes of real turns, jobs or recordings: the slow set
@pytest.mark.timeout(600)
def test_a_40_s_jobs_wait_and_a_60_s_grading_complete_without_any_timeout(
    make_server: Callable[[FakeScenario], ServerProcess],
) -> None:
    """Past openenv-core's 30 s cut-off and the 15 s stream ping: one call may take minutes."""
    server = make_server(
        FakeScenario(
            jobs=[
                FakeJobScript(role=JobRole.grader, queue_s=0, run_s=60, score=0.9),
                FakeJobScript(queue_s=0, run_s=40),
            ]
        )
    )
    server.start()
    with MCPToolClient(base_url=server.base_url, message_timeout_s=3600).sync() as env:
        env.reset(task_id="t0_artifact")
        job = env.step(CallToolAction(tool_name="jobs_submit", arguments=SUBMIT))
        job_id = job.observation.result["data"]["job_id"]
        started = time.monotonic()
        _waited, states = wait_until_ended(env, job_id)
        assert states[-1] == "succeeded" and time.monotonic() - started >= 38
        started = time.monotonic()
        final = env.step(CallToolAction(tool_name="submit", arguments={"job_id": job_id}))
        assert time.monotonic() - started >= 55
    assert final.done is True and final.reward == 0.9
