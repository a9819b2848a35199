"""EpisodeWorkflow: one episode's steps, deadline, end and reward.

Tool calls arrive as Updates (update id `<episode_id>:<request_id>`), reads as Queries, an
operator's cancel and a session's end request as Signals. The tools are `EpisodeTools`
(`tools.py`), the jobs `EpisodeJobs` (`jobs.py`), what it sends besides its answers
`EpisodeOutbox` (`outbox.py`: its session's reply, the close announcement, the audit record);
the rules, views and timers are pure functions (`rules.py`, `timing.py`), all beside it in
workflows/episode/. This module holds the life of the episode: counting steps, ending it
(once) and staying open until every job is confirmed final, continuing as new when the history
grows long.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.episode_calls import (
        EndRequest,
        EpisodeStatus,
        JobsPage,
        ToolCall,
        ToolResult,
        episode_over,
    )
    from posttrain_common.contracts.jobs import LateJob
    from posttrain_common.contracts.operator import (
        OperatorAction,
        OperatorOutcome,
        OperatorRequest,
        OperatorVerb,
    )
    from posttrain_env.errors import ErrorType, ToolError
    from posttrain_env.models import ContaminationSummary, EndReason, EpisodeEnd, ReplayMiss
    from posttrain_env.tools import oversized_error, unencodable_error
    from workflows.episode.contract import EpisodeInput
    from workflows.episode.jobs import EpisodeJobs
    from workflows.episode.ledger import Ledger
    from workflows.episode.operator import (
        SESSION_CANCEL_REASON,
        TEMPORAL_CANCEL_REASON,
        WIND_DOWN_REASON,
        WindDown,
        action_of,
        confirm_gone,
        pending_cancellations,
        refusal,
        remember_action,
        settle_late_job,
    )
    from workflows.episode.outbox import EpisodeOutbox
    from workflows.episode.payload_guard import bounded_answer, fit_carry
    from workflows.episode.recent import remember, was_dropped
    from workflows.episode.rules import all_final, already_answered, episode_status, tool_result
    from workflows.episode.state import EpisodeCarry, JobRecord
    from workflows.episode.timing import next_timer, out_of_time
    from workflows.episode.tools import EpisodeTools
    from workflows.history import history_is_long
    from workflows.ids import SIGNAL_JOB_CHANGED, SIGNAL_LATE_JOB_SETTLED
    from workflows.job.workflow import JobSnapshot
    from workflows.operations.visibility import Visibility, episode_attributes, episode_memo
    from workflows.waiting import wait_until


AUDIT_PATCH = "pt-audit-1"
# A cancel of the episode's workflow from outside (the Temporal UI, `temporal workflow cancel`)
# ends it as an operator's cancel and lets it close as usual. Histories recorded before this
# closed at such a cancel, and replay so.
OUTSIDE_CANCEL_PATCH = "pt-outside-cancel-1"


@workflow.defn
class EpisodeWorkflow:
    @workflow.init
    def __init__(self, inp: EpisodeInput) -> None:
        self._setup = inp.setup
        budget = inp.setup.task.budget_micro_usd
        storage = inp.setup.storage
        self._s = inp.carry or EpisodeCarry(
            started_at=workflow.now(),
            ledger=Ledger(
                budget_micro_usd=budget,
                storage_cap_bytes=storage.cap_bytes if storage else None,
            ),
        )
        self._jobs = EpisodeJobs(self._setup, self._s)
        self._tools = EpisodeTools(self._setup, self._s, self._jobs, self._end)
        self._outbox = EpisodeOutbox(self._setup, self._s)
        # Set when the run loop's timer must be recomputed (an end, or an end request).
        self._rearm = False
        self._visibility = Visibility()

    @workflow.run
    async def run(self, inp: EpisodeInput) -> EpisodeEnd:
        known_runs = self._jobs.asks_known_runs()  # first: it implies the patches below
        self._jobs.visible = self._visibility.enable(episode_memo(self._setup), taken=known_runs)
        if known_runs:  # jobs whose runs are known change on time by themselves
            self._known = asyncio.ensure_future(self._jobs.follow_known(self._known_changed))
        if inp.wind_down is not None:
            await self._wind_down(inp.wind_down)
        while True:
            try:
                return await self._live()
            except asyncio.CancelledError:
                if not workflow.patched(OUTSIDE_CANCEL_PATCH):
                    raise
                # Temporal delivers a workflow's cancellation once: the next pass runs to its end.
                await self._cancelled_from_outside()

    async def _live(self) -> EpisodeEnd:
        while True:
            self._show()
            timer = next_timer(self._setup, self._s, self._outbox.reply, workflow.now())
            await wait_until(self._should_wake, timer)
            self._rearm = False
            await self._end_if_out_of_time()
            await self._outbox.reply_if_due()
            if self._s.end is not None and all_final(self._s):
                await workflow.wait_condition(workflow.all_handlers_finished)
                if all_final(self._s):
                    break
            if self._history_is_long() and not self._s.submitting:
                await workflow.wait_condition(workflow.all_handlers_finished)
                fit_carry(self._setup, self._s)  # the last guard below Temporal's limit
                workflow.continue_as_new(EpisodeInput(setup=self._setup, carry=self._s))
        await self._outbox.reply_if_due()
        await self._outbox.announce_close()
        await self._jobs.account_retire()
        if self._jobs.known_runs or workflow.patched(AUDIT_PATCH):
            await self._outbox.write_audit()
        self._show(closing=True)
        assert self._s.end is not None
        return self._s.end

    # -- updates, signals, queries -------------------------------------------------------------

    @workflow.update
    async def call_tool(self, call: ToolCall) -> ToolResult:
        """A tool call from any path; argument and policy errors are answered as data. A call
        with `reply_to` (a rollout's) is followed by a `ToolAnswered` signal to that workflow."""
        result = await self._call_tool(call)
        if call.reply_to is not None:
            await self._outbox.tell_answered(call.reply_to, call.request_id)
        return result

    async def _call_tool(self, call: ToolCall) -> ToolResult:
        if call.request_id in self._s.recent:
            return self._s.recent[call.request_id]
        if was_dropped(self._s, call.request_id):
            return self._answer(call, already_answered(call.request_id).envelope())
        if self._jobs.advance_known():  # how the known jobs stand now, before any answer
            await self._known_changed()
        await self._end_if_out_of_time()
        if self._s.end is not None:
            return self.answer_again(call) or self._answer(
                call, episode_over(self._s.end).envelope()
            )
        # A long call sent again, attached to the work in flight, is no step (EpisodeTools).
        refused = call.oversized is not None or call.unencodable is not None
        step = refused or not self._tools.takes_no_step(call.tool, call.arguments)
        if step and self._s.steps_used >= self._setup.task.max_steps:
            limit = ToolError(
                ErrorType.limit_reached,
                "the step limit is reached; the episode ends when the calls in flight finish",
            )
            return self._answer(call, limit.envelope())
        if step:
            self._s.steps_used += 1
        try:
            if call.oversized is not None:
                big = call.oversized
                raise oversized_error(call.tool, big.field, big.bytes, big.total_bytes)
            if call.unencodable is not None:
                raise unencodable_error(call.tool, call.unencodable)
            data = await self._tools.run(call.tool, call.arguments)
        except ToolError as err:
            data = err.envelope()
        if self._s.end is None and self._s.steps_used >= self._setup.task.max_steps:
            await self._end(EndReason.max_steps, 0.0)
        result = bounded_answer(self._answer(call, data))
        remember(self._s, call.request_id, result)
        self._show()
        return result

    @call_tool.validator
    def _validate_call(self, call: ToolCall) -> None:
        # Only what cannot be a tool call at all is rejected here (it is then not a step).
        if not isinstance(call.arguments, dict):
            raise ValueError("arguments must be an object")

    @workflow.signal(name=SIGNAL_JOB_CHANGED)
    async def job_changed(self, snap: JobSnapshot) -> None:
        if self._jobs.take(snap):
            self._show()
            await self._jobs.account_report()

    async def _known_changed(self) -> None:
        """A known job changed as its run said it would: shown, and reported to the account
        as a job's report is."""
        self._show()
        await self._jobs.account_report()

    @workflow.signal
    async def end_requested(self, request: EndRequest) -> None:
        """A session's reset or close, or an operator's cancel: end now, reward None. A
        rollout's `abandoned` (its agent stopped without submitting): reward 0."""
        if request.reply_to:
            self._outbox.reply.requested(request.reply_to, workflow.now())
        self._rearm = True
        if request.reason is EndReason.cancelled_by_operator and self._s.end is None:
            live = [r.job_id for r in self._s.jobs.values() if r.live]
            self._remember("temporal_cancel", "temporal", SESSION_CANCEL_REASON, live)
        await self._end(request.reason, 0.0 if request.reason is EndReason.abandoned else None)
        self._show()

    @workflow.update
    async def operator_action(self, request: OperatorRequest) -> OperatorOutcome:
        """An operator's repair (`posttrain-env episodes retry-cancel|confirm-cancelled|end`),
        kept with who asked and why for the audit record."""
        action = action_of(request, workflow.now())
        if request.action == "retry_cancel":
            pending = pending_cancellations(self._s)
            for record in pending:
                await self._jobs.retry_cancel(record)
            action.jobs = [r.job_id for r in pending]
            message = f"asked the backend again to cancel {', '.join(action.jobs)}"
        elif request.action == "confirm_cancelled":
            record = self._s.jobs[request.job_id or ""]
            settlement = confirm_gone(
                self._s,
                record,
                request.minutes,
                f"cancellation confirmed by {request.by}: {request.reason}",
            )
            action.settled_micro_usd = settlement.cost_micro_usd if settlement else 0
            await self._jobs.tell_gone(record, request.reason)
            await self._jobs.account_report()
            how = "its worst case" if request.minutes is None else f"{request.minutes} min"
            message = (
                f"job {record.job_id} confirmed cancelled and settled at {how} "
                f"({action.settled_micro_usd} micro-USD)"
            )
        else:
            action.jobs = [r.job_id for r in self._s.jobs.values() if r.live]
            await self._end(EndReason.cancelled_by_operator, None)
            message = "ended (cancelled_by_operator); its live jobs are being cancelled"
        remember_action(self._s, action)
        self._rearm = True
        self._show()
        return OperatorOutcome(episode_id=self._setup.episode_id, action=action, message=message)

    @operator_action.validator
    def _operator_action_applies(self, request: OperatorRequest) -> None:
        why = refusal(self._setup.episode_id, self._s, request)
        if why is not None:
            raise ValueError(why)

    @workflow.query
    def resume_input(self) -> EpisodeInput:
        """What a new run needs to go on from here (the reconciler starts one, with `wind_down`,
        when this run was terminated from outside)."""
        return EpisodeInput(setup=self._setup, carry=self._s)

    @workflow.signal(name=SIGNAL_LATE_JOB_SETTLED)
    async def late_job_settled(self, late: LateJob) -> None:
        """The reaper cancelled a stray job of ours (`OrphanSearch.strays`): a create that
        landed after its submit gave up, or beside the job it adopted. Its real cost is
        charged now, while the episode runs (not at its close), and the record notes it."""
        record = self._s.jobs.get(late.job_id)
        if record is None or late.ref == record.backend_ref or late.ref in self._s.late_refs:
            return  # not a stray of this episode, or settled already
        self._s.late_refs.append(late.ref)
        settled = settle_late_job(self._setup, self._s, record, late)
        remember_action(
            self._s,
            OperatorAction(
                action="late_job_settled",
                by="reaper",
                reason=(
                    f"a second backend job of {late.job_id} ({late.state or 'live'}) ran "
                    "outside the ledger; the reaper cancelled it"
                ),
                at=workflow.now(),
                job_id=late.job_id,
                minutes=settled.billed_minutes if settled else None,
                settled_micro_usd=settled.cost_micro_usd if settled else None,
            ),
        )
        workflow.logger.warning(
            "episode %s: stray job of %s cancelled by the reaper, settled at %s micro-USD",
            self._setup.episode_id,
            late.job_id,
            settled.cost_micro_usd if settled else 0,
        )
        self._show()
        await self._jobs.account_report()

    @workflow.query
    def job_record(self, job_id: str) -> JobRecord | None:
        """One job as this episode keeps it (the reaper asks whether it still follows it)."""
        return self._s.jobs.get(job_id)

    @workflow.query
    def status(self, page: JobsPage | None = None) -> EpisodeStatus:
        """The episode with one page of its jobs (the first unless `page` names another);
        callers that read every job follow `jobs_next_cursor`."""
        return episode_status(self._setup, self._s, workflow.now(), page)

    @workflow.query
    def result_of(self, request_id: str) -> ToolResult | None:
        """The answer to a finished request, while it is among the recent ones remembered."""
        return self._s.recent.get(request_id)

    @workflow.query
    def answer_again(self, call: ToolCall) -> ToolResult | None:
        """After the end, the answer a long call sent again still gets (a `submit` of the graded
        job: its grading's answer), or None; also asked of a completed episode by the gateway."""
        again = self._tools.answer_after_the_end(call.tool, call.arguments)
        return self._answer(call, again) if again is not None else None

    @workflow.query
    def answered(self, request_id: str) -> bool:
        """True when the request was answered, whether or not its answer is still kept."""
        return request_id in self._s.recent or was_dropped(self._s, request_id)

    # -- the end ---------------------------------------------------------------------------------

    async def _end(
        self,
        reason: EndReason,
        reward: float | None,
        invalid_score: str | None = None,
        *,
        contamination: ContaminationSummary | None = None,
        replay_miss: ReplayMiss | None = None,
    ) -> None:
        """End the episode (once) and cancel every live job explicitly."""
        if self._s.end is None:
            self._s.end = EpisodeEnd(
                reason=reason,
                reward=reward,
                invalid_score=invalid_score,
                contamination=contamination,
                # Jobs replayed from recordings (the replay backend): the reward is not measured.
                replayed=True if any(r.replayed for r in self._s.jobs.values()) else None,
                replay_miss=replay_miss,
                replay_misses=self._s.replay_misses or None,
            )
            self._rearm = True
            workflow.logger.info("episode %s ended: %s", self._setup.episode_id, reason.value)
        await self._jobs.cancel_every_live_job()

    async def _cancelled_from_outside(self) -> None:
        """A cancel through Temporal: end as an operator's cancel (an episode ended already has
        its unconfirmed cancellations asked again now)."""
        workflow.logger.warning(
            "episode %s was cancelled through Temporal: ending it and cancelling its jobs",
            self._setup.episode_id,
        )
        live = [r.job_id for r in self._s.jobs.values() if r.live]
        self._remember("temporal_cancel", "temporal", TEMPORAL_CANCEL_REASON, live)
        for record in pending_cancellations(self._s):
            await self._jobs.retry_cancel(record)
        await self._end(EndReason.cancelled_by_operator, None)
        self._show()

    async def _wind_down(self, wind_down: WindDown) -> None:
        """The reconciler started this run because the last one was terminated: take what the
        jobs reported meanwhile, then end as an operator's cancel."""
        for snap in wind_down.reports:
            self._jobs.take(snap)
        live = [r.job_id for r in self._s.jobs.values() if r.live]
        self._remember("wind_down", "reconciler", WIND_DOWN_REASON, live)
        workflow.logger.warning(
            "episode %s: %s; live jobs %s", self._setup.episode_id, WIND_DOWN_REASON, live
        )
        await self._end(EndReason.cancelled_by_operator, None)

    def _remember(self, verb: OperatorVerb, by: str, reason: str, jobs: list[str]) -> None:
        remember_action(
            self._s,
            OperatorAction(action=verb, by=by, reason=reason, at=workflow.now(), jobs=jobs),
        )

    def _show(self, *, closing: bool = False) -> None:
        """Keep the operator's search attributes current (upserts only what matters)."""
        self._visibility.show(episode_attributes(self._setup, self._s, closing=closing))

    def _should_wake(self) -> bool:
        if self._rearm:
            return True
        if self._s.end is not None:
            return all_final(self._s)
        return self._history_is_long() and not self._s.submitting

    def _history_is_long(self) -> bool:
        setup = self._setup
        return history_is_long(setup.continue_as_new_bytes, setup.continue_as_new_events)

    async def _end_if_out_of_time(self) -> None:
        if out_of_time(self._setup, self._s, workflow.now()):
            await self._end(EndReason.time_limit, 0.0)

    def _answer(self, call: ToolCall, data: dict[str, Any]) -> ToolResult:
        return tool_result(self._setup, self._s, call.tool, data, workflow.now())
