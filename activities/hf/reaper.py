"""Activities of the orphan reaper (`workflows/reaper.py`) and the Schedule that runs it.

Only jobs carrying this deployment's label are ever looked at, so two deployments sharing one
Hugging Face namespace never reap each other's jobs. An episode counts as closed when its
workflow is not running: completed, failed, terminated, timed out, or not found at all.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.backend import BackendJob
from activities.hf_backend import HfBackend
from activities.jobs import agent_errors
from workflows.ids import episode_workflow_id

log = logging.getLogger(__name__)

REAPER_EVERY = timedelta(minutes=10)


class OrphanJob(BaseModel):
    ref: str
    episode_id: str
    job_id: str = ""
    role: str = ""
    stage: str = ""


class OrphanSearch(BaseModel):
    checked: int = 0
    orphans: list[OrphanJob] = Field(default_factory=list)


def reaper_schedule_id(namespace: str, task_queue: str) -> str:
    return f"posttrain-reaper/{namespace}/{task_queue}"


class ReaperActivities:
    def __init__(self, backend: HfBackend, client: Client) -> None:
        self._backend = backend
        self._client = client
        self.schedule_task: asyncio.Task[str] | None = None

    @activity.defn
    async def find_orphan_jobs(self) -> OrphanSearch:
        """This deployment's live jobs whose episode is closed."""
        live = await self._backend.live_jobs()
        closed: dict[str, bool] = {}
        for job in live:
            if job.episode_id not in closed:
                closed[job.episode_id] = not await self._episode_running(job.episode_id)
        orphans = [
            OrphanJob(
                ref=job.ref,
                episode_id=job.episode_id,
                job_id=job.job_id,
                role=job.role,
                stage=job.stage,
            )
            for job in live
            if closed[job.episode_id]
        ]
        for orphan in orphans:
            activity.logger.warning(
                "orphan job %s of closed episode %s (%s)",
                orphan.ref,
                orphan.episode_id,
                orphan.stage,
            )
        return OrphanSearch(checked=len(live), orphans=orphans)

    @activity.defn
    @agent_errors
    async def cancel_orphan_job(self, orphan: OrphanJob) -> BackendJob:
        return await self._backend.cancel(orphan.ref, datetime.now(UTC))

    async def _episode_running(self, episode_id: str) -> bool:
        if not episode_id:
            return False  # our label without an episode: nothing can ever cancel it
        handle = self._client.get_workflow_handle(episode_workflow_id(episode_id))
        try:
            description = await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return description.status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING

    def ensure_schedule_soon(self, task_queue: str, every: timedelta = REAPER_EVERY) -> None:
        """Create the reaper's Schedule in the background of the running event loop (the worker
        is built synchronously); a failure is logged, and the next worker start tries again."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            log.warning("no event loop: the orphan reaper's schedule was not created")
            return
        task = loop.create_task(ensure_reaper_schedule(self._client, task_queue, every))
        task.add_done_callback(_log_failure)
        self.schedule_task = task


def _log_failure(task: asyncio.Task[str]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("the orphan reaper's schedule was not created: %s", task.exception())


async def ensure_reaper_schedule(
    client: Client, task_queue: str, every: timedelta = REAPER_EVERY
) -> str:
    """Create the Schedule that runs ReaperWorkflow every `every` (kept if it exists already).
    Returns its id."""
    from workflows.reaper import ReaperInput, ReaperWorkflow

    schedule_id = reaper_schedule_id(client.namespace, task_queue)
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            ReaperWorkflow.run,
            ReaperInput(),
            id=f"posttrain-reaper-run/{client.namespace}/{task_queue}",
            task_queue=task_queue,
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )
    try:
        await client.create_schedule(schedule_id, schedule)
        log.info("orphan reaper scheduled every %s (%s)", every, schedule_id)
    except ScheduleAlreadyRunningError:
        pass
    return schedule_id
