"""The OpenEnv wire protocol over real HTTP and WebSockets, against the real server (embedded
Temporal dev server, in-process worker, fake backend), with the stock openenv 0.10 client,
`PostTrainEnv`, and the frames an openenv-core 0.3 client sends."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from posttrain_common.contracts.jobs import JobRole
from posttrain_env import PostTrainEnv
from tests.gateway.server import ServerProcess, command, frame, ws_url
from tests.waiting import wait_until

SUBMIT_ARGS = {"script": "print('training')\n", "flavor": "cpu-basic", "timeout_minutes": 5}


def play_specification_flow(env_class: type[MCPToolClient], base_url: str) -> Any:
    """The client flow of the specification, verbatim but for the class and the URL."""
    with env_class(base_url=base_url, message_timeout_s=3600).sync() as env:
        result = env.reset(task_id="t0_artifact")
        print(result.observation.metadata["prompt"])
        result = env.step(
            CallToolAction(
                tool_name="jobs_submit",
                arguments={
                    "script": open("train.py").read(),
                    "flavor": "cpu-basic",
                    "timeout_minutes": 5,
                },
            )
        )
        assert result.observation.error is None
        job = result.observation.result["data"]
        assert "error" not in job, job
        status = "queued"
        while status in {"queued", "running"}:
            result = env.step(
                CallToolAction(
                    tool_name="jobs_wait", arguments={"job_id": job["job_id"], "timeout_s": 300}
                )
            )
            assert not result.done, result.observation.metadata
            status = result.observation.result["data"]["state"]
        assert status == "succeeded", result.observation.result
        final = env.step(CallToolAction(tool_name="submit", arguments={"job_id": job["job_id"]}))
        print(final.done, final.reward)
        print(final.observation.metadata["service_spend"])
        return env, job, final


def test_the_specification_flow_runs_verbatim_with_the_stock_openenv_client(
    server: ServerProcess, train_py: Path
) -> None:
    _env, job, final = play_specification_flow(MCPToolClient, server.base_url)
    assert final.done is True
    assert final.reward == 0.75  # the grader's score is the reward
    spend = final.observation.metadata["service_spend"]
    assert spend["final"] is True and spend["settled"]["jobs"] == 1
    assert spend["settled"]["usd"] > 0 and spend["reserved"]["usd"] == 0
    assert final.observation.metadata["episode_end"]["reason"] == "submitted"
    assert job["job_id"].startswith("job-")


def test_the_specification_flow_runs_with_posttrain_env_which_names_its_episode(
    server: ServerProcess, train_py: Path
) -> None:
    env, _job, final = play_specification_flow(PostTrainEnv, server.base_url)
    assert final.done is True and final.reward == 0.75
    assert env.episode_id == final.observation.metadata["episode_id"]
    assert env.episode_id.startswith("ep-")


GETTING_STARTED = Path(__file__).parents[2] / "docs" / "getting-started.md"
ROOT = GETTING_STARTED.parents[1]


def test_the_getting_started_first_client_runs_as_written(
    server: ServerProcess, tmp_path: Path
) -> None:
    """docs/getting-started.md's `first_client.py`, saved in the repository's root and run with
    the project's Python, against this server instead of 127.0.0.1:8000."""
    (program,) = re.findall(
        r'```python title="first_client.py"\n(.*?)```', GETTING_STARTED.read_text(), re.S
    )
    assert program.count("http://127.0.0.1:8000") == 1
    path = tmp_path / "first_client.py"
    path.write_text(program.replace("http://127.0.0.1:8000", server.base_url))
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=ROOT,  # the page says: in the repository's root
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("Produce a checkpoint"), out[:500]  # the prompt
    assert re.search(r"^job job-[0-9a-f]{12} succeeded$", out, re.M), out
    assert "done: True reward: 0.75" in out  # the fake grader's score (1.0 on the local backend)
    assert "'final': True" in out


def test_reset_metadata_carries_the_prompt_limits_token_and_mcp_url(server: ServerProcess) -> None:
    with PostTrainEnv(base_url=server.base_url).sync() as env:
        result = env.reset(task_id="t0_artifact")
        meta = result.observation.metadata
        assert result.done is False and result.reward is None
        assert meta["task"]["max_steps"] == 100 and meta["task"]["budget_usd"] == 0.5
        assert [f["name"] for f in meta["task"]["flavors"]] == ["cpu-basic", "cpu-upgrade"]
        assert meta["mcp_url"] == f"{server.base_url}/episodes/{meta['episode_id']}/mcp"
        assert len(meta["episode_token"]) >= 32
        assert meta["steps_used"] == 0 and meta["prices_simulated"] is True
        assert meta["service_spend"]["settled"]["usd"] == 0
        tools = env.list_tools()
        assert [t.name for t in tools][:3] == ["task_info", "list_hardware", "jobs_submit"]
        assert "script" in tools[2].input_schema["properties"]


