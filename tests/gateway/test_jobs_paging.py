"""Paging through an episode's jobs over every path of the real server (embedded Temporal, the
worker, the fake backend): `jobs_status` with `limit` and `cursor` from the MCP SDK's own client
and from OpenEnv clients (the stock one, and `PostTrainEnv.iter_jobs`), and `GET
/episodes/<id>?cursor=&limit=`. Seven jobs, pages of three: each job exactly once."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient

import tasks
from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_env import PostTrainEnv
from tests.gateway.mcp_helpers import create_episode, data, mcp_session
from tests.gateway.server import ServerProcess
from tests.workflows.harness import write_task

MANY_TASK = "t_many"  # eight jobs may run at once
JOBS = 7
# Jobs that outlast the test: the seven are all live at once.
SCENARIO = FakeScenario(jobs=[FakeJobScript(queue_s=1, run_s=3600)])
SUBMIT = {"script": "print('training')\n", "flavor": "cpu-basic", "timeout_minutes": 5}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tasks_dir = tmp_path_factory.mktemp("tasks")
    shutil.copytree(Path(tasks.__file__).parent / "t0_artifact", tasks_dir / "t0_artifact")
    write_task(tasks_dir, MANY_TASK, budget_usd=10.0, max_concurrent_jobs=8)
    proc = ServerProcess(
        tmp_path_factory.mktemp("server"),
        scenario=SCENARIO,
        extra_env={"POSTTRAIN_TASKS_DIR": str(tasks_dir)},
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


async def test_an_mcp_client_pages_through_seven_jobs_three_at_a_time(
    server: ServerProcess,
) -> None:
    episode = await create_episode(server, MANY_TASK)
    async with mcp_session(episode) as session:
        started = [data(await session.call_tool("jobs_submit", SUBMIT))["job_id"] for _ in range(4)]
        listed: list[str] = []
        pages = 0
        arguments: dict[str, Any] = {"limit": 3}
        while True:
            page = data(await session.call_tool("jobs_status", arguments))
            pages += 1
            listed += [job["job_id"] for job in page["jobs"]]
            if pages == 1:  # jobs started between two pages are listed once, later
                for _ in range(JOBS - 4):
                    started.append(data(await session.call_tool("jobs_submit", SUBMIT))["job_id"])
            if page["next_cursor"] is None:
                break
            arguments = {"limit": 3, "cursor": page["next_cursor"]}
        assert listed == started and len(set(listed)) == JOBS and pages == 3
        assert page["total"] == JOBS
        bad = await session.call_tool("jobs_status", {"cursor": "not-a-cursor"})
        assert data(bad)["error"]["type"] == "invalid_argument"

    # The same pages over GET /episodes/<id> (the status query), and a cursor it never gave.
    headers = {"Authorization": f"Bearer {episode['episode_token']}"}
    url = f"{server.base_url}/episodes/{episode['episode_id']}"
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        seen: list[str] = []
        params: dict[str, Any] = {"limit": 3}
        while True:
            response = await http.get(url, params=params)
            assert response.status_code == 200, response.text
            body = response.json()
            assert len(body["jobs"]) <= 3 and body["jobs_total"] == JOBS
            seen += [job["job_id"] for job in body["jobs"]]
            if body["jobs_next_cursor"] is None:
                break
            params = {"limit": 3, "cursor": body["jobs_next_cursor"]}
        assert seen == started
        refused = await http.get(url, params={"cursor": "bm90LWEtY3Vyc29y"})
        assert refused.status_code == 400, refused.text
        assert "cursor" in refused.json()["detail"]["message"]
        too_many = await http.get(url, params={"limit": 10_000})
        assert too_many.status_code == 400 and "limit" in too_many.json()["detail"]["message"]


def test_openenv_clients_page_through_seven_jobs_three_at_a_time(server: ServerProcess) -> None:
    with MCPToolClient(base_url=server.base_url, message_timeout_s=300).sync() as env:
        env.reset(task_id=MANY_TASK)
        started = []
        for _ in range(JOBS):
            job = env.step(CallToolAction(tool_name="jobs_submit", arguments=SUBMIT))
            started.append(job.observation.result["data"]["job_id"])
        listed: list[str] = []
        arguments: dict[str, Any] = {"limit": 3}
        while True:
            step = env.step(CallToolAction(tool_name="jobs_status", arguments=arguments))
            page = step.observation.result["data"]
            listed += [job["job_id"] for job in page["jobs"]]
            if page["next_cursor"] is None:
                break
            arguments = {"limit": 3, "cursor": page["next_cursor"]}
        assert listed == started


async def test_post_train_env_iter_jobs_lists_every_job_once(server: ServerProcess) -> None:
    async with PostTrainEnv(base_url=server.base_url, message_timeout_s=300) as env:
        await env.reset(task_id=MANY_TASK)
        started = []
        for _ in range(JOBS):
            job = await env.step(CallToolAction(tool_name="jobs_submit", arguments=SUBMIT))
            started.append(job.observation.result["data"]["job_id"])
        assert [job["job_id"] async for job in env.iter_jobs(limit=3)] == started
