"""`StrandedWorkflows` (activities/ports.py) on a Temporal client: the reconciler's Temporal side.

A run terminated from outside (or timed out) is read back by a query (the worker replays its
history up to the termination): its `resume_input` is what a new run needs to go on from there.
An episode, a campaign, a rollout or a job is started again under its id with that input, told
to wind down (end as an operator's cancel; a job: cancel the backend job and report its end);
the watcher's jobs and the account's live episodes are merged into the running singleton by the
signals those take anyway. Only the latest run of an id is wound down, so a run is never wound
down twice.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from posttrain_common.contracts.episode_calls import EndRequest
from posttrain_common.contracts.reconcile import (
    SINGLETONS,
    WIND_DOWN_ORDER,
    FindStranded,
    StrandedRun,
    StrandedSearch,
)
from posttrain_env.models import EndReason
from workflows.campaign.rollout import RolloutWorkflow
from workflows.campaign.workflow import CampaignWorkflow
from workflows.episode.operator import WindDown
from workflows.episode.session import SessionWorkflow
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import episode_workflow_id
from workflows.job.watcher import WatcherInput, WatcherWorkflow
from workflows.job.workflow import JobSnapshot, JobWorkflow, job_memo, job_start_attributes
from workflows.operations.account import AccountState, AccountWorkflow, Exposure

log = logging.getLogger(__name__)
CLOSED_FROM_OUTSIDE = ("Terminated", "TimedOut")


def stranded_query(task_queue: str, since: datetime) -> str:
    types = ", ".join(f"'{name}'" for name in WIND_DOWN_ORDER)
    statuses = ", ".join(f"'{status}'" for status in CLOSED_FROM_OUTSIDE)
    stamp = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        f"WorkflowType IN ({types}) AND ExecutionStatus IN ({statuses}) "
        f"AND TaskQueue = '{task_queue}' AND CloseTime > '{stamp}'"
    )


class TemporalStrandedWorkflows:
    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue

    # -- finding -----------------------------------------------------------------------------

    async def find(self, request: FindStranded) -> StrandedSearch:
        now = datetime.now(UTC)
        since = now - timedelta(seconds=request.lookback_s)
        singleton_since = now - timedelta(seconds=request.singleton_lookback_s)
        search = StrandedSearch()
        query = stranded_query(self._task_queue, since)
        async for execution in self._client.list_workflows(query, limit=request.limit):
            search.checked += 1
            if execution.workflow_type in SINGLETONS:
                closed = execution.close_time
                if closed is None or closed < singleton_since:
                    continue
            elif not await self._is_latest(execution):
                continue  # wound down already, or started again by its owner
            search.runs.append(
                StrandedRun(
                    workflow_id=execution.id,
                    run_id=execution.run_id,
                    workflow_type=execution.workflow_type,
                    status=execution.status.name if execution.status else "UNKNOWN",
                    closed_at=execution.close_time,
                )
            )
        order = {name: n for n, name in enumerate(WIND_DOWN_ORDER)}
        search.runs.sort(key=lambda run: (order[run.workflow_type], run.closed_at or now))
        return search

    async def _is_latest(self, execution: WorkflowExecution) -> bool:
        latest = await self._client.get_workflow_handle(execution.id).describe()
        return latest.run_id == execution.run_id

    # -- winding down ------------------------------------------------------------------------

    async def wind_down(self, run: StrandedRun) -> str:
        handle = self._client.get_workflow_handle(run.workflow_id, run_id=run.run_id)
        kind = run.workflow_type
        if kind == "EpisodeWorkflow":
            episode = await handle.query(EpisodeWorkflow.resume_input)
            reports = await self._reports_nobody_heard(episode.carry)
            episode.wind_down = WindDown(reports=reports, previous_run_id=run.run_id)
            done = await self._start_again(EpisodeWorkflow.run, episode, run)
            return f"{done} to end as cancelled_by_operator ({len(reports)} job reports taken)"
        if kind == "JobWorkflow":
            job = await handle.query(JobWorkflow.resume_input)
            extra: dict[str, Any] = {}
            if job.visible:  # as the episode starts it: memo and first attributes at start
                attrs = job_start_attributes(job)
                extra = {
                    "memo": job_memo(job),
                    "search_attributes": TypedSearchAttributes(
                        [SearchAttributePair(k, v) for k, v in attrs.items()]
                    ),
                }
            done = await self._start_again(JobWorkflow.run, job, run, **extra)
            return f"{done} to cancel backend job and report its end"
        if kind == "RolloutWorkflow":
            rollout = await handle.query(RolloutWorkflow.resume_input)
            if rollout.carry is not None:
                rollout.carry.cancel_requested = True
            return f"{await self._start_again(RolloutWorkflow.run, rollout, run)} to end cancelled"
        if kind == "CampaignWorkflow":
            campaign = await handle.query(CampaignWorkflow.resume_input)
            if campaign.carry is not None:
                campaign.carry.cancel_requested = True
            done = await self._start_again(CampaignWorkflow.run, campaign, run)
            return f"{done} to cancel its rollouts and end cancelled"
        if kind == "WatcherWorkflow":
            return await self._merge_watcher(await handle.query(WatcherWorkflow.resume_input), run)
        if kind == "SessionWorkflow":
            return await self._end_session_episode(
                await handle.query(SessionWorkflow.current_episode)
            )
        if kind == "AccountWorkflow":
            return await self._merge_account(await handle.query(AccountWorkflow.resume_input), run)
        raise ValueError(f"no wind-down for workflow type {kind!r}")

    async def _start_again(self, run_fn: Any, inp: Any, run: StrandedRun, **extra: Any) -> str:
        try:
            await self._client.start_workflow(
                run_fn,
                inp,
                id=run.workflow_id,
                task_queue=self._task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                **extra,
            )
        except WorkflowAlreadyStartedError:
            return "already running again"
        return "started again"

    async def _reports_nobody_heard(self, carry: Any) -> list[JobSnapshot]:
        """The final snapshots of the episode's live jobs whose workflows completed while no run
        of the episode was there to hear them."""
        reports: list[JobSnapshot] = []
        if carry is None:
            return reports
        for record in carry.jobs.values():
            if record.final:
                continue
            handle = self._client.get_workflow_handle_for(JobWorkflow.run, record.workflow_id)
            try:
                described = await handle.describe()
            except RPCError as err:
                if err.status is RPCStatusCode.NOT_FOUND:
                    continue
                raise
            if described.status is WorkflowExecutionStatus.COMPLETED:
                reports.append(await handle.result())
        return reports

    async def _merge_watcher(self, watcher: WatcherInput, run: StrandedRun) -> str:
        """Hand the closed watcher's jobs to the running one (started if none runs)."""
        handed = 0
        for request in watcher.watched.values():
            if not await self._running(request.workflow_id):
                continue  # its job's workflow is gone: nobody to tell of its end
            await self._client.start_workflow(
                WatcherWorkflow.run,
                watcher.model_copy(update={"watched": {}}),
                id=run.workflow_id,
                task_queue=self._task_queue,
                start_signal="watch",
                start_signal_args=[request],
            )
            handed += 1
        return f"{handed} of its {len(watcher.watched)} jobs handed to the running watcher"

    async def _merge_account(self, account: AccountState, run: StrandedRun) -> str:
        """Count the closed account's episodes that still run in the running account."""
        handed = 0
        for episode_id, committed in account.live.items():
            if not await self._running(episode_workflow_id(episode_id)):
                continue
            await self._client.start_workflow(
                AccountWorkflow.run,
                AccountState(),
                id=run.workflow_id,
                task_queue=self._task_queue,
                start_signal="adopt",
                start_signal_args=[Exposure(episode_id=episode_id, committed_micro_usd=committed)],
            )
            handed += 1
        return f"{handed} of its {len(account.live)} live episodes handed to the running account"

    async def _end_session_episode(self, episode_id: str | None) -> str:
        """A terminated session's client is gone: its episode ends as an operator's cancel."""
        if episode_id is None or not await self._running(episode_workflow_id(episode_id)):
            return "no live episode"
        handle = self._client.get_workflow_handle(episode_workflow_id(episode_id))
        await handle.signal(
            EpisodeWorkflow.end_requested, EndRequest(reason=EndReason.cancelled_by_operator)
        )
        return f"its episode {episode_id} told to end as cancelled_by_operator"

    async def _running(self, workflow_id: str) -> bool:
        try:
            described = await self._client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status is RPCStatusCode.NOT_FOUND:
                return False
            raise
        return described.status is WorkflowExecutionStatus.RUNNING
