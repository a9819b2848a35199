"""How a worker is put together: backends from settings, and the calls an activity makes to
another workflow, implemented with a Temporal client (`activities/ports.py`).

Every workflow-to-workflow call that an activity makes is listed in this module:

- `TemporalJobWatch.watch`: signal of the job's `EpisodeWorkflow` (`job_changed`, the job
  started) and signal-with-start of the task queue's `WatcherWorkflow` (`watch`);
- `TemporalAccount.admit`: update-with-start of the `AccountWorkflow` (`admit`);
- `TemporalAccount.check_exposure`: update of the `AccountWorkflow` (`check_exposure`);
- `TemporalEpisodeLiveness.is_running`: describe of an `EpisodeWorkflow` (the reaper);
  `.left_behind`: its `job_record` query (the reaper's strays);
- `TemporalEpisodeTrail.read`: describe and history of an `EpisodeWorkflow` (the audit record);
- `TemporalEpisodeCalls.send`: update of an `EpisodeWorkflow` (`call_tool`, to ACCEPTED), a
  rollout's tool call; `.result_of` and `.status`: its queries; `.is_running`: describe;
- `ensure_reaper_schedule`: the Schedule that starts `ReaperWorkflow` (hf backend only);
- `ensure_retention_schedule`: the Schedule that starts `RetentionWorkflow` (every backend that
  keeps job folders).

Workflows reach each other directly (signals and children) and list those calls in their own
modules.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    WithStartWorkflowOperation,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateStage,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError

from activities.backends.interface import JobsBackend
from activities.backends.registry import backend_info
from activities.ports import JobToWatch
from posttrain_common.contracts.audit import AuditRecord
from posttrain_common.contracts.episode_calls import EpisodeStatus, ToolCall, ToolResult
from posttrain_common.contracts.episodes import Caps, ServerSpend
from posttrain_common.contracts.jobs import BackendJob
from posttrain_common.failures import running_description, update_failure, workflow_is_gone
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_server.episode_pages import status_with_every_job
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import SIGNAL_JOB_CHANGED, episode_workflow_id
from workflows.job.watcher import WatcherInput, WatcherWorkflow, WatchRequest
from workflows.job.workflow import JobSnapshot
from workflows.operations.account import AccountState, AccountWorkflow, Admission, ExposureCheck
from workflows.operations.reaper import ReaperInput, ReaperWorkflow
from workflows.operations.retention import RetentionInput, RetentionWorkflow

log = logging.getLogger(__name__)

REAPER_EVERY = timedelta(minutes=10)
# Retention acts on days-old folders: an hourly sweep is prompt enough, and its cap per run
# (POSTTRAIN_RETENTION_MAX_FOLDERS) bounds each run's work.
RETENTION_EVERY = timedelta(hours=1)


class TemporalEpisodeTrail:
    """`activities.ports.EpisodeTrail`: an episode's record, read from its history."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def read(self, episode_id: str) -> AuditRecord:
        from posttrain_server.audit_trail import read_trail

        return await read_trail(self._client, episode_id)


# -- backends ------------------------------------------------------------------------------------


def make_backend(settings: Settings, key: ServerKey) -> JobsBackend:
    """The backend `POSTTRAIN_BACKEND` names (`key`: the deployment's server key, which names
    the deployment's Hugging Face jobs). Raises UnknownBackend for a name no backend declares,
    SystemExit with a message a person can act on when it cannot be built (e.g. `hf` without
    `HF_TOKEN`)."""
    return backend_info(settings.backend).build(settings, key)


# -- what activities ask of other workflows ---------------------------------------------------


class WatcherSettings(BaseModel):
    workflow_id: str
    interval_s: float = 30.0
    min_interval_s: float | None = None  # see WatcherInput
    # An idle watcher exits after this long with nothing to watch.
    idle_exit_s: float = 60.0


