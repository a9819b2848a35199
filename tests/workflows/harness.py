"""Drive episodes through the real workflows on the time-skipping test server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateStage
from temporalio.testing import WorkflowEnvironment

from activities.fake_backend import FakeBackend, FakeScenario
from posttrain_env.settings import Settings
from posttrain_env.worker import build_worker
from workflows.episode import EpisodeStatus, EpisodeWorkflow
from workflows.episode_state import ToolCall, ToolResult
from workflows.session import ResetRequest, ResetResult, SessionState, SessionWorkflow

TEST_TASK = """
id = "{task_id}"
prompt = "Write a checkpoint to /data/outputs."
flavors = ["cpu-basic", "t4-small"]
max_timeout_minutes = 60
budget_usd = {budget_usd}
max_steps = {max_steps}
time_limit_s = {time_limit_s}
score_timeout_s = 600
max_concurrent_jobs = 2
max_dev_evaluations = 2
eval_flavor = "cpu-basic"
eval_timeout_minutes = 10

[base_model]
repo_id = "test-org/tiny-model"
revision = "main"
"""


def write_task(tasks_dir: Path, task_id: str = "t_test", *, budget_usd: float = 1.0,
               max_steps: int = 100, time_limit_s: int = 7200, evaluator: bool = True) -> None:
    folder = tasks_dir / task_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.toml").write_text(TEST_TASK.format(
        task_id=task_id, budget_usd=budget_usd, max_steps=max_steps, time_limit_s=time_limit_s))
    if evaluator:
        (folder / "evaluator.py").write_text("print('the fake backend never runs this')\n")


@dataclass
class Episode:
    env: WorkflowEnvironment
    handle: WorkflowHandle[Any, Any]
    episode_id: str
    reset: ResetResult
    _n: int = field(default=0)

    def next_request_id(self) -> str:
        self._n += 1
        return f"r{self._n}"

    async def call(self, tool: str, path: str = "step", request_id: str | None = None,
                   **arguments: Any) -> ToolResult:
        """A tool call that needs no workflow time to pass."""
        rid = request_id or self.next_request_id()
        return await self.handle.execute_update(
            EpisodeWorkflow.call_tool,
            ToolCall(request_id=rid, tool=tool, arguments=arguments, path=path),  # type: ignore[arg-type]
            id=f"{self.episode_id}:{rid}", result_type=ToolResult)

    async def call_over(self, advance: timedelta, tool: str, request_id: str | None = None,
                        **arguments: Any) -> ToolResult:
        """A tool call during which `advance` of workflow time is skipped."""
        rid = request_id or self.next_request_id()
        update = await self.handle.start_update(
            EpisodeWorkflow.call_tool,
            ToolCall(request_id=rid, tool=tool, arguments=arguments),
            id=f"{self.episode_id}:{rid}", wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            result_type=ToolResult)
        await self.env.sleep(advance)
        return await update.result()

    async def status(self) -> EpisodeStatus:
        return await self.handle.query(EpisodeWorkflow.status)


@dataclass
class Harness:
    env: WorkflowEnvironment
    client: Client
    task_queue: str
    backend: FakeBackend
    settings: Settings

    async def session(self, session_id: str | None = None) -> WorkflowHandle[Any, Any]:
        return await self.client.start_workflow(
            SessionWorkflow.run, SessionState(), id=f"session-{session_id or uuid.uuid4().hex}",
            task_queue=self.task_queue)

    async def episode(self, task_id: str = "t_test",
                      session: WorkflowHandle[Any, Any] | None = None) -> Episode:
        session = session or await self.session()
        reset = await session.execute_update(SessionWorkflow.reset, ResetRequest(task_id=task_id),
                                             result_type=ResetResult)
        handle = self.client.get_workflow_handle(reset.workflow_id)
        return Episode(self.env, handle, reset.episode_id, reset)


@asynccontextmanager
async def running_worker(env: WorkflowEnvironment, tmp_path: Path,
                         scenario: FakeScenario | None = None,
                         **settings: Any) -> AsyncIterator[Harness]:
    tasks_dir = tmp_path / "tasks"
    write_task(tasks_dir)
    config = Settings(state_dir=tmp_path / "state", backend="fake", **settings)
    backend = FakeBackend(config.state_dir / "fake", scenario or FakeScenario())
    task_queue = f"tq-{uuid.uuid4().hex[:12]}"
    worker = build_worker(env.client, config, backend, task_queue=task_queue,
                          tasks_dir=tasks_dir)
    async with worker:
        yield Harness(env, env.client, task_queue, backend, config)
