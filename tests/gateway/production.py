"""The production shape on one machine, as the tests run it: the package's `LocalCluster`
(`posttrain-env cluster-local`: a file-backed Temporal dev server of its own, `server
--no-worker` gateways and `posttrain-env worker` processes, one key file) on free ports and the
fake backend, and the processes the key and shutdown tests start one by one. Also the calls a
shutdown must not wait for: a 300 s `jobs_wait` open over /ws and over MCP, and an episode whose
workflow task fails in a loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import websockets
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from temporalio.client import Client, WorkflowUpdateStage
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.backends.fake.backend import FakeScenario
from posttrain_common.contracts.episode_calls import EpisodeStatus, ToolCall
from posttrain_common.keys import write_new_key
from posttrain_env.limits import TEMPORAL_PAYLOAD_LIMIT_BYTES
from posttrain_server.cluster_local import (
    ClusterConfig,
    ClusterError,
    LocalCluster,
    our_command,
    spawn,
)
from posttrain_server.cluster_local import kill_group as kill_group
from tests.gateway.mcp_helpers import SUBMIT, create_episode, data
from tests.gateway.server import ServerProcess, frame, free_port, ws_url
from tests.payload_limits import payload_limit_violations
from tests.waiting import eventually
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import episode_workflow_id

# docs/deployment.md "Stopping": every process stops within this long of SIGTERM.
SHUTDOWN_LIMIT_S = 30.0
LONG_WAIT_S = 300


def key_file(path: Path) -> Path:
    """A new key file (0600), as `posttrain-env key new` writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_new_key(path)
    return path


def gateway(
    state_dir: Path, address: str, key: Path | None, scenario: FakeScenario | None = None
) -> ServerProcess:
    """A `server` process on `address`'s Temporal (start it with `--no-worker` for a gateway
    alone). Its env() is also a worker's: same state dir, fake backend and scenario."""
    extra = {"TEMPORAL_ADDRESS": address}
    if key is not None:
        extra["POSTTRAIN_SERVER_KEY_FILE"] = str(key)
    return ServerProcess(state_dir, scenario=scenario or FakeScenario(), extra_env=extra)


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`posttrain-env worker` in its own process group, its output in `log` (the package's
    `spawn`, as `cluster-local` starts one)."""
    return spawn(our_command("worker"), env, log)


def run_to_exit(args: list[str], env: dict[str, str], timeout_s: float = 120) -> Any:
    """A command of ours to its end: the CompletedProcess (text output)."""
    return subprocess.run(
        our_command(*args),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        start_new_session=True,
    )


def cluster_environment(
    state_dir: Path, scenario: FakeScenario | None = None, **extra: str
) -> dict[str, str]:
    """The environment a test topology's processes start from: this process's, without any
    setting of ours or of Temporal's, on the fake backend with `scenario` (written to the
    state dir), a watcher that looks every second, and `extra` (POSTTRAIN_* names)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    scenario_file = state_dir / "scenario.json"
    scenario_file.write_text((scenario or FakeScenario()).model_dump_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "TEMPORAL_"))}
    env.pop("HF_TOKEN", None)
    return {
        **env,
        "POSTTRAIN_BACKEND": "fake",
        "POSTTRAIN_FAKE_SCENARIO": str(scenario_file),
        "POSTTRAIN_WATCH_INTERVAL_S": "1",
        **extra,
    }


def cluster_config(
    state_dir: Path, environment: dict[str, str], gateways: int = 2, workers: int = 2
) -> ClusterConfig:
    """`cluster-local`'s topology on free ports, without the Temporal UI."""
    return ClusterConfig(
        state_dir=state_dir,
        gateway_ports=tuple(free_port() for _ in range(gateways)),
        workers=workers,
        temporal_port=free_port(),
        temporal_ui_port=None,
        environment=environment,
    )


async def start_cluster(config: ClusterConfig) -> LocalCluster:
    """A started LocalCluster. Ports are chosen free but another test may take one before it
    is bound: then once more on other ports."""
    for attempt in range(2):
        cluster = LocalCluster(config)
        try:
            await cluster.start()
            return cluster
        except ClusterError as exc:
            taken = "in use" in str(exc) or "could not listen" in str(exc)
            if attempt == 1 or not taken:
                raise
            config = cluster_config(
                config.state_dir,
                dict(config.environment),
                len(config.gateway_ports),
                config.workers,
            )
    raise AssertionError("unreachable")


def check_cluster_logs(cluster: LocalCluster) -> None:
    """Fail if a worker ever had a payload refused for its size (TMPRL1103), as every test
    checks of its server."""
    for member in cluster.members:
        if member.log_path.exists():
            lines = member.log_path.read_text(errors="replace").splitlines()
            violations = payload_limit_violations(lines)
            assert not violations, (
                f"{member.name}: a payload over Temporal's limit: {violations[:3]}"
            )