class TemporalJobWatch:
    """`JobWatch`: signal-with-start of the task queue's watcher."""

    def __init__(self, client: Client, watcher: WatcherSettings, task_queue: str) -> None:
        self._client = client
        self._watcher = watcher
        self._task_queue = task_queue

    async def watch(self, job: JobToWatch) -> None:
        if job.started is not None:
            await self._tell_episode(job, job.started)
        await self._client.start_workflow(
            WatcherWorkflow.run,
            WatcherInput(
                interval_s=self._watcher.interval_s,
                min_interval_s=self._watcher.min_interval_s,
                idle_exit_s=self._watcher.idle_exit_s,
            ),
            id=job.watcher_workflow_id or self._watcher.workflow_id,
            task_queue=self._task_queue,
            start_signal="watch",
            start_signal_args=[
                WatchRequest(
                    ref=job.ref,
                    workflow_id=job.job_workflow_id,
                    state=job.state,
                    job_id=job.job_id,
                    episode_workflow_id=episode_workflow_id(job.episode_id),
                )
            ],
        )

    async def _tell_episode(self, job: JobToWatch, started: BackendJob) -> None:
        """The job started: its episode is told before the watcher can report a later state
        (reports never move a job back, so the order only saves a report)."""
        handle = self._client.get_workflow_handle(episode_workflow_id(job.episode_id))
        snapshot = JobSnapshot(
            job_id=job.job_id, state=started.state, backend=started, message=started.message
        )
        try:
            await handle.signal(SIGNAL_JOB_CHANGED, snapshot)
        except RPCError as err:
            if not workflow_is_gone(err):
                raise  # the activity retries; the submit finds the job by its key
            log.warning(
                "episode %s is gone; the start of job %s not reported", job.episode_id, job.job_id
            )


class TemporalAccount:
    """`ServerAccount`: the account workflow of this task queue, by update."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue

    async def admit(self, episode_id: str, caps: Caps) -> None:
        start = WithStartWorkflowOperation(
            AccountWorkflow.run,
            AccountState(),
            id=caps.account_workflow_id,
            task_queue=self._task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        try:
            await self._client.execute_update_with_start_workflow(
                AccountWorkflow.admit,
                Admission(
                    episode_id=episode_id,
                    max_live_episodes=caps.max_live_episodes,
                    spend_cap_micro_usd=caps.spend_cap_micro_usd,
                ),
                start_workflow_operation=start,
            )
        except WorkflowUpdateFailedError as err:
            raise update_failure(err, "the server's account") from None

    async def check_exposure(self, spend: ServerSpend) -> None:
        handle = self._client.get_workflow_handle_for(
            AccountWorkflow.run, spend.account_workflow_id
        )
        try:
            await handle.execute_update(
                AccountWorkflow.check_exposure,
                ExposureCheck(
                    episode_id=spend.episode_id,
                    committed_micro_usd=spend.committed_micro_usd,
                    cap_micro_usd=spend.cap_micro_usd,
                ),
            )
        except WorkflowUpdateFailedError as err:
            raise update_failure(err, "the server's account") from None


class TemporalEpisodeLiveness:
    """`EpisodeLiveness`: describe the episode's workflow."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def is_running(self, episode_id: str) -> bool:
        handle = self._client.get_workflow_handle(episode_workflow_id(episode_id))
        return await running_description(handle) is not None

    async def left_behind(self, episode_id: str, job_id: str, ref: str) -> bool:
        handle = self._client.get_workflow_handle_for(
            EpisodeWorkflow.run, episode_workflow_id(episode_id)
        )
        try:
            record = await handle.query(
                EpisodeWorkflow.job_record, job_id, rpc_timeout=timedelta(seconds=10)
            )
        except (RPCError, WorkflowQueryFailedError) as err:
            log.warning("could not ask episode %s about job %s: %s", episode_id, job_id, err)
            return False
        return record is not None and record.final and record.backend_ref != ref