def test_tool_errors_are_data_and_observation_error_stays_empty(server: ServerProcess) -> None:
    with PostTrainEnv(base_url=server.base_url).sync() as env:
        env.reset(task_id="t0_artifact")
        result = env.step(
            CallToolAction(tool_name="jobs_submit", arguments={**SUBMIT_ARGS, "flavor": "h100x8"})
        )
        assert result.observation.error is None
        assert result.observation.result["data"]["error"]["type"] == "flavor_not_allowed"
        assert result.observation.result["is_error"] is True
        assert result.observation.metadata["steps_used"] == 1  # an argument error is a step


def test_openenv_core_0_3_frames_over_ws_without_a_session_id(server: ServerProcess) -> None:
    """openenv-core 0.3 sends tool calls as `step` frames on a bare /ws and reads metadata only
    inside the observation; its `close` frame ends the episode."""
    with ws_connect(ws_url(server)) as ws:
        ws.send(frame("reset", {"task_id": "t0_artifact"}))
        reply = json.loads(ws.recv())
        assert reply["type"] == "observation"
        inner = reply["data"]["observation"]["metadata"]
        assert inner["prompt"].strip().startswith("Produce a checkpoint")
        assert inner == reply["data"]["metadata"]  # both places
        episode_id = inner["episode_id"]

        ws.send(frame("step", {"type": "list_tools"}))
        tools = json.loads(ws.recv())["data"]["observation"]["tools"]
        assert {t["name"] for t in tools} >= {"jobs_submit", "jobs_wait", "submit"}

        ws.send(
            frame(
                "step",
                {
                    "type": "call_tool",
                    "tool_name": "jobs_submit",
                    "arguments": {**SUBMIT_ARGS, "script": "RUN_LONG = 1\n"},
                },
            )
        )
        observation = json.loads(ws.recv())["data"]["observation"]
        assert observation["tool_name"] == "jobs_submit"
        assert observation["result"]["data"]["state"] in {"queued", "running"}
        assert observation["metadata"]["service_spend"]["reserved"]["usd"] > 0

        ws.send(frame("state"))
        state = json.loads(ws.recv())
        assert state["type"] == "state" and state["data"]["episode_id"] == episode_id
        assert state["data"]["step_count"] == 1

        ws.send(frame("bogus"))
        assert json.loads(ws.recv())["data"]["code"] == "UNKNOWN_TYPE"
        ws.send("{not json")
        assert json.loads(ws.recv())["data"]["code"] == "INVALID_JSON"
        ws.send(frame("close"))

    status = server.wait_status(episode_id, until=lambda s: s.done and s.service_spend.final)
    assert status.end is not None and status.end.reason.value == "cancelled"
    assert status.end.reward is None
    assert [job["state"] for job in status.jobs] == ["cancelled"]


def test_a_step_resent_with_the_same_request_id_after_a_drop_runs_once(
    server: ServerProcess,
) -> None:
    create = httpx.post(
        f"{server.base_url}/mcp",
        json={"jsonrpc": "2.0", "method": "openenv/session/create", "params": {}, "id": 1},
    )
    session_id = create.json()["result"]["session_id"]
    query = f"session_id={session_id}"
    submit = frame(
        "step",
        {
            "type": "call_tool",
            "tool_name": "jobs_submit",
            "arguments": SUBMIT_ARGS,
            "metadata": {"request_id": "r-1"},
        },
    )
    with ws_connect(ws_url(server, query)) as ws:
        ws.send(frame("reset", {"task_id": "t0_artifact", "request_id": "reset-1"}))
        episode_id = json.loads(ws.recv())["data"]["metadata"]["episode_id"]
        ws.send(submit)  # the connection drops before the reply is read
    with ws_connect(ws_url(server, query)) as ws:
        ws.send(frame("reset", {"task_id": "t0_artifact", "request_id": "reset-1"}))
        again = json.loads(ws.recv())["data"]["metadata"]["episode_id"]
        assert again == episode_id  # the same reset, not a second episode
        ws.send(submit)
        first = json.loads(ws.recv())["data"]["observation"]["result"]["data"]
        ws.send(submit)
        second = json.loads(ws.recv())["data"]["observation"]["result"]["data"]
    assert first == second and first["job_id"].startswith("job-")
    mine = [r for r in server.requests(JobRole.agent) if r.episode_id == episode_id]
    assert len(mine) == 1
    assert server.wait_status(episode_id).steps_used == 1


