"""The standard MCP endpoint of an episode, `/episodes/<id>/mcp`, driven by the MCP SDK's own
client (`ClientSession` over streamable HTTP) against the real server (embedded Temporal, the
worker, the fake backend)."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import statistics
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient

import tasks
from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.tools import tool_catalog
from tests.gateway.mcp_helpers import SUBMIT, create_episode, data, mcp_session, wait_for_state
from tests.gateway.server import ServerProcess
from tests.waiting import PROGRESS_S, eventually
from tests.workflows.harness import write_task

SCENARIO = FakeScenario(
    jobs=[
        # Outlasts any test, so "still running" holds however slow a loaded machine is.
        FakeJobScript(script_contains="RUN_LONG", queue_s=1, run_s=3600),
        FakeJobScript(role=JobRole.grader, queue_s=1, run_s=2, score=0.75),
        FakeJobScript(queue_s=1, run_s=2),
    ]
)
LONG_SUBMIT = {**SUBMIT, "script": "RUN_LONG = 1\n"}
SHORT_TASK = "t_short"  # max_steps = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tasks_dir = tmp_path_factory.mktemp("tasks")
    shutil.copytree(Path(tasks.__file__).parent / "t0_artifact", tasks_dir / "t0_artifact")
    write_task(tasks_dir, SHORT_TASK, max_steps=3)
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


async def test_an_mcp_client_plays_a_whole_t0_artifact_episode(server: ServerProcess) -> None:
    episode = await create_episode(server)
    assert episode["mcp_url"] == f"{server.base_url}/episodes/{episode['episode_id']}/mcp"
    assert episode["prompt"].strip().startswith("Produce a checkpoint")
    assert "session_id" not in episode  # the token is the capability
    async with mcp_session(episode) as session:
        listed = (await session.list_tools()).tools
        assert [(t.name, t.description, t.inputSchema) for t in listed] == [
            (t["name"], t["description"], t["input_schema"]) for t in tool_catalog()
        ]
        info = await session.call_tool("task_info", {})
        assert info.isError is False and data(info)["max_steps"] == 100
        job = data(await session.call_tool("jobs_submit", SUBMIT))
        assert job["job_id"].startswith("job-") and job["state"] in {"queued", "running"}
        waits = await wait_for_state(session, job["job_id"], {"succeeded"})
        timings, states = [], set()
        for _ in range(10):
            started = time.perf_counter()
            status = await session.call_tool("jobs_status", {"job_id": job["job_id"]})
            timings.append((time.perf_counter() - started) * 1000)
            states.add(data(status)["state"])
        assert states == {"succeeded"}
        dev = data(await session.call_tool("dev_evaluate", {"job_id": job["job_id"]}))
        assert dev["score"] == 0.5, dev
        final = await session.call_tool("submit", {"job_id": job["job_id"]})
        assert final.isError is False and data(final)["score"] == 0.75, final
        assert final.meta is not None and final.meta["done"] is True
        assert "service_spend" not in final.meta  # only the step path carries spend and reward
    print(f"MCP jobs_status p50 {statistics.median(timings):.1f} ms, max {max(timings):.1f} ms")
    status = await server.episode_status(episode["episode_id"])
    assert status.end is not None and status.end.reason.value == "submitted"
    assert status.end.reward == 0.75
    assert status.steps_used == 1 + 1 + waits + 10 + 1 + 1  # every MCP call is a step


async def test_tool_errors_are_structured_content_with_is_error(server: ServerProcess) -> None:
    episode = await create_episode(server)
    async with mcp_session(episode) as session:
        refused = await session.call_tool("jobs_submit", {**SUBMIT, "flavor": "h100x8"})
        assert refused.isError is True
        assert data(refused)["error"]["type"] == "flavor_not_allowed"
        assert "cpu-basic" in data(refused)["error"]["message"]
        bad_type = await session.call_tool("jobs_submit", {**SUBMIT, "timeout_minutes": "soon"})
        assert data(bad_type)["error"]["type"] == "timeout_not_allowed"
        unknown = await session.call_tool("jobs_status", {"job_id": "job-000000000000"})
        assert data(unknown)["error"]["type"] == "unknown_job"
        no_tool = await session.call_tool("train_for_me", {})
        assert no_tool.isError is True and data(no_tool)["error"]["type"] == "invalid_argument"
        assert no_tool.meta is not None and no_tool.meta["steps_used"] == 4  # errors are steps


async def test_a_call_resent_with_the_same_meta_request_id_runs_once(
    server: ServerProcess,
) -> None:
    episode = await create_episode(server)
    async with mcp_session(episode) as session:
        first = await session.call_tool("jobs_submit", SUBMIT, meta={"request_id": "sub-1"})
        again = await session.call_tool("jobs_submit", SUBMIT, meta={"request_id": "sub-1"})
        assert data(first) == data(again)
        other = await session.call_tool("jobs_status", {}, meta={"request_id": "x" * 300})
        assert data(other)["error"]["type"] == "invalid_argument"
    status = await server.episode_status(episode["episode_id"])
    assert status.steps_used == 1 and len(status.jobs) == 1


async def test_progress_notifications_arrive_during_a_long_jobs_wait(
    server: ServerProcess,
) -> None:
    episode = await create_episode(server)
    seen: list[tuple[float, float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((time.monotonic(), progress, message))

    # The wait lasts its whole timeout on a job that outlasts it: a job that ended within
    # the wait could end before a loaded machine first sees it running, and nothing would
    # be left to wait for.
    async with mcp_session(episode) as session:
        job = data(await session.call_tool("jobs_submit", LONG_SUBMIT))
        await wait_for_state(session, job["job_id"], {"running"})
        started = time.monotonic()
        done = await session.call_tool(
            "jobs_wait", {"job_id": job["job_id"], "timeout_s": 25}, progress_callback=on_progress
        )
        ended = time.monotonic()
    assert data(done)["state"] == "running" and data(done)["changed"] is False
    assert ended - started > 20  # the wait ran to its 25 s timeout
    assert len(seen) >= 2, seen
    marks = [started, *(at for at, _, _ in seen), ended]
    assert max(b - a for a, b in itertools.pairwise(marks)) <= 10.0, marks
    assert [p for _, p, _ in seen] == sorted(p for _, p, _ in seen)
    assert all(m and m.startswith("jobs_wait is running") for _, _, m in seen)


async def test_a_disconnect_in_the_middle_of_jobs_wait_loses_nothing(
    server: ServerProcess,
) -> None:
    episode = await create_episode(server)
    async with mcp_session(episode) as session:
        job = data(await session.call_tool("jobs_submit", LONG_SUBMIT))
        calls = 1 + await wait_for_state(session, job["job_id"], {"running"})

    async def wait_then_vanish() -> None:
        async with mcp_session(episode) as session:
            await session.call_tool("jobs_wait", {"job_id": job["job_id"], "timeout_s": 120})

    waiting = asyncio.create_task(wait_then_vanish())

    async def waiting_in_the_episode() -> bool:  # the wait is a step from when it starts
        return (await server.episode_status(episode["episode_id"])).steps_used == calls + 1

    await eventually(waiting_in_the_episode, PROGRESS_S, "the episode to start the jobs_wait")
    assert not waiting.done()
    waiting.cancel()  # the client goes away mid-call
    with suppress(asyncio.CancelledError):
        await waiting
    calls += 1

    async with mcp_session(episode) as session:
        still = data(await session.call_tool("jobs_status", {"job_id": job["job_id"]}))
        assert still["state"] == "running"  # the job did not notice
        calls += 1
        # The job is still the one and only, and a new jobs_wait just works.
        waited = data(
            await session.call_tool("jobs_wait", {"job_id": job["job_id"], "timeout_s": 1})
        )
        assert waited["job_id"] == job["job_id"] and waited["state"] == "running"
        calls += 1
    status = await server.episode_status(episode["episode_id"])
    assert status.steps_used == calls  # the dropped call counted once, nothing twice
    assert [j["state"] for j in status.jobs] == ["running"]
    mine = [r for r in server.requests(JobRole.agent) if r.episode_id == episode["episode_id"]]
    assert len(mine) == 1
    assert "Traceback" not in server.log()


async def test_reaching_max_steps_through_mcp_ends_the_episode_as_step_does(
    server: ServerProcess,
) -> None:
    episode = await create_episode(server, SHORT_TASK)
    async with mcp_session(episode) as session:
        answers = [await session.call_tool("task_info", {}) for _ in range(3)]
        after = await session.call_tool("task_info", {})
    assert [a.meta["done"] for a in answers if a.meta] == [False, False, True]
    assert answers[-1].isError is False  # the call that reaches max_steps runs
    assert data(after)["error"]["type"] == "episode_over"
    over_mcp = await server.episode_status(episode["episode_id"])

    def through_step() -> tuple[str, Any, Any]:
        with MCPToolClient(base_url=server.base_url).sync() as env:
            episode_id = env.reset(task_id=SHORT_TASK).observation.metadata["episode_id"]
            steps = [
                env.step(CallToolAction(tool_name="task_info", arguments={})) for _ in range(3)
            ]
            assert [s.done for s in steps] == [False, False, True]
            last = steps[-1]
            after = env.step(CallToolAction(tool_name="task_info", arguments={}))
            return episode_id, last, after

    step_episode, last, after_step = await asyncio.to_thread(through_step)
    over_step = await server.episode_status(step_episode)
    assert last.done is True and last.reward == 0.0
    assert after_step.observation.result["data"]["error"]["type"] == "episode_over"
    assert over_mcp.end is not None and over_step.end is not None
    assert over_mcp.end == over_step.end  # reason max_steps, reward 0
    assert over_mcp.end.reason.value == "max_steps" and over_mcp.end.reward == 0.0
    assert over_mcp.steps_used == over_step.steps_used == 3
    assert over_mcp.done and over_step.done
