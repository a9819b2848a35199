"""What a client that speaks only MCP gets (issue 20), against the real server (embedded Temporal,
the worker, the fake backend) over real HTTP:

- its episode seen and ended by id: `GET` and `DELETE /episodes/<id>`, behind the episode token;
- refusals of the MCP endpoint as JSON-RPC errors, the episode's progress in the result's text,
  posttrain-env's own `serverInfo`, and an `episode_over` that points to `POST /episodes`;
- long calls sent again after the client gave up: attached to the work in flight, never run or
  charged twice.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import httpx
import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from posttrain_common.keys import ServerKey
from posttrain_common.version import installed_version
from tests.gateway.mcp_helpers import SUBMIT, create_episode, data, mcp_session, wait_for_state
from tests.gateway.server import ServerProcess, serving
from tests.waiting import eventually
from workflows.ids import episode_workflow_id

# Evaluations long enough for a client to give up in the middle of one.
EVAL_S = 8
SCENARIO = FakeScenario(
    jobs=[
        # A provider that lost the cancel request: never confirmed.
        FakeJobScript(
            script_contains="STUCK_CANCEL", queue_s=1, run_s=3600, cancel_confirm_after_s=None
        ),
        FakeJobScript(script_contains="RUN_LONG", queue_s=1, run_s=3600),
        FakeJobScript(role=JobRole.dev, queue_s=1, run_s=EVAL_S, score=0.5),
        FakeJobScript(role=JobRole.grader, queue_s=1, run_s=EVAL_S, score=0.75),
        FakeJobScript(queue_s=1, run_s=1),
    ]
)
LONG_SUBMIT = {**SUBMIT, "script": "RUN_LONG = 1\n"}
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, SCENARIO)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def episode_url(server: ServerProcess, episode_id: str) -> str:
    return f"{server.base_url}/episodes/{episode_id}"


async def request(method: str, url: str, token: str | None, **kwargs: Any) -> httpx.Response:
    headers = {**kwargs.pop("headers", {}), **(bearer(token) if token else {})}
    async with httpx.AsyncClient(timeout=120) as http:
        return await http.request(method, url, headers=headers, **kwargs)


async def succeeded_job(episode: dict[str, Any]) -> str:
    async with mcp_session(episode) as session:
        job = data(await session.call_tool("jobs_submit", SUBMIT))
        await wait_for_state(session, job["job_id"], {"succeeded"})
    return job["job_id"]


async def call_then_vanish(
    server: ServerProcess, episode: dict[str, Any], tool: str, job_id: str, role: JobRole
) -> None:
    """Make the call, and go away once its evaluation job (of `role`) is started, as a client
    does when its timeout fires."""

    async def call() -> None:
        async with mcp_session(episode) as session:
            await session.call_tool(tool, {"job_id": job_id})

    calling = asyncio.create_task(call())
    await eventually(
        lambda: any(r.episode_id == episode["episode_id"] for r in server.requests(role)),
        60,
        f"the {tool} call to start its {role.value} job",
    )
    assert not calling.done(), "the call ended before the client gave up"
    calling.cancel()
    with suppress(asyncio.CancelledError):
        await calling


# -- GET and DELETE /episodes/<id> -------------------------------------------------------------


async def test_get_shows_a_running_episode_and_delete_ends_it_with_every_job_confirmed(
    server: ServerProcess,
) -> None:
    episode = await create_episode(server)
    url, token = episode_url(server, episode["episode_id"]), episode["episode_token"]
    async with mcp_session(episode) as session:
        job = data(await session.call_tool("jobs_submit", LONG_SUBMIT))
        await wait_for_state(session, job["job_id"], {"running"})
    running = await request("GET", url, token)
    assert running.status_code == 200, running.text
    body = running.json()
    assert body["state"] == "running" and body["done"] is False and body["episode_end"] is None
    assert body["steps_used"] >= 2 and body["steps_left"] == 100 - body["steps_used"]
    assert 0 < body["time_left_s"] <= 7200
    assert body["service_spend"]["reserved"]["usd"] > 0 and body["service_spend"]["final"] is False
    assert [j["state"] for j in body["jobs"]] == ["running"]

    ended = await request("DELETE", url, token)
    assert ended.status_code == 200, ended.text
    end = ended.json()
    assert end["state"] == "ended" and end["done"] is True
    assert end["episode_end"] == {"reason": "abandoned", "reward": 0.0}
    assert [j["state"] for j in end["jobs"]] == ["cancelled"]  # no live job remains
    assert end["service_spend"]["final"] is True and end["service_spend"]["reserved"]["usd"] == 0
    assert end["cancelling"] == []
    # The fake backend saw the cancellation; GET now shows the end, DELETE again changes nothing.
    assert (await request("GET", url, token)).json()["state"] == "ended"
    again = await request("DELETE", url, token)
    assert again.status_code == 200 and again.json()["episode_end"] == end["episode_end"]

    async with mcp_session(episode) as session:
        over = await session.call_tool("task_info", {})
    error = data(over)["error"]
    assert error["type"] == "episode_over" and "abandoned" in error["message"]
    assert "POST /episodes" in error["message"] and "reset" not in error["message"]


async def test_a_cancellation_left_unconfirmed_is_answered_after_a_short_wait_without_an_error(
    server: ServerProcess,
) -> None:
    """DELETE and a session's close, with a job whose cancellation never confirms: each answers
    "still cancelling" after END_WAIT (10 s; it was 30 s), and the gateway logs no error (the
    close logged `openenv/session/close failed` with a traceback)."""
    stuck = {**SUBMIT, "script": "STUCK_CANCEL = 1\n"}
    episode = await create_episode(server)
    url, token = episode_url(server, episode["episode_id"]), episode["episode_token"]
    async with mcp_session(episode) as session:
        job = data(await session.call_tool("jobs_submit", stuck))
        await wait_for_state(session, job["job_id"], {"running"})
    started = time.monotonic()
    ended = await request("DELETE", url, token)
    deleted_s = time.monotonic() - started
    assert ended.status_code == 202, ended.text
    body = ended.json()
    assert body["state"] == "ending" and body["cancelling"] == [job["job_id"]]
    assert body["episode_end"]["reason"] == "abandoned"

    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        reset = (await http.post("/reset", json={"task_id": "t0_artifact"})).json()
        session_id = reset["metadata"]["session_id"]
        action = {"type": "call_tool", "tool_name": "jobs_submit", "arguments": stuck}
        step = (await http.post("/step", json={"session_id": session_id, "action": action})).json()
        job_id = step["observation"]["result"]["data"]["job_id"]
        wait = {"type": "call_tool", "tool_name": "jobs_wait", "arguments": {"job_id": job_id}}
        waited = await http.post("/step", json={"session_id": session_id, "action": wait})
        assert waited.json()["observation"]["result"]["data"]["state"] == "running"
        started = time.monotonic()
        closed = await http.post(
            "/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "openenv/session/close",
                "params": {"session_id": session_id},
            },
        )
        closed_s = time.monotonic() - started
    result = closed.json()["result"]
    assert result == {"session_id": session_id, "closed": False, "closing": True}, closed.text
    print(f"DELETE answered in {deleted_s:.1f} s, the session's close in {closed_s:.1f} s")
    assert deleted_s < 30 and closed_s < 30  # 30 s and more before (the old wait)
    log = server.log_path.read_text(errors="replace")
    assert "session/close failed" not in log and "WorkflowUpdateRPCTimeoutOrCancelled" not in log


async def test_the_episode_routes_take_its_token_and_nothing_else(server: ServerProcess) -> None:
    mine, theirs = await create_episode(server), await create_episode(server)
    url = episode_url(server, mine["episode_id"])
    for token in (None, mine["episode_token"][:-1], theirs["episode_token"], "not-a-token"):
        for method in ("GET", "DELETE"):
            refused = await request(method, url, token)
            assert refused.status_code == 401, (method, token, refused.text)
            assert refused.json()["detail"]["code"] == "UNAUTHORIZED"
            assert "episode_token" in refused.json()["detail"]["message"]
            assert refused.headers["www-authenticate"] == "Bearer"
    for bad in ("ep-XYZ", "episode", mine["episode_id"] + "0"):
        missing = await request("GET", episode_url(server, bad), mine["episode_token"])
        assert missing.status_code == 404 and missing.json()["detail"]["code"] == "NOT_FOUND"
    # A well-formed id with its right token that Temporal does not know: not found either.
    key = ServerKey.load_or_create(server.state_dir / "server.key")
    ghost = "ep-" + "0" * 16
    missing = await request("DELETE", episode_url(server, ghost), key.episode_token(ghost))
    assert missing.status_code == 404, missing.text
    status = await request("GET", url, mine["episode_token"])
    assert (
        status.status_code == 200 and status.json()["state"] == "running"
    )  # refusals ended nothing


# -- what every MCP client shows -----------------------------------------------------------------


async def test_mcp_refusals_are_json_rpc_errors_with_our_message(server: ServerProcess) -> None:
    episode = await create_episode(server)
    url = episode["mcp_url"]
    refusals = [
        (url, {}, 401, "UNAUTHORIZED", "episode_token"),
        (url, bearer("wrong"), 401, "UNAUTHORIZED", "episode_token"),
        (url.replace(episode["episode_id"], "ep-XYZ"), {}, 404, "NOT_FOUND", "no such episode"),
        (url, {"Host": "rebound.example"}, 403, "FORBIDDEN", "host not allowed"),
    ]
    for target, headers, status, code, says in refusals:
        response = await request(
            "POST", target, None, json=INITIALIZE, headers={**MCP_ACCEPT, **headers}
        )
        assert response.status_code == status, (headers, response.text)
        assert response.headers["content-type"].startswith("application/json")
        body = response.json()
        assert body["jsonrpc"] == "2.0" and body["id"] is None
        assert says in body["error"]["message"] and isinstance(body["error"]["code"], int)
        assert body["error"]["data"] == {"code": code, "status": status}
        assert body["detail"] == {"code": code, "message": body["error"]["message"]}


async def test_server_info_names_posttrain_env_and_its_version(server: ServerProcess) -> None:
    episode = await create_episode(server)
    response = await request(
        "POST", episode["mcp_url"], episode["episode_token"], json=INITIALIZE, headers=MCP_ACCEPT
    )
    events = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    info = json.loads(events[-1])["result"]["serverInfo"]
    assert info == {"name": "posttrain-env", "version": installed_version()}
    assert installed_version() != "0+unknown"


async def test_steps_time_left_and_done_are_in_the_text_the_model_reads(
    server: ServerProcess,
) -> None:
    episode = await create_episode(server)
    async with mcp_session(episode) as session:
        first = await session.call_tool("task_info", {})
        refused = await session.call_tool("jobs_status", {"job_id": "job-000000000000"})
    for result, steps_used in ((first, 1), (refused, 2)):
        texts = [block.text for block in result.content if block.type == "text"]
        assert json.loads(texts[0]) == data(result)  # the tool's data, as JSON text
        progress = json.loads(texts[1])["episode"]
        assert progress["steps_used"] == steps_used and progress["steps_left"] == 100 - steps_used
        assert progress["done"] is False and 0 < progress["time_left_s"] <= 7200
        assert result.meta is not None and result.meta["steps_left"] == progress["steps_left"]
    assert refused.isError is True


# -- long calls sent again ------------------------------------------------------------------------


async def test_each_long_tools_description_says_how_to_outlast_a_client_that_gives_up(
    server: ServerProcess,
) -> None:
    # What an agent reads in tools/list: a smaller timeout_s for jobs_wait, the same call again
    # for the two calls that last as long as an evaluation job, and that repeating is safe.
    episode = await create_episode(server)
    async with mcp_session(episode) as session:
        listed = {tool.name: tool.description or "" for tool in (await session.list_tools()).tools}
    guidance = {
        "jobs_wait": ["gives up on a tool call sooner", "pass a smaller `timeout_s`", "again"],
        "dev_evaluate": [
            "client gives up sooner",
            "call dev_evaluate again with the same job_id",
            "(that call is no step)",
            "evaluated and charged once",
        ],
        "submit": [
            "client gives up sooner",
            "call submit again with the same job_id",
            "graded once",
            "that call is no step, even when no step is left",
        ],
    }
    for tool, sentences in guidance.items():
        for sentence in sentences:
            assert sentence in listed[tool], (tool, sentence, listed[tool])


async def test_a_submit_sent_again_mid_grading_attaches_one_grader_one_reward(
    server: ServerProcess,
) -> None:
    episode = await create_episode(server)
    episode_id = episode["episode_id"]
    job_id = await succeeded_job(episode)
    await call_then_vanish(server, episode, "submit", job_id, JobRole.grader)
    steps = (await server.episode_status(episode_id)).steps_used
    started = time.monotonic()
    async with mcp_session(episode) as session:
        again = await session.call_tool("submit", {"job_id": job_id})  # attaches
    assert time.monotonic() - started < EVAL_S + 30
    assert again.isError is False and data(again)["score"] == 0.75, again
    assert again.meta is not None and again.meta["done"] is True
    status = await server.episode_status(episode_id)
    assert status.steps_used == steps  # the call sent again was no step
    assert status.end is not None and status.end.reason.value == "submitted"
    assert status.end.reward == 0.75
    graders = [r for r in server.requests(JobRole.grader) if r.episode_id == episode_id]
    assert len(graders) == 1  # one grader job
    assert status.service_spend.settled.jobs == 1 and status.service_spend.settled.calls == 0

    # Sent once more after the end, and once more after the episode's workflow completed: the
    # grading's answer each time, nothing new started.
    async with mcp_session(episode) as session:
        after = await session.call_tool("submit", {"job_id": job_id})
        assert data(after) == data(again)
        await completed(server, episode_id)
        closed = await session.call_tool("submit", {"job_id": job_id})
        other = await session.call_tool("task_info", {})
    assert data(closed) == data(again) and closed.isError is False
    assert data(other)["error"]["type"] == "episode_over"
    graders = [r for r in server.requests(JobRole.grader) if r.episode_id == episode_id]
    assert len(graders) == 1


async def test_a_dev_evaluate_sent_again_attaches_and_is_charged_once(
    server: ServerProcess,
) -> None:
    episode = await create_episode(server)
    episode_id = episode["episode_id"]
    job_id = await succeeded_job(episode)
    await call_then_vanish(server, episode, "dev_evaluate", job_id, JobRole.dev)
    async with mcp_session(episode) as session:
        again = data(await session.call_tool("dev_evaluate", {"job_id": job_id}))
        assert again["score"] == 0.5 and again["cost_usd"] > 0, again
        # Asked once more once it has ended: the same evaluation, not a new one.
        later = data(await session.call_tool("dev_evaluate", {"job_id": job_id}))
    assert later == again
    devs = [r for r in server.requests(JobRole.dev) if r.episode_id == episode_id]
    assert len(devs) == 1
    status = await server.episode_status(episode_id)
    assert status.service_spend.settled.calls == 1  # charged once
    assert status.service_spend.settled.usd == pytest.approx(2 * again["cost_usd"])  # job + eval


async def completed(server: ServerProcess, episode_id: str, timeout_s: float = 60) -> None:
    """Wait until the episode's workflow has completed (every job final, the run returned)."""
    client = await Client.connect(server.temporal_address, data_converter=pydantic_data_converter)
    handle = client.get_workflow_handle(episode_workflow_id(episode_id))

    async def done() -> bool:
        return (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED

    await eventually(done, timeout_s, "the episode's workflow to complete", every_s=0.2)
