"""MCP clients nobody here wrote, each in a venv of its own (the MCP SDK's 2.x line cannot sit
beside openenv's mcp<2; tests/gateway/client_venvs.py), against the real server: with their
default settings plus the one setting the table of docs/clients.md names, each completes a
`jobs_wait` on a job that runs longer than the client's own default timeout, and a wrong token
raises an error that carries our message.

The MCP Inspector's row is checked too: its CLI gives up on a call after 60 s and has no
setting to change that, and `--stored-auth-only` shows our refusal instead of starting an OAuth
login. The first run installs the clients from PyPI and npm into a cache (seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.version import installed_version
from tests.gateway.client_venvs import FASTMCP, OPENAI_AGENTS, client_python, inspector_cli
from tests.gateway.mcp_helpers import SUBMIT, create_episode, data, mcp_session, wait_for_state
from tests.gateway.server import ServerProcess, serving

pytestmark = [pytest.mark.slow, pytest.mark.third_party_clients]

CLIENTS = Path(__file__).with_name("third_party")
# Longer than the OpenAI Agents SDK's 5 s, and than the fake backend's 30 s between looks (so
# the job is seen running), with room for a client that starts slowly on a loaded machine.
JOB_S = 90
WAIT_S = "240"  # the clients' jobs_wait timeout_s: outlasts the job
SCENARIO = FakeScenario(
    jobs=[
        FakeJobScript(script_contains="RUN_LONG", queue_s=1, run_s=600),
        FakeJobScript(queue_s=1, run_s=JOB_S),
    ]
)
TOKEN_MESSAGE = "send `Authorization: Bearer <episode_token>` with this episode's token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, SCENARIO)


async def running_job(
    server: ServerProcess, episode: dict[str, Any] | None = None, script: str = SUBMIT["script"]
) -> tuple[dict[str, Any], str]:
    """A job that has just started running (for about JOB_S seconds), in a new episode or the
    one given."""
    episode = episode or await create_episode(server)
    async with mcp_session(episode) as session:
        job = data(await session.call_tool("jobs_submit", {**SUBMIT, "script": script}))
        await wait_for_state(session, job["job_id"], {"running"})
    return episode, job["job_id"]


def run_client(python: Path, script: str, episode: dict[str, Any], *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(python), str(CLIENTS / script), episode["mcp_url"], *args],
        env={**os.environ, "EPISODE_TOKEN": episode["episode_token"]},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


async def test_fastmcp_with_its_defaults_waits_out_a_long_job_and_shows_our_refusal(
    server: ServerProcess,
) -> None:
    python = client_python("fastmcp", FASTMCP)
    episode, job_id = await running_job(server)
    out = run_client(python, "fastmcp_client.py", episode, job_id, WAIT_S)
    waited = out["jobs_wait"]
    assert waited["data"]["state"] == "succeeded" and waited["data"]["changed"] is True, out
    assert waited["seconds"] > 5  # a wait that outlasted the Agents SDK's default, here too
    # fastmcp always asks for progress: a notification every 5 s while the call runs.
    assert len(waited["progress"]) >= 2 and "jobs_wait is running" in waited["progress"][0]
    assert out["server"]["name"] == "posttrain-env"
    assert out["server"]["version"] == installed_version()
    assert TOKEN_MESSAGE in out["wrong_token"]


async def test_the_openai_agents_sdk_needs_its_session_timeout_raised_as_the_readme_says(
    server: ServerProcess,
) -> None:
    python = client_python("openai-agents", OPENAI_AGENTS)
    episode, job_id = await running_job(server)
    # Its default: the call is given up after 5 s (the job runs on, in the episode).
    default = run_client(python, "agents_client.py", episode, job_id, WAIT_S, "default")
    assert "error" in default["jobs_wait"] and default["jobs_wait"]["seconds"] < JOB_S, default
    assert TOKEN_MESSAGE in default["wrong_token"]
    # The setting docs/clients.md gives, `client_session_timeout_seconds=None`: such a wait
    # completes.
    episode, job_id = await running_job(server, episode)
    raised = run_client(python, "agents_client.py", episode, job_id, WAIT_S, "none")
    waited = raised["jobs_wait"]
    assert waited["data"]["state"] == "succeeded" and waited["data"]["changed"] is True, raised
    assert waited["seconds"] > 5
    assert TOKEN_MESSAGE in raised["wrong_token"]


async def test_the_mcp_inspector_cli_gives_up_after_60_s_and_shows_our_refusal(
    server: ServerProcess,
) -> None:
    inspector, env = inspector_cli()
    episode, job_id = await running_job(server, script="RUN_LONG = 1\n")

    def inspect(*args: str, token: str = episode["episode_token"]) -> subprocess.CompletedProcess:
        auth = ["--header", f"Authorization: Bearer {token}", "--stored-auth-only"]
        return subprocess.run(
            [*inspector, episode["mcp_url"], "--transport", "http", *auth, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    # The command docs/clients.md shows.
    info = inspect("--method", "tools/call", "--tool-name", "task_info")
    assert info.returncode == 0 and "Produce a checkpoint" in info.stdout, info.stderr
    refused = inspect("--method", "tools/list", token="not-this-episodes-token")
    assert refused.returncode != 0 and TOKEN_MESSAGE in refused.stdout + refused.stderr
    # A jobs_wait longer than 60 s: given up, with no setting to change it.
    arguments = json.dumps({"job_id": job_id, "timeout_s": 90})
    waited = inspect(
        "--method", "tools/call", "--tool-name", "jobs_wait", "--tool-args-json", arguments
    )
    assert waited.returncode != 0
    assert "timed out after 1m00s" in waited.stdout + waited.stderr, waited.stdout[-2000:]
