"""Burst admission (issue 18): many clients resetting and submitting at the same moment through
one gateway are all admitted, and none of them sees an error, not even one its retry would hide.

Before the worker's tuning and sandbox fix, a burst of 50 in the all-in-one server timed out
workflow tasks in a loop: clients got FAILED_PRECONDITION (as UNAVAILABLE, re-sent by
`PostTrainEnv` hundreds of times) and none was admitted within minutes. `bench/burst.py`
measures 50 and 200 in both production shapes.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from openenv.core.env_server.mcp_types import CallToolAction

from posttrain_common.contracts.jobs import JobRole
from posttrain_env import PostTrainEnv
from tests.gateway.conftest import QUICK
from tests.gateway.server import ServerProcess

BURST = 50
SUBMIT = {"script": "RUN_LONG = 1\n", "flavor": "cpu-basic", "timeout_minutes": 5}
# Long calls are fine (docs/concepts.md); a reply this late would be a timeout the client sees.
MESSAGE_TIMEOUT_S = 300


class Resends(logging.Handler):
    """`PostTrainEnv`'s "re-sending" records: requests the client had to send again."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "re-sending" in record.getMessage():
            self.seen.append(record.getMessage())


async def admit(env: PostTrainEnv) -> str:
    """Reset and submit one job; the job's id, or what went wrong as the client saw it."""
    try:
        await env.reset(task_id="t0_artifact")
        submitted = await env.step(CallToolAction(tool_name="jobs_submit", arguments=SUBMIT))
    except Exception as exc:  # every failure a client sees is what the test counts
        return f"error: {type(exc).__name__}: {exc}"
    data = submitted.observation.result["data"]
    return f"error: jobs_submit answered {data['error']}" if "error" in data else data["job_id"]


async def burst(base_url: str) -> list[str]:
    envs = [PostTrainEnv(base_url, message_timeout_s=MESSAGE_TIMEOUT_S) for _ in range(BURST)]
    try:
        # Sessions and sockets first, so that the burst is the resets and submits alone.
        await asyncio.gather(*(env._connect_async() for env in envs))
        return await asyncio.gather(*(admit(env) for env in envs))
    finally:
        for env in envs:  # drop the sockets; closing would end the episodes one by one
            env._drop_socket()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_burst_of_50_concurrent_resets_and_submits_through_one_gateway_has_no_client_error(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path / "state", scenario=QUICK)
    server.start()
    resends = Resends()
    client_log = logging.getLogger("posttrain_env.client")
    client_log.addHandler(resends)
    client_log.setLevel(logging.INFO)
    try:
        answers = asyncio.run(burst(server.base_url))
        errors = [answer for answer in answers if answer.startswith("error")]
        assert errors == [], errors[:5]
        # Not hidden by the client's retry either: every request was answered the first time.
        assert resends.seen == [], resends.seen[:5]
        assert len(answers) == BURST
        # Each client's job exists once in the backend: 50 jobs, no duplicate from a re-send.
        assert len(server.requests(JobRole.agent)) == BURST
    finally:
        client_log.removeHandler(resends)
        server.stop()
