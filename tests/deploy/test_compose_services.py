"""deploy/compose.yaml's services run as processes on this machine (no Docker engine here):
each service's own command and settings, as the Compose files and deploy/example.env give them,
against a Temporal dev server on a port of its own (a Temporal "of your own" at
TEMPORAL_ADDRESS). What differs from the containers: the fake backend in place of Hugging Face,
host paths in place of the volumes, and loopback ports in place of 0.0.0.0:8000.

- the setup job registers our search attributes, and a second run adds nothing (exit 0);
- two gateways (`server --no-worker`) and the worker, sharing the deployment's key as
  POSTTRAIN_SERVER_KEY, play an episode to its reward with the stock client and a client key.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from openenv.core.env_server.mcp_types import CallToolAction
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from posttrain_env import PostTrainEnv
from posttrain_server.cluster_local import Member, our_command
from posttrain_server.temporal.setup import missing_search_attributes
from tests.conftest import binary
from tests.deploy.compose import BASE, POSTGRES, project
from tests.deploy.test_compose_files import FILLED, filled_env
from tests.gateway.server import free_port
from tests.startup import DEV_SERVER_STARTUP
from tests.workflows.test_worker_restart import dev_server

SCENARIO = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.grader, queue_s=0.2, run_s=1, score=0.625),
        FakeJobScript(queue_s=0.2, run_s=2),
    ]
)


def services() -> dict[str, dict[str, Any]]:
    """Our services as `docker compose -f compose.yaml -f compose.postgres.yaml` would run them
    with deploy/example.env filled in."""
    return project(BASE, POSTGRES, env=filled_env())["services"]


def process_env(service: dict[str, Any], address: str, state: Path) -> dict[str, str]:
    """The service's environment, on this machine: the dev server's address, the fake backend,
    the Dockerfile's /state and the `shared` volume as folders of the test's own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("POSTTRAIN_", "TEMPORAL_")) and k != "HF_TOKEN"
    }
    given = {name: str(value) for name, value in service["environment"].items()}
    for name, value in given.items():
        if value.startswith("/shared/"):
            given[name] = str(state / "shared" / value.removeprefix("/shared/"))
    state.mkdir(parents=True, exist_ok=True)
    scenario = state / "scenario.json"
    scenario.write_text(SCENARIO.model_dump_json())
    return {
        **env,
        **given,
        "TEMPORAL_ADDRESS": address,
        "POSTTRAIN_BACKEND": "fake",
        "POSTTRAIN_FAKE_SCENARIO": str(scenario),
        "POSTTRAIN_WATCH_INTERVAL_S": "1",
        "POSTTRAIN_STATE_DIR": str(state),
    }


def run_setup(address: str, state: Path) -> subprocess.CompletedProcess[str]:
    setup = services()["setup"]
    assert setup["command"][0] == "posttrain-env"
    return subprocess.run(
        our_command(*setup["command"][1:]),
        env=process_env(setup, address, state),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_the_setup_job_registers_the_search_attributes_once(tmp_path: Path) -> None:
    # A dev server without our attributes (the tests' `dev_server` registers them at start).
    temporal = await WorkflowEnvironment.start_local(
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
        dev_server_existing_path=binary("temporal"),
        dev_server_log_level="error",
    )
    try:
        client = temporal.client
        address = client.service_client.config.target_host
        assert not address.endswith(":7233")  # not the embedded server's port
        assert (await missing_search_attributes(client)).names != []
        first = run_setup(address, tmp_path / "state")
        assert first.returncode == 0, first.stderr
        assert "registered PtTask" in first.stdout and address in first.stdout
        assert (await missing_search_attributes(client)).names == []
        again = run_setup(address, tmp_path / "state")
        assert again.returncode == 0, again.stderr
        assert "every search attribute is already registered" in again.stdout
    finally:
        await temporal.shutdown()


def gateway_command(service: dict[str, Any], port: int) -> list[str]:
    """The service's command with its bind address and port swapped for a loopback port."""
    command = list(service["command"])
    assert command[0] == "posttrain-env"
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(port)
    return our_command(*command[1:])


@contextmanager
def running(members: list[Member]) -> Iterator[list[Member]]:
    try:
        for member in members:
            member.spawn()
        yield members
    finally:
        for member in members:
            member.kill()


async def call(env: PostTrainEnv, tool: str, **arguments: Any) -> dict[str, Any]:
    step = await env.step(CallToolAction(tool_name=tool, arguments=arguments))
    result = getattr(step.observation, "result", None) or {}
    return result.get("data") or {}


@pytest.mark.slow
async def test_gateways_and_worker_as_composed_play_an_episode_on_a_temporal_of_their_own(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    async with dev_server(tmp_path / "temporal.db") as (address, _client):
        assert run_setup(address, state).returncode == 0
        composed = services()
        ports = [free_port(), free_port()]
        gateways = [
            Member(
                name,
                "gateway",
                gateway_command(composed[name], port),
                process_env(composed[name], address, state),
                tmp_path / f"{name}.log",
                url=f"http://127.0.0.1:{port}",
            )
            for name, port in zip(("gateway-1", "gateway-2"), ports, strict=True)
        ]
        worker = Member(
            "worker",
            "worker",
            our_command(*composed["worker"]["command"][1:]),
            process_env(composed["worker"], address, state),
            tmp_path / "worker.log",
        )
        assert gateways[0].env["POSTTRAIN_SERVER_KEY"] == worker.env["POSTTRAIN_SERVER_KEY"]
        with running([*gateways, worker]):
            for member in (*gateways, worker):
                await member.wait_ready()
            key = {"Authorization": f"Bearer {FILLED['POSTTRAIN_API_KEYS']}"}
            # The client key opens either gateway; an episode is played through the first.
            async with PostTrainEnv(gateways[1].url or "", headers=key) as other:
                opened = await other.reset(task_id="t0_artifact")
                assert opened.observation.metadata["episode_id"].startswith("ep-")
            env = PostTrainEnv(gateways[0].url or "", headers=key)
            async with env:
                await env.reset(task_id="t0_artifact")
                submitted = await call(
                    env,
                    "jobs_submit",
                    script="print('training')\n",
                    flavor="cpu-basic",
                    timeout_minutes=5,
                )
                waited: dict[str, Any] = {"state": "queued"}
                while waited.get("state") in ("queued", "running"):
                    waited = await call(env, "jobs_wait", job_id=submitted["job_id"], timeout_s=30)
                assert waited["state"] == "succeeded", waited
                final = await env.step(
                    CallToolAction(tool_name="submit", arguments={"job_id": submitted["job_id"]})
                )
            assert final.done is True and final.reward == 0.625
            roles = sorted(r.role.value for r in FakeBackend(state / "fake", SCENARIO).requests())
            assert roles == ["agent", "grader"]
            assert "Traceback" not in worker.log_since_start()
            # The worker ran the episode: the gateways run none (`--no-worker`).
            assert all("worker on task queue" not in g.log_since_start() for g in gateways)
