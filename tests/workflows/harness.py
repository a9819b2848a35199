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
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeBackend, FakeScenario
from mcp_gateway.episode_calls import call_tool
from posttrain_common.contracts.episode_calls import EpisodeStatus, ToolCall, ToolResult
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_server.worker import build_worker
from workflows.episode.session import ResetRequest, ResetResult, SessionState, SessionWorkflow
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import account_workflow_id, watcher_shard_ids, watcher_workflow_id

# Test-server bug (temporal-test-server 1.40): a signal that arrives just as a timer fires gets
# the workflow task's completion rejected ("invalid history builder state for action") and the
# clock stalls. Skip steps that line up with workflow timers (the watcher's 30 s, jobs_wait's
# whole minutes) make that coincidence frequent, so the step is deliberately not round.
SKIP_STEP = timedelta(seconds=31.37)
WAIT_TIMEOUT_S = 120  # each jobs_wait of `Episode.wait_job`

TEST_TASK = """
id = "{task_id}"
prompt = "Write a checkpoint to /data/outputs."
flavors = ["cpu-basic", "t4-small"]
max_timeout_minutes = {max_timeout_minutes}
budget_usd = {budget_usd}
max_steps = {max_steps}
time_limit_s = {time_limit_s}
score_timeout_s = 600
max_concurrent_jobs = 2
max_dev_evaluations = {max_dev_evaluations}
eval_flavor = "cpu-basic"
eval_timeout_minutes = 10

[base_model]
repo_id = "test-org/tiny-model"
revision = "main"
"""


def write_task(
    tasks_dir: Path,
    task_id: str = "t_test",
    *,
    budget_usd: float = 1.0,
    max_steps: int = 100,
    time_limit_s: int = 7200,
    max_timeout_minutes: int = 60,
    max_dev_evaluations: int = 2,
    evaluator: bool = True,
    max_concurrent_jobs: int = 2,
    extra: str = "",
) -> None:
    """`extra`: more top-level keys of the task (TOML lines)."""
    folder = tasks_dir / task_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.toml").write_text(
        TEST_TASK.format(
            task_id=task_id,
            budget_usd=budget_usd,
            max_steps=max_steps,
            time_limit_s=time_limit_s,
            max_timeout_minutes=max_timeout_minutes,
            max_dev_evaluations=max_dev_evaluations,
        )
        .replace("\n[base_model]", f"{extra}\n\n[base_model]" if extra else "\n[base_model]")
        .replace("max_concurrent_jobs = 2", f"max_concurrent_jobs = {max_concurrent_jobs}")
    )
    if evaluator:
        (folder / "evaluator.py").write_text("print('the fake backend never runs this')\n")


@dataclass(frozen=True)
class Answer:
    """A tool call's answer as the gateway passes it on for the call's path: the metadata that
    path carries (`StepMetadata.view`), the reward only on `step`."""

    tool: str
    data: dict[str, Any]
    done: bool
    reward: float | None
    metadata: dict[str, Any]

    @classmethod
    def of(cls, result: ToolResult, path: str) -> Answer:
        return cls(
            tool=result.tool,
            data=result.data,
            done=result.done,
            reward=result.reward if path == "step" else None,
            metadata=result.metadata.view(path),  # type: ignore[arg-type]
        )


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

    async def call(
        self, tool: str, path: str = "step", request_id: str | None = None, **arguments: Any
    ) -> Answer:
        """A tool call that needs no workflow time to pass, made as the gateway makes it."""
        rid = request_id or self.next_request_id()
        call = ToolCall(request_id=rid, tool=tool, arguments=arguments, path=path)  # type: ignore[arg-type]
        return Answer.of(await call_tool(self.env.client, self.episode_id, call), path)

    async def call_over(
        self,
        advance: timedelta,
        tool: str,
        request_id: str | None = None,
        path: str = "step",
        **arguments: Any,
    ) -> Answer:
        """A tool call during which `advance` of workflow time is skipped (the test server
        does not skip time while a client merely awaits an update's result)."""
        rid = request_id or self.next_request_id()
        update = await self.handle.start_update(
            EpisodeWorkflow.call_tool,
            ToolCall(request_id=rid, tool=tool, arguments=arguments, path=path),  # type: ignore[arg-type]
            id=f"{self.episode_id}:{rid}",
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            result_type=ToolResult,
        )
        # Skip in small steps and stop once the call has returned. No update result is polled
        # while the test server skips time (an open poll stalls the skip): the episode's
        # `result_of` query says when the answer is there.
        skipped = timedelta(0)
        while skipped < advance:
            await self.env.sleep(SKIP_STEP)
            skipped += SKIP_STEP
            if await self.handle.query(EpisodeWorkflow.result_of, rid) is not None:
                break
        return Answer.of(await update.result(), path)

    async def skip(self, duration: timedelta) -> None:
        """Let `duration` of workflow time pass, in unaligned steps (see SKIP_STEP)."""
        skipped = timedelta(0)
        while skipped < duration:
            step = min(SKIP_STEP, duration - skipped)
            await self.env.sleep(step)
            skipped += step

    async def status(self) -> EpisodeStatus:
        return await self.handle.query(EpisodeWorkflow.status)

    async def submit_job(
        self,
        flavor: str = "cpu-basic",
        timeout_minutes: int = 5,
        script: str = "print('training')\n",
        **arguments: Any,
    ) -> str:
        result = await self.call(
            "jobs_submit",
            script=script,
            flavor=flavor,
            timeout_minutes=timeout_minutes,
            **arguments,
        )
        assert "error" not in result.data, result.data
        return result.data["job_id"]

    async def wait_job(
        self, job_id: str, *, step: timedelta = timedelta(minutes=2), max_calls: int = 20
    ) -> Answer:
        """jobs_wait until the job is no longer queued or running. Each call skips up to
        `step` or its own wait, whichever is longer (it stops once answered): a wait still
        open after the skips passed its remaining workflow time in real time (the test server
        does not skip while a client awaits an update), 80 s of each replay test's episodes."""
        advance = max(step, timedelta(seconds=WAIT_TIMEOUT_S) + SKIP_STEP)
        for _ in range(max_calls):
            result = await self.call_over(
                advance, "jobs_wait", job_id=job_id, timeout_s=WAIT_TIMEOUT_S
            )
            if result.data.get("state") not in ("queued", "running", "cancelling"):
                return result
        raise AssertionError(f"job {job_id} did not finish: {result.data}")


