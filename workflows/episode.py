"""EpisodeWorkflow: one episode's ledger, steps, deadline, jobs, evaluations, end and reward.

Tool calls arrive as Updates (update id `<episode_id>:<request_id>`), reads as Queries, an
operator's cancel and a session's end request as Signals. Jobs are ABANDON children that report
back by signal; the episode cancels them explicitly when it ends and stays open until every one
is confirmed final. The tools themselves live in `workflows/episode_tools.py`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from posttrain_env.models import (
        EndReason,
        EpisodeEnd,
        ErrorType,
        ServiceSpend,
        ToolError,
        oversized_error,
        parse_tool_args,
    )
    from workflows.episode_state import (
        EpisodeCarry,
        EpisodeSetup,
        JobRecord,
        ToolCall,
        ToolResult,
    )
    from workflows.episode_tools import EpisodeTools
    from workflows.ids import SIGNAL_EPISODE_CLOSED, SIGNAL_JOB_CHANGED
    from workflows.job import JobSnapshot, JobWorkflow
    from workflows.ledger import Ledger
    from workflows.recent import remember, was_dropped
    from workflows.waiting import wait_until


class EpisodeInput(BaseModel):
    setup: EpisodeSetup
    carry: EpisodeCarry | None = None


class EndRequest(BaseModel):
    reason: EndReason  # reset or cancelled
    # The session to tell when every job is final, or when cancel_confirm_s passed without it.
    reply_to: str | None = None


class EpisodeClosed(BaseModel):
    """Sent to the session: the episode ended; `unconfirmed` names jobs still not cancelled."""

    episode_id: str
    end: EpisodeEnd
    service_spend: ServiceSpend
    unconfirmed: list[str] = []


class EpisodeStatus(BaseModel):
    episode_id: str
    task_id: str
    steps_used: int
    steps_left: int
    time_left_s: float
    done: bool
    end: EpisodeEnd | None
    service_spend: ServiceSpend
    jobs: list[dict[str, Any]]
    cancelling: list[str]


@workflow.defn
class EpisodeWorkflow(EpisodeTools):
    @workflow.init
    def __init__(self, inp: EpisodeInput) -> None:
        self._setup = inp.setup
        budget = inp.setup.task.budget_micro_usd
        self._s = inp.carry or EpisodeCarry(
            started_at=workflow.now(), ledger=Ledger(budget_micro_usd=budget)
        )
        self._reply_to: str | None = None
        self._end_requested_at = None
        self._replied = False
        # Set when the run loop's timer must be recomputed (an end, or an end request).
        self._rearm = False

    @workflow.run
    async def run(self, inp: EpisodeInput) -> EpisodeEnd:
        while True:
            await wait_until(self._should_wake, self._next_timer())
            self._rearm = False
            if self._s.end is None and self._deadline_passed() and not self._s.submitting:
                await self._end(EndReason.time_limit, 0.0)
            await self._reply_if_due()
            if self._s.end is not None and self._all_final():
                await workflow.wait_condition(workflow.all_handlers_finished)
                if self._all_final():
                    break
            if self._history_is_long() and not self._s.submitting:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(EpisodeInput(setup=self._setup, carry=self._s))
        await self._reply_if_due()
        await self._announce_close()
        await self._account_retire()
        assert self._s.end is not None
        return self._s.end

    # -- updates, signals, queries -------------------------------------------------------------

    @workflow.update
    async def call_tool(self, call: ToolCall) -> ToolResult:
        """A tool call from any path; argument and policy errors are answered as data."""
        if call.request_id in self._s.recent:
            return self._s.recent[call.request_id]
        if was_dropped(self._s, call.request_id):
            return self._result(
                call,
                ToolError(
                    ErrorType.already_answered,
                    f"request {call.request_id!r} was already answered and its answer is no "
                    "longer kept; it is not run again (jobs_status shows the jobs)",
                    request_id=call.request_id,
                ).envelope(),
            )
        if self._s.end is None and self._deadline_passed() and not self._s.submitting:
            await self._end(EndReason.time_limit, 0.0)
        if self._s.end is not None:
            return self._result(
                call,
                ToolError(
                    ErrorType.episode_over, "the episode is over; call reset to start another"
                ).envelope(),
            )
        if self._s.steps_used >= self._setup.task.max_steps:
            return self._result(
                call,
                ToolError(
                    ErrorType.limit_reached,
                    "the step limit is reached; the episode ends when the calls in flight finish",
                ).envelope(),
            )
        self._s.steps_used += 1
        try:
            if call.oversized is not None:
                over = call.oversized
                raise oversized_error(call.tool, over.field, over.bytes, over.total_bytes)
            data = await self._dispatch(call.tool, parse_tool_args(call.tool, call.arguments))
        except ToolError as err:
            data = err.envelope()
        if self._s.end is None and self._s.steps_used >= self._setup.task.max_steps:
            await self._end(EndReason.max_steps, 0.0)
        result = self._result(call, data)
        remember(self._s, call.request_id, result)
        return result

    @call_tool.validator
    def _validate_call(self, call: ToolCall) -> None:
        # Only what cannot be a tool call at all is rejected here (it is then not a step).
        if not isinstance(call.arguments, dict):
            raise ValueError("arguments must be an object")

    @workflow.signal(name=SIGNAL_JOB_CHANGED)
    async def job_changed(self, snap: JobSnapshot) -> None:
        record = self._s.jobs.get(snap.job_id)
        if record is None or record.final:
            return
        self._take_snapshot(record, snap)
        await self._account_report()

    @workflow.signal
    async def end_requested(self, request: EndRequest) -> None:
        """A session's reset or close, or an operator's cancel: end now, reward None."""
        if request.reply_to:
            self._reply_to = request.reply_to
            self._replied = False
            self._end_requested_at = workflow.now()
        self._rearm = True
        await self._end(request.reason, None)

    @workflow.query
    def status(self) -> EpisodeStatus:
        now = workflow.now()
        return EpisodeStatus(
            episode_id=self._setup.episode_id,
            task_id=self._setup.task.id,
            steps_used=self._s.steps_used,
            steps_left=self._steps_left(),
            time_left_s=self._time_left_s(),
            done=self._s.end is not None,
            end=self._s.end,
            service_spend=self._spend(),
            jobs=[self._view(r, now).model_dump(mode="json") for r in self._s.jobs.values()],
            cancelling=self._unconfirmed(),
        )

    @workflow.query
    def result_of(self, request_id: str) -> ToolResult | None:
        """The answer to a finished request, while it is among the recent ones remembered."""
        return self._s.recent.get(request_id)

    @workflow.query
    def answered(self, request_id: str) -> bool:
        """True when the request was answered, whether or not its answer is still kept."""
        return request_id in self._s.recent or was_dropped(self._s, request_id)

    # -- ending --------------------------------------------------------------------------------

    async def _end(
        self, reason: EndReason, reward: float | None, invalid_score: str | None = None
    ) -> None:
        """End the episode (once) and cancel every live job explicitly."""
        if self._s.end is None:
            self._s.end = EpisodeEnd(reason=reason, reward=reward, invalid_score=invalid_score)
            self._rearm = True
            workflow.logger.info("episode %s ended: %s", self._setup.episode_id, reason.value)
        for record in list(self._s.jobs.values()):
            if record.live:
                await self._cancel_job(record)

    async def _cancel_job(self, record: JobRecord) -> None:
        handle = workflow.get_external_workflow_handle(record.workflow_id)
        try:
            await handle.signal(JobWorkflow.cancel)
        except FailureError:
            pass  # the job's workflow already finished; its final snapshot is on the way

    def _should_wake(self) -> bool:
        if self._rearm:
            return True
        if self._s.end is not None:
            return self._all_final()
        return self._history_is_long() and not self._s.submitting

    def _history_is_long(self) -> bool:
        info = workflow.info()
        if info.get_current_history_size() >= self._setup.continue_as_new_bytes:
            return True  # Temporal terminates a workflow whose history reaches 50 MB
        limit = self._setup.continue_as_new_events
        if limit is not None:
            return info.get_current_history_length() >= limit
        return info.is_continue_as_new_suggested()

    def _next_timer(self) -> timedelta | None:
        if self._s.end is None:
            if self._s.submitting and self._deadline_passed():
                return None  # a submit in flight at the deadline finishes and counts
            return max(self._deadline() - workflow.now(), timedelta(seconds=1))
        if self._reply_to and not self._replied and self._end_requested_at is not None:
            due = self._end_requested_at + timedelta(seconds=self._setup.cancel_confirm_s)
            return max(due - workflow.now(), timedelta(seconds=1))
        return None

    async def _reply_if_due(self) -> None:
        """Tell the session the episode is closed, or which jobs did not confirm in time."""
        if self._reply_to is None or self._replied or self._s.end is None:
            return
        due = self._end_requested_at is not None and workflow.now() >= (
            self._end_requested_at + timedelta(seconds=self._setup.cancel_confirm_s)
        )
        if not self._all_final() and not due:
            return
        self._replied = True
        closed = EpisodeClosed(
            episode_id=self._setup.episode_id,
            end=self._s.end,
            service_spend=self._spend(),
            unconfirmed=self._unconfirmed(),
        )
        try:
            await workflow.get_external_workflow_handle(self._reply_to).signal(
                SIGNAL_EPISODE_CLOSED, closed
            )
        except FailureError:
            workflow.logger.warning("session of episode %s is gone", self._setup.episode_id)

    async def _announce_close(self) -> None:
        """Tell the session the episode is closed, so that it never signals a completed run."""
        session = self._setup.session_workflow_id
        if session is None or (
            self._reply_to == session and self._replied and not self._unconfirmed()
        ):
            return
        assert self._s.end is not None
        closed = EpisodeClosed(
            episode_id=self._setup.episode_id, end=self._s.end, service_spend=self._spend()
        )
        try:
            await workflow.get_external_workflow_handle(session).signal(
                SIGNAL_EPISODE_CLOSED, closed
            )
        except FailureError:
            workflow.logger.warning("session of episode %s is gone", self._setup.episode_id)