class TemporalEpisodeCalls:
    """`EpisodeCalls`: a rollout's tool calls, as the gateway makes them (update id
    `<episode_id>:<request_id>`), sent to ACCEPTED only: the answer is read back later."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def _handle(self, episode_id: str):  # type: ignore[no-untyped-def]
        return self._client.get_workflow_handle_for(
            EpisodeWorkflow.run, episode_workflow_id(episode_id)
        )

    async def send(self, episode_id: str, call: ToolCall) -> bool:
        try:
            await self._handle(episode_id).start_update(
                EpisodeWorkflow.call_tool,
                call,
                id=f"{episode_id}:{call.request_id}",
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            )
        except (WorkflowUpdateFailedError, RPCError) as err:
            if workflow_is_gone(err):
                return False
            raise
        return True

    async def result_of(self, episode_id: str, request_id: str) -> ToolResult | None:
        return await self._handle(episode_id).query(EpisodeWorkflow.result_of, request_id)

    async def status(self, episode_id: str) -> EpisodeStatus:
        """The episode with every job (a rollout's record lists their ids): its pages."""
        return await status_with_every_job(self._handle(episode_id))

    async def is_running(self, episode_id: str) -> bool:
        return await TemporalEpisodeLiveness(self._client).is_running(episode_id)


# -- Schedules: the orphan reaper (hf backend) and retention (every backend) -------------------


def reaper_schedule_id(namespace: str, task_queue: str) -> str:
    return f"posttrain-reaper/{namespace}/{task_queue}"


def retention_schedule_id(namespace: str, task_queue: str) -> str:
    return f"posttrain-retention/{namespace}/{task_queue}"


async def ensure_reaper_schedule(
    client: Client,
    task_queue: str,
    every: timedelta = REAPER_EVERY,
    *,
    orphans: bool = True,
) -> str:
    """Create the Schedule that runs ReaperWorkflow every `every` (kept if it exists already):
    the reconciler, and the orphan reaper when `orphans` (the backend lists its live jobs).
    Returns its id."""
    action = ScheduleActionStartWorkflow(
        ReaperWorkflow.run,
        # The watcher's and the account's closed runs are merged for about two periods.
        ReaperInput(orphans=orphans, singleton_lookback_s=2.5 * every.total_seconds()),
        id=f"posttrain-reaper-run/{client.namespace}/{task_queue}",
        task_queue=task_queue,
    )
    schedule_id = reaper_schedule_id(client.namespace, task_queue)
    return await _ensure_schedule(client, schedule_id, action, every, "reconciler")


async def ensure_retention_schedule(
    client: Client, task_queue: str, every: timedelta = RETENTION_EVERY
) -> str:
    """Create the Schedule that runs RetentionWorkflow every `every` (kept if it exists
    already; its runs read the policy from the worker's settings, so changing them needs no new
    Schedule). Returns its id."""
    action = ScheduleActionStartWorkflow(
        RetentionWorkflow.run,
        RetentionInput(),
        id=f"posttrain-retention-run/{client.namespace}/{task_queue}",
        task_queue=task_queue,
    )
    schedule_id = retention_schedule_id(client.namespace, task_queue)
    return await _ensure_schedule(client, schedule_id, action, every, "retention sweep")


async def _ensure_schedule(
    client: Client,
    schedule_id: str,
    action: ScheduleActionStartWorkflow,
    every: timedelta,
    what: str,
) -> str:
    schedule = Schedule(
        action=action,
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        # A run still going when the next is due: the next is skipped, never doubled.
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )
    try:
        await client.create_schedule(schedule_id, schedule)
        log.info("%s scheduled every %s (%s)", what, every, schedule_id)
    except ScheduleAlreadyRunningError:
        pass
    return schedule_id


def schedule_reaper_soon(
    client: Client, task_queue: str, every: timedelta = REAPER_EVERY, *, orphans: bool = True
) -> asyncio.Task[str] | None:
    """Create the reaper's Schedule in the background of the running event loop (the worker is
    built synchronously); a failure is logged, and the next worker start tries again. None when
    no loop runs (nothing is attempted)."""
    return _soon(
        ensure_reaper_schedule(client, task_queue, every, orphans=orphans), "the reconciler"
    )


def schedule_retention_soon(
    client: Client, task_queue: str, every: timedelta = RETENTION_EVERY
) -> asyncio.Task[str] | None:
    """As `schedule_reaper_soon`, for the retention sweep's Schedule."""
    return _soon(ensure_retention_schedule(client, task_queue, every), "the retention sweep")


def _soon(creating: Coroutine[Any, Any, str], what: str) -> asyncio.Task[str] | None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        creating.close()  # never awaited: closed, so no "never awaited" warning
        log.warning("no event loop: the schedule of %s was not created", what)
        return None
    task = loop.create_task(creating)
    task.add_done_callback(lambda done: _log_failure(done, what))
    return task


def _log_failure(task: asyncio.Task[str], what: str) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("the schedule of %s was not created: %s", what, task.exception())
