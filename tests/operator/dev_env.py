"""An operator's world on the real dev server: our search attributes registered, a worker with
the fake backend, and the `posttrain-env` command line run as a user runs it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeBackend, FakeScenario
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_server.cli import build_parser
from posttrain_server.commands.episodes import run_episodes_async
from posttrain_server.temporal.client import core_runtime
from posttrain_server.wiring import make_backend
from posttrain_server.worker import build_worker
from tests.conftest import binary
from tests.gateway.server import command
from tests.startup import DEV_SERVER_STARTUP
from tests.workflows.harness import write_task
from workflows.episode.session import ResetRequest, ResetResult, SessionState, SessionWorkflow
from workflows.ids import job_workflow_id, watcher_shard_id, watcher_workflow_id
from workflows.operations.search_attributes import SEARCH_ATTRIBUTES


@dataclass
class Done:
    status: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@dataclass
class Operated:
    client: Client
    address: str
    task_queue: str
    backend: Any  # the FakeBackend; a LocalBackend with `operated(local=True)`
    state_dir: Path

    def watcher_of(self, episode_id: str, n: int = 1) -> str:
        """The watcher shard that follows the episode's n-th job (default settings' shards)."""
        watcher = watcher_workflow_id(self.client.namespace, self.task_queue)
        job = job_workflow_id(episode_id, n)
        return watcher_shard_id(watcher, Settings().watch_shards, job)

    async def cli(self, *args: str, env: dict[str, str] | None = None) -> Done:
        """`posttrain-env <args>` in a process of its own, without blocking the worker; `env`:
        settings of the operator's shell besides this server's address and state dir."""
        shell = {
            k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "TEMPORAL_"))
        }
        shell.update(env or {})
        shell.update({"TEMPORAL_ADDRESS": self.address, "POSTTRAIN_STATE_DIR": str(self.state_dir)})
        proc = await asyncio.create_subprocess_exec(
            *command(),
            *args,
            env=shell,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode is not None
        return Done(proc.returncode, out.decode(), err.decode())

    async def run(self, *args: str) -> Done:
        """`posttrain-env <args>` in this process (the same parser and code, without a
        process start: for the polling loops; `cli` runs the real command)."""
        parsed = build_parser().parse_args(args)
        settings = Settings(**{"TEMPORAL_ADDRESS": self.address, "state_dir": self.state_dir})
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = await run_episodes_async(parsed, settings)
        return Done(status, out.getvalue(), err.getvalue())

    async def temporal_list(self, query: str) -> str:
        """`temporal workflow list --query` as an operator types it."""
        proc = await asyncio.create_subprocess_exec(
            binary("temporal"),
            "workflow",
            "list",
            "--address",
            self.address,
            "--query",
            query,
            "--output",
            "json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, err.decode()
        return out.decode()

    async def temporal(self, *args: str) -> Done:
        """`temporal <args> --address <this server>`, as an operator types it."""
        proc = await asyncio.create_subprocess_exec(
            binary("temporal"),
            *args,
            "--address",
            self.address,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode is not None
        return Done(proc.returncode, out.decode(), err.decode())

    async def reset(self, task_id: str = "t_test") -> ResetResult:
        session = await self.client.start_workflow(
            SessionWorkflow.run,
            SessionState(),
            id=f"session-{uuid.uuid4().hex}",
            task_queue=self.task_queue,
        )
        return await session.execute_update(
            SessionWorkflow.reset, ResetRequest(task_id=task_id), result_type=ResetResult
        )

    def handle(self, workflow_id: str) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(workflow_id)


@asynccontextmanager
async def operated(
    tmp_path: Path,
    scenario: FakeScenario | None = None,
    tasks: dict[str, dict[str, Any]] | None = None,
    *,
    reaper_every_s: float = 600.0,
    local: bool = False,
    ui_port: int | None = None,
    **more_settings: Any,
) -> AsyncIterator[Operated]:
    """`reaper_every_s`: the reconciler's Schedule period (a test of it sets a short one).
    `local`: the local backend (real sandboxed jobs) and the shipped tasks instead of the fake
    and `tasks`. `ui_port`: the dev server serves its UI there."""
    env = await WorkflowEnvironment.start_local(
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
        data_converter=pydantic_data_converter,
        dev_server_existing_path=binary("temporal"),
        runtime=core_runtime(),
        dev_server_log_level="error",
        search_attributes=SEARCH_ATTRIBUTES,
        ui=ui_port is not None,
        ui_port=ui_port,
    )
    try:
        tasks_dir: Path | None = tmp_path / "tasks"
        for task_id, limits in (tasks or {"t_test": {}}).items():
            write_task(tmp_path / "tasks", task_id, **limits)
        # Storage is free here unless a test prices it (tests/workflows/test_storage.py).
        more_settings.setdefault("storage_usd_per_tb_month", 0.0)
        settings = Settings(
            state_dir=tmp_path / "state",
            backend="local" if local else "fake",
            watch_interval_s=1,
            cancel_confirm_s=5,
            reaper_every_s=reaper_every_s,
            **more_settings,
        )
        queue = f"tq-{uuid.uuid4().hex[:12]}"
        key = ServerKey.load_or_create(settings.server_key_path)
        backend: Any = FakeBackend(settings.state_dir / "fake", scenario or FakeScenario())
        if local:
            backend, tasks_dir = make_backend(settings, key), None
        worker = build_worker(
            env.client, settings, backend, key=key, task_queue=queue, tasks_dir=tasks_dir
        )
        address = env.client.service_client.config.target_host
        async with worker:
            yield Operated(env.client, address, queue, backend, settings.state_dir)
    finally:
        await env.shutdown()