async def reset_new_session(
    client: Client, task_queue: str, task_id: str = "t_test", rpc_timeout: timedelta | None = None
) -> ResetResult:
    """Start a session and reset it: its first episode, as the gateway starts one."""
    session = await client.start_workflow(
        SessionWorkflow.run,
        SessionState(),
        id=f"session-{uuid.uuid4().hex}",
        task_queue=task_queue,
    )
    return await session.execute_update(
        SessionWorkflow.reset,
        ResetRequest(task_id=task_id),
        result_type=ResetResult,
        rpc_timeout=rpc_timeout,
    )


@dataclass
class Harness:
    env: WorkflowEnvironment
    client: Client
    task_queue: str
    backend: FakeBackend
    settings: Settings
    started: list[str] = field(default_factory=list)  # workflow ids to clean up

    async def session(self, session_id: str | None = None) -> WorkflowHandle[Any, Any]:
        handle = await self.client.start_workflow(
            SessionWorkflow.run,
            SessionState(),
            id=f"session-{session_id or uuid.uuid4().hex}",
            task_queue=self.task_queue,
        )
        self.started.append(handle.id)
        return handle

    async def terminate_all(self) -> None:
        """End every workflow this test started, so that none holds the test server's one
        clock (an activity scheduled on a task queue with no worker stalls time skipping)."""
        ids = list(self.started)
        for workflow_id in list(ids):
            if workflow_id.startswith("episode-"):
                ids += [f"{workflow_id}/job/{n}" for n in range(1, 40)]
        watcher = watcher_workflow_id(self.client.namespace, self.task_queue)
        ids += watcher_shard_ids(watcher, self.settings.watch_shards)
        ids += [account_workflow_id(self.client.namespace, self.task_queue)]
        for workflow_id in ids:
            try:
                await self.client.get_workflow_handle(workflow_id).terminate("test over")
            except RPCError:
                pass  # not found, or already closed

    async def episode(
        self, task_id: str = "t_test", session: WorkflowHandle[Any, Any] | None = None
    ) -> Episode:
        session = session or await self.session()
        reset = await session.execute_update(
            SessionWorkflow.reset, ResetRequest(task_id=task_id), result_type=ResetResult
        )
        handle = self.client.get_workflow_handle(reset.workflow_id)
        self.started.append(reset.workflow_id)
        return Episode(self.env, handle, reset.episode_id, reset)


@asynccontextmanager
async def running_worker(
    env: WorkflowEnvironment,
    tmp_path: Path,
    scenario: FakeScenario | None = None,
    backend_class: type[FakeBackend] = FakeBackend,
    task_extra: str = "",
    max_concurrent_jobs: int = 2,
    **settings: Any,
) -> AsyncIterator[Harness]:
    """`task_extra`: more keys of the task `t_test` (TOML lines, see `write_task`)."""
    tasks_dir = tmp_path / "tasks"
    write_task(tasks_dir, max_concurrent_jobs=max_concurrent_jobs, extra=task_extra)
    # Storage is free here unless a test prices it (tests/workflows/test_storage.py): the money
    # figures of the other tests are their jobs' alone. Its bytes are counted all the same.
    settings.setdefault("storage_usd_per_tb_month", 0.0)
    config = Settings(state_dir=tmp_path / "state", backend="fake", **settings)
    backend = backend_class(config.state_dir / "fake", scenario or FakeScenario())
    task_queue = f"tq-{uuid.uuid4().hex[:12]}"
    # The harness holds its deployment's key itself (no deployment check: the time-skipping
    # server runs no DeploymentWorkflow); its tests read the same file.
    key = ServerKey.load_or_create(config.server_key_path)
    worker = build_worker(
        env.client, config, backend, key=key, task_queue=task_queue, tasks_dir=tasks_dir
    )
    harness = Harness(env, env.client, task_queue, backend, config)
    async with worker:
        try:
            yield harness
        finally:
            await harness.terminate_all()