@asynccontextmanager
async def local_cluster(config: ClusterConfig) -> AsyncIterator[LocalCluster]:
    cluster = await start_cluster(config)
    try:
        yield cluster
    finally:
        await cluster.stop()
        check_cluster_logs(cluster)


async def seconds_to_exit(proc: subprocess.Popen[bytes], limit_s: float = 120) -> float:
    """SIGTERM `proc` (the process itself, as a supervisor does) and measure until it exits."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        await asyncio.to_thread(proc.wait, limit_s)
    return time.monotonic() - started


async def temporal_client(address: str) -> Client:
    return await Client.connect(address, data_converter=pydantic_data_converter)


async def status_of(client: Client, episode_id: str) -> EpisodeStatus:
    handle = client.get_workflow_handle_for(EpisodeWorkflow.run, episode_workflow_id(episode_id))
    return await handle.query(EpisodeWorkflow.status)


async def steps_reach(client: Client, episode_id: str, steps: int, what: str) -> None:
    async def reached() -> bool:
        return (await status_of(client, episode_id)).steps_used >= steps

    await eventually(reached, 120, what)


@asynccontextmanager
async def long_calls_open(server: ServerProcess, client: Client) -> AsyncIterator[None]:
    """Two episodes, each with a job that runs for an hour and a `jobs_wait` of 300 s in flight
    on it: one over the OpenEnv WebSocket, one over the episode's MCP endpoint. Yields once
    both waits have reached their episode (its step counted)."""
    calls: list[asyncio.Task[Any]] = []
    ws_episode: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def over_ws() -> None:
        async with websockets.connect(ws_url(server), open_timeout=60) as ws:
            await ws.send(frame("reset", {"task_id": "t0_artifact"}))
            reset = json.loads(await ws.recv())
            ws_episode.set_result(reset["data"]["observation"]["metadata"]["episode_id"])
            step = {"type": "call_tool", "tool_name": "jobs_submit", "arguments": SUBMIT}
            await ws.send(frame("step", step))
            submitted = json.loads(await ws.recv())
            job_id = submitted["data"]["observation"]["result"]["data"]["job_id"]
            wait = {"job_id": job_id, "timeout_s": LONG_WAIT_S}
            await ws.send(frame("step", {**step, "tool_name": "jobs_wait", "arguments": wait}))
            await ws.recv()  # the server goes first

    episode = await create_episode(server)
    mcp_episode = episode["episode_id"]

    async def over_mcp() -> None:
        headers = {"Authorization": f"Bearer {episode['episode_token']}"}
        timeout = httpx.Timeout(30, read=LONG_WAIT_S + 60)
        async with (
            httpx.AsyncClient(headers=headers, timeout=timeout) as http,
            streamable_http_client(episode["mcp_url"], http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            job = data(await session.call_tool("jobs_submit", SUBMIT))
            wait = {"job_id": job["job_id"], "timeout_s": LONG_WAIT_S}
            await session.call_tool("jobs_wait", wait)

    calls = [asyncio.create_task(over_ws()), asyncio.create_task(over_mcp())]
    try:
        await asyncio.wait_for(asyncio.shield(ws_episode), 120)
        await steps_reach(client, ws_episode.result(), 2, "the jobs_wait over /ws")
        await steps_reach(client, mcp_episode, 2, "the jobs_wait over MCP")
        for call in calls:
            assert not call.done(), call
        yield
    finally:
        for call in calls:
            call.cancel()
        for call in calls:
            with contextlib.suppress(BaseException):
                await call


@asynccontextmanager
async def workflow_task_failing(
    server: ServerProcess, client: Client, worker_log: Path
) -> AsyncIterator[None]:
    """An episode whose every workflow task fails: an update over Temporal's payload limit,
    sent past the gateway (which bounds every argument), is accepted by Temporal and then the
    worker cannot complete a task of that episode (FACTS.md). Only this episode is wedged.
    Yields once the worker's log shows the failure."""
    episode = await create_episode(server)
    handle = client.get_workflow_handle(episode_workflow_id(episode["episode_id"]))
    oversized = ToolCall(
        request_id="oversized",
        tool="jobs_submit",
        arguments={**SUBMIT, "script": "x" * (TEMPORAL_PAYLOAD_LIMIT_BYTES + 300_000)},
    )
    update = asyncio.create_task(
        handle.start_update(
            EpisodeWorkflow.call_tool,
            oversized,
            id="oversized",
            wait_for_stage=WorkflowUpdateStage.COMPLETED,
        )
    )

    async def failing() -> bool:
        log = await asyncio.to_thread(worker_log.read_text, errors="replace")
        return "TMPRL1103" in log

    try:
        await eventually(failing, 120, "the episode's workflow task to fail")
        yield
    finally:
        update.cancel()
        with contextlib.suppress(BaseException):
            await update
