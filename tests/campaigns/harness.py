"""Campaigns through the real workflows on the time-skipping test server: the project's worker
on the fake backend, and an agent worker (turns in processes of their own) on a queue of its
own, both in this process.

A test here ends at a deadline before pytest-timeout's: that one is a SIGALRM whose exception
is raised wherever the main thread happens to be, often inside the workers' own tasks (a
workflow task then never completes), and the test waits on forever instead of failing
(measured: a campaign test with a 12 s pytest timeout was still waiting after 150 s). The
suite puts every async test under such a deadline (tests/deadline.py); `deadline=` here sets
a shorter one. Either cancels the test at its own await, so it fails and its workers shut down
cleanly."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, Interceptor, WorkflowHandle, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeBackend, FakeScenario
from posttrain_common.campaigns.records import RolloutRecord, read_records
from posttrain_common.campaigns.spec import CampaignSpec, parse_spec
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_server.agent_worker import build_agent_worker
from posttrain_server.worker import build_worker
from tests.leaked_locks import LeakedLocks
from tests.workflows.harness import SKIP_STEP, write_task
from workflows.campaign.contract import CampaignInput, CampaignStatus
from workflows.campaign.workflow import CampaignWorkflow
from workflows.ids import (
    account_workflow_id,
    campaign_workflow_id,
    watcher_shard_ids,
    watcher_workflow_id,
)

REPO = Path(__file__).resolve().parents[2]
SLEEP_RPC_TIMEOUT = timedelta(minutes=5)
QUERY_TRIES = 5


def _no_answer(err: RPCError) -> bool:
    """The RPC got no answer (it timed out, or its HTTP/2 connection broke, which the test
    server's connection does at load 10 on 2 cores: `h2 protocol error`), as opposed to an
    answer that says something is wrong."""
    if err.status is RPCStatusCode.DEADLINE_EXCEEDED or "Timeout" in str(err):
        return True
    return err.status in (RPCStatusCode.CANCELLED, RPCStatusCode.UNAVAILABLE) and (
        "h2 protocol error" in str(err) or "transport" in str(err).lower()
    )


def agent_env(**extra: str) -> dict[str, str]:
    """What the agent worker's environment holds in these tests (tests/ importable)."""
    return {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), **extra}