def test_two_sessions_cannot_see_or_touch_each_others_episode(server: ServerProcess) -> None:
    with (
        PostTrainEnv(base_url=server.base_url).sync() as a,
        PostTrainEnv(base_url=server.base_url).sync() as b,
    ):
        a.reset(task_id="t0_artifact")
        b.reset(task_id="t0_artifact")
        assert a.episode_id != b.episode_id
        job = a.step(CallToolAction(tool_name="jobs_submit", arguments=SUBMIT_ARGS))
        job_id = job.observation.result["data"]["job_id"]
        for tool in ("jobs_status", "jobs_cancel", "jobs_logs", "submit"):
            seen = b.step(CallToolAction(tool_name=tool, arguments={"job_id": job_id}))
            assert seen.observation.result["data"]["error"]["type"] == "unknown_job", tool
        listing = b.step(CallToolAction(tool_name="jobs_status", arguments={}))
        assert listing.observation.result["data"] == {"jobs": [], "total": 0, "next_cursor": None}
        # The direct /mcp path is bound to the caller's session too.
        assert b.call_tool("jobs_status") == {"jobs": [], "total": 0, "next_cursor": None}
        assert [j["job_id"] for j in a.call_tool("jobs_status")["jobs"]] == [job_id]


def test_direct_mcp_calls_count_as_steps_and_return_no_reward(server: ServerProcess) -> None:
    with MCPToolClient(base_url=server.base_url).sync() as env:
        env.reset(task_id="t0_artifact")
        info = env.call_tool("task_info")
        assert info["prompt"].strip().startswith("Produce a checkpoint")
        state = env.state()
        assert state.step_count == 1
        result = env.step(CallToolAction(tool_name="list_hardware", arguments={}))
        assert result.observation.metadata["steps_used"] == 2


def test_close_ends_the_live_episode_as_cancelled_and_cancels_its_jobs(
    server: ServerProcess,
) -> None:
    with MCPToolClient(base_url=server.base_url).sync() as env:
        reset = env.reset(task_id="t0_artifact")
        episode_id = reset.observation.metadata["episode_id"]
        env.step(
            CallToolAction(
                tool_name="jobs_submit", arguments={**SUBMIT_ARGS, "script": "RUN_LONG = 1\n"}
            )
        )
    status = server.wait_status(episode_id, until=lambda s: s.done and s.service_spend.final)
    assert status.end is not None and status.end.reason.value == "cancelled"
    assert [job["state"] for job in status.jobs] == ["cancelled"]
    assert status.service_spend.final is True


def test_the_stock_generic_client_resets_and_closes_without_an_error_in_the_server_log(
    server: ServerProcess,
) -> None:
    """`GenericEnvClient` drops its socket right after its close frame; our answering close
    met a closed connection and logged a traceback each time (issue 20)."""
    log_from = server.log_path.stat().st_size
    episode_ids = []
    for _ in range(3):
        with GenericEnvClient(base_url=server.base_url).sync() as env:
            reset = env.reset(task_id="t0_artifact")
            episode_ids.append(reset.observation["metadata"]["episode_id"])
            assert episode_ids[-1].startswith("ep-")
    for episode_id in episode_ids:  # each close ends its session's episode, then the socket
        server.wait_status(episode_id, until=lambda s: s.done, timeout_s=30)
    with server.log_path.open("rb") as log:
        log.seek(log_from)
        written = log.read().decode(errors="replace")
    assert "ERROR" not in written and "Traceback" not in written, written[-3000:]


def test_a_dropped_connection_does_not_end_the_episode(server: ServerProcess) -> None:
    env = PostTrainEnv(base_url=server.base_url).sync()
    env.connect()
    episode_id = env.reset(task_id="t0_artifact").observation.metadata["episode_id"]
    env.disconnect()  # the socket goes; the session stays
    result = env.step(CallToolAction(tool_name="jobs_status", arguments={}))
    assert result.observation.metadata["episode_id"] == episode_id
    assert result.done is False
    env.close()


def test_a_websocket_or_request_naming_a_foreign_origin_or_host_is_refused(
    server: ServerProcess,
) -> None:
    for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"}):
        with pytest.raises(InvalidStatus) as refused:
            ws_connect(ws_url(server), additional_headers=headers).close()
        assert refused.value.response.status_code == 403, headers
        response = httpx.post(f"{server.base_url}/mcp", headers=headers, json={})
        assert response.status_code == 403, headers
    # A DNS-rebound page: the browser reaches 127.0.0.1 under the attacker's host name.
    rebound = f"ws://rebound.example:{server.port}/ws"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        with pytest.raises(InvalidStatus) as refused:
            ws_connect(rebound, sock=sock).close()
    assert refused.value.response.status_code == 403
    response = httpx.get(f"{server.base_url}/health", headers={"Host": "rebound.example"})
    assert response.status_code == 403
    same_site = {"Origin": f"http://localhost:{server.port}"}
    with ws_connect(ws_url(server), additional_headers=same_site) as ws:
        ws.send(frame("state"))
        assert json.loads(ws.recv())["type"] == "state"


