"""CampaignWorkflow: N rollouts over tasks x agents x epochs, at most `concurrency` in flight,
within a dollar budget; nothing run or paid twice.

Workflow id `campaign/<campaign id>`. It plans first (the tasks and the budget checked, each
task's base model pinned to a commit, every agent built once in the agent worker); a spec that
cannot run ends the campaign `invalid` before anything starts. Then a sliding window (as in
temporalio/samples-python `batch_sliding_window`): each rollout attempt is an ABANDON child with
a deterministic id, admitted against the budget (`rules.py`, beside it), and reports its end by
signal; the campaign continues as new when its history grows long, carrying only its counters,
the in-flight set and the retries waiting. Cancelling the campaign cancels every rollout in
flight, and through their episodes every job, and waits until they have all ended.

`campaign retry --only unscored|errors` (the `retry` update) gives the rollouts whose deciding
attempt ended so a new attempt, numbered after the latest in the records (an activity reads
them): a new workflow id, so no finished attempt runs twice, admitted against the budget as any
other. A campaign that has finished is started again under the same id with `reopen` (the
`REJECT_DUPLICATE` of `run` is only for `run`): it does not plan again but rebuilds its counters
from its records and takes the plan pinned in `campaign.json`, so its spend so far still counts
against the budget; it starts no rollout that never ran (a budget stop stays one), only the
retries, and ends when they have.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, FailureError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import AgentsApi, CampaignsApi
    from posttrain_common.contracts.campaigns import (
        CheckAgents,
        PickRetries,
        PlanCampaign,
        ReopenCampaign,
    )
    from posttrain_env.limits import (
        CONTINUE_AS_NEW_HISTORY_BYTES,
        MAX_QUEUED_RETRIES,
        MAX_RETRIES_PER_REQUEST,
    )
    from workflows.campaign.contract import (
        CampaignCarry,
        CampaignInput,
        CampaignPhase,
        CampaignStatus,
        Reopen,
        RetryAnswer,
        RetryRequest,
    )
    from workflows.campaign.retries import busy_indexes, queue_retries, reopen_carry
    from workflows.campaign.rollout import RolloutWorkflow
    from workflows.campaign.rollout_contract import RolloutResult
    from workflows.campaign.rules import (
        Start,
        final_phase,
        finished,
        invalid,
        next_run,
        next_start,
        nothing_left,
        rollout_input,
        seconds_to_next_retry,
        started,
        status,
        to_cancel,
    )
    from workflows.cancellation import unawaited_child
    from workflows.history import history_is_long
    from workflows.ids import SIGNAL_ROLLOUT_FINISHED, rollout_workflow_id
    from workflows.policies import READ_RETRY, READ_TIMEOUT
    from workflows.waiting import Alarm

# The new attempts waiting in the carry are capped (MAX_QUEUED_RETRIES, issue 27): runs
# recorded before queued every one.
RETRY_QUEUE_CAP_PATCH = "pt-campaign-retry-queue-cap-1"
# Building every agent once in the agent worker (each in its own process).
CHECK_AGENTS_TIMEOUT = timedelta(minutes=10)


@workflow.defn
class CampaignWorkflow:
    @workflow.init
    def __init__(self, inp: CampaignInput) -> None:
        self._inp = inp
        self._s = inp.carry or CampaignCarry(created_at=workflow.now())
        self._changed = False
        self._told_to_cancel: set[str] = set()
        self._alarm = Alarm()
        self._closing = False  # nothing left to run: no retry is taken any more

    @workflow.run
    async def run(self, inp: CampaignInput) -> CampaignStatus:
        s = self._s
        if s.phase is CampaignPhase.planning:
            if not await (self._reopen(inp.reopen) if inp.reopen else self._plan()):
                return self.status()
            if inp.retry is not None:
                await self._queue_retries(inp.retry)
        while True:
            try:
                await self._step()
                if not s.in_flight and nothing_left(inp, s):
                    # A retry taken before this point may still be picking its rollouts.
                    self._closing = True
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    if not s.in_flight and nothing_left(inp, s):
                        break
                    self._closing = False
                    continue
                if self._history_is_long():
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    workflow.continue_as_new(next_run(inp, s))
                await self._wait_for_change()
            except asyncio.CancelledError:
                # Cancelled through Temporal (the UI, `temporal workflow cancel`): as `cancel`.
                s.cancel_requested = True
        s.phase = final_phase(s)
        s.finished_at = workflow.now()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    # -- updates, signals, queries -------------------------------------------------------------

    @workflow.update
    def cancel(self) -> CampaignStatus:
        """Stop scheduling, cancel every rollout in flight (their episodes end, their jobs are
        cancelled); the campaign ends `cancelled` once they all have."""
        if not self._s.phase.final:
            self._s.cancel_requested = True
            self._changed = True
        return self.status()

    @workflow.update
    async def retry(self, request: RetryRequest) -> RetryAnswer:
        """Give every rollout whose deciding attempt ended as `request.only` selects (and that
        is not in flight or waiting already) a new attempt."""
        return await self._queue_retries(request)

    @retry.validator
    def _retry_allowed(self, request: RetryRequest) -> None:
        s = self._s
        if self._closing or s.phase.final or s.cancel_requested or s.plan is None:
            # The CLI then waits for the end and starts the campaign again (`reopen`).
            raise ValueError(f"campaign is {s.phase.value}: not taking retries")

    @workflow.signal(name=SIGNAL_ROLLOUT_FINISHED)
    def rollout_finished(self, result: RolloutResult) -> None:
        if finished(self._inp, self._s, result, workflow.now(), self._queue_cap()):
            self._changed = True

    @workflow.query
    def status(self) -> CampaignStatus:
        return status(self._inp, self._s)

    @workflow.query
    def resume_input(self) -> CampaignInput:
        """What a new run needs to go on from here (the reconciler starts one, cancelling, when
        this run was terminated from outside)."""
        return next_run(self._inp, self._s)

    # -- the plan ------------------------------------------------------------------------------

    async def _plan(self) -> bool:
        inp, s = self._inp, self._s
        try:
            s.plan = await workflow.execute_activity_method(
                CampaignsApi.plan_campaign,
                PlanCampaign(campaign_id=inp.campaign_id, spec=inp.spec, created_at=s.created_at),
                start_to_close_timeout=READ_TIMEOUT,
                retry_policy=READ_RETRY,
            )
            await workflow.execute_activity_method(
                AgentsApi.check_agents,
                CheckAgents(agents=list(inp.spec.agents)),
                task_queue=inp.agent_task_queue,
                start_to_close_timeout=CHECK_AGENTS_TIMEOUT,
                retry_policy=READ_RETRY,
            )
        except ActivityError as err:
            invalid(s, _failure_message(err), workflow.now())
            return False
        s.phase = CampaignPhase.running
        return True

    async def _reopen(self, reopen: Reopen) -> bool:
        inp, s = self._inp, self._s
        try:
            reopened = await workflow.execute_activity_method(
                CampaignsApi.reopen_campaign,
                ReopenCampaign(campaign_id=inp.campaign_id, spec=inp.spec),
                start_to_close_timeout=READ_TIMEOUT,
                retry_policy=READ_RETRY,
            )
        except ActivityError as err:
            invalid(s, _failure_message(err), workflow.now())
            return False
        reopen_carry(inp, s, reopen, reopened)
        return True

    async def _queue_retries(self, request: RetryRequest) -> RetryAnswer:
        inp, s = self._inp, self._s
        picks = await workflow.execute_activity_method(
            CampaignsApi.pick_retries,
            PickRetries(
                campaign_id=inp.campaign_id, spec=inp.spec, only=request.only, skip=busy_indexes(s)
            ),
            start_to_close_timeout=READ_TIMEOUT,
            retry_policy=READ_RETRY,
        )
        more = len(picks) >= MAX_RETRIES_PER_REQUEST
        answer = queue_retries(inp, s, request, picks, workflow.now(), more, self._queue_cap())
        self._changed = True
        return answer

    # -- the window ----------------------------------------------------------------------------

    async def _step(self) -> None:
        inp, s = self._inp, self._s
        if s.cancel_requested:
            s.phase = CampaignPhase.cancelling
            for workflow_id in to_cancel(s, self._told_to_cancel):
                await self._tell_to_cancel(workflow_id)
            return
        while (start := next_start(inp, s, workflow.now())) is not None:
            await self._start(start)

    async def _start(self, start: Start) -> None:
        rollout = rollout_input(self._inp, self._s, start)
        started(self._inp, self._s, start)
        try:
            child = await workflow.start_child_workflow(
                RolloutWorkflow.run,
                rollout,
                id=rollout_workflow_id(rollout.rollout_id, rollout.attempt),
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                # An attempt that ran is never run again, whatever happened to this campaign.
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
            unawaited_child(child)  # its end comes by signal
        except WorkflowAlreadyStartedError:
            # Started by an earlier run of this campaign: adopted. Its end comes by signal.
            workflow.logger.info("rollout %s a%d adopted", rollout.rollout_id, rollout.attempt)

    async def _tell_to_cancel(self, workflow_id: str) -> None:
        try:
            await workflow.get_external_workflow_handle(workflow_id).signal(RolloutWorkflow.cancel)
        except FailureError:
            pass  # it has completed: its report is on its way

    async def _wait_for_change(self) -> None:
        seconds = seconds_to_next_retry(self._s, workflow.now())
        if seconds is None:
            await workflow.wait_condition(lambda: self._changed)
        else:
            await self._alarm.wait(lambda: self._changed, seconds)
        self._changed = False

    def _queue_cap(self) -> int | None:
        """How many new attempts may wait in the carry (None in runs recorded before the cap,
        which replay as they ran)."""
        return MAX_QUEUED_RETRIES if workflow.patched(RETRY_QUEUE_CAP_PATCH) else None

    def _history_is_long(self) -> bool:
        return history_is_long(CONTINUE_AS_NEW_HISTORY_BYTES, self._inp.continue_as_new_events)


def _failure_message(err: ActivityError) -> str:
    cause = err.cause
    return cause.message if isinstance(cause, FailureError) else str(err)