async def runs_of(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """Every run of a workflow, first to latest, each with its own history: a workflow that
    continued as new has one per run."""
    latest = await client.get_workflow_handle(workflow_id).fetch_history()
    started = latest.events[0].workflow_execution_started_event_attributes
    run_id: str | None = started.first_execution_run_id
    runs: list[WorkflowHistory] = []
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        runs.append(history)
        last = history.events[-1]
        run_id = None
        if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return runs


@dataclass
class Campaigns:
    env: WorkflowEnvironment
    client: Client
    task_queue: str
    agent_queue: str
    backend: FakeBackend
    settings: Settings
    handles: list[WorkflowHandle[Any, Any]] = field(default_factory=list)
    locks: LeakedLocks = field(init=False)

    def __post_init__(self) -> None:
        self.locks = LeakedLocks(self.client)

    @property
    def root(self) -> Path:
        return self.settings.campaign_root

    async def start(self, spec: CampaignSpec | dict[str, Any], **inputs: Any) -> str:
        if isinstance(spec, dict):
            spec = parse_spec(spec)
        campaign_id = f"c-{uuid.uuid4().hex[:8]}"
        handle = await self.client.start_workflow(
            CampaignWorkflow.run,
            CampaignInput(
                campaign_id=campaign_id, spec=spec, agent_task_queue=self.agent_queue, **inputs
            ),
            id=campaign_workflow_id(campaign_id),
            task_queue=self.task_queue,
        )
        self.handles.append(handle)
        return campaign_id

    def handle(self, campaign_id: str) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle_for(
            CampaignWorkflow.run, campaign_workflow_id(campaign_id)
        )

    async def sleep(self, duration: timedelta = SKIP_STEP) -> None:
        """`env.sleep`, waiting as long as it takes: agent turns run in real processes while
        the test server holds its clock, so one step may take many seconds of real time
        (the SDK's `env.sleep` gives up after its default RPC timeout). The locks the server
        leaks when an episode closes after its rollout are released as they leak
        (tests/leaked_locks): each would make the rest of the test pass in real time."""
        for attempt in range(QUERY_TRIES):
            try:
                await self.locks.skip(duration, SLEEP_RPC_TIMEOUT)
                return
            except RPCError as err:  # another step is as good as this one (steps are unaligned)
                if attempt == QUERY_TRIES - 1 or not _no_answer(err):
                    raise

    async def status(self, campaign_id: str) -> CampaignStatus:
        """The status query, asked again when it times out: on a loaded machine (2 cores, turn
        processes, other suites) the worker may not answer a query in the RPC's time. A wrong
        answer is never retried, only no answer."""
        for _ in range(QUERY_TRIES - 1):
            try:
                return await self.handle(campaign_id).query(CampaignWorkflow.status)
            except RPCError as err:
                if not _no_answer(err):
                    raise
        return await self.handle(campaign_id).query(CampaignWorkflow.status)

    async def run_until_final(self, campaign_id: str, max_steps: int = 2000) -> CampaignStatus:
        """Skip time in unaligned steps (see SKIP_STEP) until the campaign has ended."""
        status = await self.status(campaign_id)
        for _ in range(max_steps):
            status = await self.status(campaign_id)
            if status.phase.final:
                return status
            await self.sleep()
        raise AssertionError(f"campaign {campaign_id} did not end: {status}")

    async def skip_until(
        self,
        campaign_id: str,
        check: Any,
        max_steps: int = 500,
        step: timedelta = SKIP_STEP,
    ) -> CampaignStatus:
        """Skip time in steps of `step` until `check(status)` holds. A state that lasts less
        than one step can be stepped over: the caller keeps it longer than `step`."""
        status = await self.status(campaign_id)
        for _ in range(max_steps):
            status = await self.status(campaign_id)
            if check(status):
                return status
            await self.sleep(step)
        raise AssertionError(f"campaign {campaign_id} never got there: {status}")

    def records(self, campaign_id: str) -> list[RolloutRecord]:
        return read_records(self.root / campaign_id)

    async def terminate_all(self) -> None:
        """End every workflow still running, so none holds the test server's clock."""
        watcher = watcher_workflow_id(self.client.namespace, self.task_queue)
        ids = watcher_shard_ids(watcher, Settings().watch_shards)
        ids.append(account_workflow_id(self.client.namespace, self.task_queue))
        for handle in self.handles:
            ids.append(handle.id)
        for workflow_id in ids:
            try:
                await self.client.get_workflow_handle(workflow_id).terminate("test over")
            except RPCError:
                pass


@asynccontextmanager
async def running_campaigns(
    env: WorkflowEnvironment,
    tmp_path: Path,
    scenario: FakeScenario | None = None,
    tasks: dict[str, dict[str, Any]] | None = None,
    agent_environ: dict[str, str] | None = None,
    deadline: timedelta | None = None,
    interceptors: Sequence[Interceptor] = (),
    **settings: Any,
) -> AsyncIterator[Campaigns]:
    """Workers for campaigns on `env` (fake backend), and a harness to drive them.
    `interceptors`: client interceptors for the workflow worker's client; those that are also
    `temporalio.worker.Interceptor`s intercept its workflows (e.g. to drop a signal)."""
    tasks_dir = tmp_path / "tasks"
    for task_id, options in (tasks or {"t_a": {}, "t_b": {}}).items():
        write_task(tasks_dir, task_id, **options)
    # Storage is free here unless a test prices it (tests/workflows/test_storage.py).
    settings.setdefault("storage_usd_per_tb_month", 0.0)
    config = Settings(
        state_dir=tmp_path / "state",
        backend="fake",
        campaigns_dir=tmp_path / "campaigns",
        **settings,
    )
    backend = FakeBackend(config.state_dir / "fake", scenario or FakeScenario())
    task_queue = f"tq-{uuid.uuid4().hex[:12]}"
    agent_queue = f"aq-{uuid.uuid4().hex[:12]}"
    key = ServerKey.load_or_create(config.server_key_path)
    client = env.client
    if interceptors:  # a client's interceptors that are worker interceptors reach its workers
        client = Client(**{**env.client.config(), "interceptors": list(interceptors)})
    worker = build_worker(
        client, config, backend, key=key, task_queue=task_queue, tasks_dir=tasks_dir
    )
    agents = build_agent_worker(
        env.client, config, agent_environ or agent_env(), task_queue=agent_queue
    )
    harness = Campaigns(env, env.client, task_queue, agent_queue, backend, config)
    async with worker, agents:
        try:
            async with asyncio.timeout(None if deadline is None else deadline.total_seconds()):
                yield harness
        except TimeoutError:
            raise TimeoutError(f"the test ran past its deadline ({deadline})") from None
        finally:
            await harness.terminate_all()