def test_http_routes_are_bound_to_a_session(server: ServerProcess) -> None:
    base = server.base_url
    reset = httpx.post(f"{base}/reset", json={"task_id": "t0_artifact"}, timeout=30).json()
    session_id = reset["metadata"]["session_id"]
    step = httpx.post(
        f"{base}/step",
        json={
            "session_id": session_id,
            "action": {"type": "call_tool", "tool_name": "task_info", "arguments": {}},
        },
        timeout=30,
    ).json()
    assert step["observation"]["result"]["data"]["base_model"]["repo_id"]
    state = httpx.get(f"{base}/state", headers={"X-Session-Id": session_id}).json()
    assert state["episode_id"] == reset["metadata"]["episode_id"] and state["step_count"] == 1
    fresh = httpx.post(
        f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}
    ).json()["result"]["session_id"]
    other = httpx.post(
        f"{base}/step",
        json={"session_id": fresh, "action": {"type": "call_tool", "tool_name": "task_info"}},
        timeout=30,
    )
    assert other.status_code == 409 and other.json()["detail"]["code"] == "NO_EPISODE"
    malformed = httpx.get(f"{base}/state", headers={"X-Session-Id": "../etc"})
    assert malformed.status_code == 400
    unknown_task = httpx.post(f"{base}/reset", json={"task_id": "nope"}, timeout=30)
    assert unknown_task.status_code == 400
    assert unknown_task.json()["detail"]["code"] == "invalid_argument"
    assert "t0_artifact" in unknown_task.json()["detail"]["message"]


# OpenEnv's own command line, as third-party clients are (the slow set): it loads the whole of
# openenv, Gradio included, 25-40 s of a loaded run.
@pytest.mark.slow
def test_openenv_validate_url_passes(server: ServerProcess) -> None:
    done = subprocess.run(
        [*command("openenv"), "validate", "--url", server.base_url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] is True, report


def test_the_session_id_never_reaches_the_server_log(server: ServerProcess) -> None:
    create = httpx.post(
        f"{server.base_url}/mcp",
        json={"jsonrpc": "2.0", "method": "openenv/session/create", "params": {}, "id": 7},
    )
    session_id = create.json()["result"]["session_id"]
    with ws_connect(ws_url(server, f"session_id={session_id}")) as ws:
        ws.send(frame("reset", {"task_id": "t0_artifact"}))
        ws.recv()
    assert "/ws" in server.log() and session_id not in server.log()


def test_posttrain_env_never_reads_a_late_reply_after_a_timeout(server: ServerProcess) -> None:
    # 10 s: every call before the wait must come back within it, loaded suite or not (4 s once
    # timed out a submit in an eight-worker run); the wait below lasts twice as long.
    with PostTrainEnv(base_url=server.base_url, message_timeout_s=10).sync() as env:
        episode_id = env.reset(task_id="t0_artifact").observation.metadata["episode_id"]
        job = env.step(
            CallToolAction(
                tool_name="jobs_submit", arguments={**SUBMIT_ARGS, "script": "RUN_LONG = 1\n"}
            )
        )
        job_id = job.observation.result["data"]["job_id"]
        state = job.observation.result["data"]["state"]
        while state == "queued":  # quick waits: the job starts within a second or two
            waited = env.step(
                CallToolAction(tool_name="jobs_wait", arguments={"job_id": job_id, "timeout_s": 1})
            )
            state = waited.observation.result["data"]["state"]
        assert state == "running"
        wait = CallToolAction(
            tool_name="jobs_wait",
            arguments={"job_id": job_id, "timeout_s": 20},
            metadata={"request_id": "wait-20s"},
        )
        with pytest.raises(TimeoutError):
            env.step(wait)  # the job runs for 10 minutes: this wait lasts 20 s, past the 10 s
        # The episode answers the wait at 20 s; the gateway sends it to the dropped socket.
        # Each look connects a Temporal client: twice a second, not the default 20 times.
        wait_until(
            lambda: asyncio.run(server.answered(episode_id, "wait-20s")),
            40,
            "the wait's answer",
            every_s=0.5,
        )
        status = env.step(CallToolAction(tool_name="jobs_status", arguments={"job_id": job_id}))
        assert status.observation.tool_name == "jobs_status"
        assert status.observation.result["data"]["job_id"] == job_id
        assert "changed" not in status.observation.result["data"]  # not the wait's answer
