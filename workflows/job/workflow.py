"""JobWorkflow: the life of one job (an agent's, or a dev or grader evaluation).

Submit idempotently (keyed by this workflow's id), then follow the state changes the watcher
pushes, cancel and confirm on request, read the score of an evaluation, and report every change
to the parent episode by signal. History grows with state changes, not with the job's duration.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import JobsApi
    from posttrain_common.contracts.jobs import (
        BackendJob,
        JobRef,
        JobRole,
        JobSpec,
        KeepOutputs,
        ScoreResult,
        SubmitJob,
    )
    from posttrain_common.failures import artifact_rejection, tool_error_of
    from posttrain_env.models import JobState
    from workflows.cancellation import reraise_cancel
    from workflows.ids import SIGNAL_JOB_CHANGED, SIGNAL_LOOK_NOW
    from workflows.job.contract import (
        JobInput,
        JobSnapshot,
        refused_start,
        rejected_artifact,
        submit_request,
    )
    from workflows.operations import search_attributes as sa
    from workflows.operations.visibility import (
        Attributes,
        Visibility,
        bounded_memo,
        job_attributes,
    )
    from workflows.policies import (
        OBSERVE_TIMEOUT,
        PERSISTENT_RETRY,
        READ_TIMEOUT,
        SCORE_READ_RETRY,
        SUBMIT_HEARTBEAT,
        SUBMIT_RETRY,
        SUBMIT_TIMEOUT,
    )
    from workflows.waiting import Alarm, wait_until

# How long past its own timeout a job may go unreported before we cancel it ourselves.
GUARD_GRACE_S = 600
# A job whose end we learned from the cancel call waits this long for the watcher to see the
# end too, so the watcher never signals a completed workflow (which also stalls the test
# server's clock).
WATCHER_SETTLE_S = 120
# Taking the watcher's report of a job's end when it came before the submit's answer was taken.
WATCHER_REPORT_FIRST_PATCH = "pt-watcher-report-first-1"
# A cancellation not yet confirmed is asked for again after this long, doubling up to the cap.
CANCEL_REISSUE_S = 15
CANCEL_REISSUE_MAX_S = 600
# A cancel of this workflow from outside (the Temporal UI, `temporal workflow cancel`) cancels
# the backend job and reports its end, as a cancel from the episode does. Histories recorded
# before this closed at such a cancel, and replay so.
OUTSIDE_CANCEL_PATCH = "pt-outside-cancel-1"


def job_start_attributes(inp: JobInput) -> Attributes:
    """What a job shows from its start (given at child start, see `JobInput.visible`). Its
    reservation is shown until it is final (`job_attributes` then sets it to 0); inputs
    recorded before carry none (0), so their upserts replay unchanged."""
    return {
        sa.TASK: inp.task_id,
        sa.ROLE: inp.role.value,
        sa.FLAVOR: inp.flavor,
        sa.STATE: JobState.queued.value,
        sa.RESERVED_MICRO_USD: inp.reserved_micro_usd,
    }


def job_memo(inp: JobSpec) -> dict[str, str]:
    """Given at the job's start: which job of which episode, and what it trains on (the task
    and the base model at its commit, as the episode's memo says)."""
    return bounded_memo(
        {
            "job_id": inp.job_id,
            "episode_id": inp.episode_id,
            "task_id": inp.task_id,
            "base_model": inp.base_model.repo_id,
            "base_model_commit": inp.base_model.revision,
        }
    )


@workflow.defn
class JobWorkflow:
    def __init__(self) -> None:
        self._state = JobState.queued
        self._job: BackendJob | None = None
        self._inbox: list[BackendJob] = []
        self._cancel_requested = False
        self._message = ""
        self._watcher_has_it = False
        self._cancel_requested_at: datetime | None = None
        self._visibility = Visibility()
        # Set by `retry_cancel_now` (an operator): ask the backend again without waiting out
        # the backoff.
        self._reissue_now = False
        # Set by `confirmed_gone` (an operator attests the job is gone): stop following it.
        self._gone: str | None = None
        # This workflow was cancelled or terminated through Temporal (JobSnapshot.outside).
        self._outside: Literal["cancel", "terminate"] | None = None

    @workflow.run
    async def run(self, inp: JobInput) -> JobSnapshot:
        self._inp = inp
        if inp.visible:
            self._visibility.enable_unpatched(job_start_attributes(inp))
        if inp.wind_down:
            self._cancel_requested = True
            self._outside = "terminate"
            self._message = "its workflow was terminated from outside; the reconciler cancelled it"
        try:
            return await self._run()
        except asyncio.CancelledError:
            if not workflow.patched(OUTSIDE_CANCEL_PATCH):
                raise
        # Cancelled through Temporal: nothing may be left running or unreported. Temporal
        # delivers a workflow's cancellation once, so what follows runs to its end.
        workflow.logger.warning(
            "job %s of episode %s: its workflow was cancelled from outside; cancelling the "
            "backend job",
            inp.job_id,
            inp.episode_id,
        )
        self._message = "its workflow was cancelled from outside (Temporal); the job was cancelled"
        self._outside = "cancel"
        self._cancel_requested = True
        return await self._wind_down()

    async def _run(self) -> JobSnapshot:
        started = await self._submit()
        if isinstance(started, JobSnapshot):
            return await self._finish(started)
        return await self._follow(started)

    async def _wind_down(self) -> JobSnapshot:
        """After a cancel from outside: find the job if the submit's answer was not taken yet,
        cancel it, confirm its end, and report it."""
        if self._job is None:
            return await self._run()
        await self._follow_until_terminal()
        await self._let_the_watcher_see_the_end()
        await self._keep_outputs()
        score = await self._score() if self._state is JobState.succeeded else None
        return await self._finish(self._snapshot(final=True, score=score))

    async def _submit(self) -> BackendJob | JobSnapshot:
        """Start the job, or find it (the submit is keyed by this workflow's id); the final
        snapshot when it could not start."""
        inp = self._inp
        try:
            return await workflow.execute_activity_method(
                JobsApi.submit_job,
                self._submit_request(),
                start_to_close_timeout=SUBMIT_TIMEOUT,
                heartbeat_timeout=SUBMIT_HEARTBEAT,
                retry_policy=SUBMIT_RETRY,
            )
        except ActivityError as err:
            reraise_cancel(err, OUTSIDE_CANCEL_PATCH)
            rejected = artifact_rejection(err)
            if rejected is not None:  # the evaluated artifact's fault: it scores 0, as invalid
                return rejected_artifact(inp.job_id, rejected)
            error = tool_error_of(err)
            return refused_start(inp.job_id, error.envelope(), error.message)

    async def _follow(self, started: BackendJob) -> JobSnapshot:
        # submit_job registered the job with the watcher unless it had already ended.
        held = not started.state.terminal
        # The episode waits for this first report (sent by the submit itself when it was asked).
        await self._apply(started, report=not self._inp.start_reported_by_submit)
        reported_end = any(job.state.terminal for job in self._inbox)  # not drained yet
        if held and reported_end and workflow.patched(WATCHER_REPORT_FIRST_PATCH):
            # The watcher reported the end before the submit's answer was taken (a retried
            # submit: the first attempt's registration was seen to its end) or while the report
            # above was awaited, and has dropped the job. Before this patch the flag undid that
            # release and the job waited WATCHER_SETTLE_S for a report that never came (issue
            # 18's fault matrix, (h)). Asked only then, so other jobs' histories hold no marker.
            held = False
        self._watcher_has_it = held
        await self._follow_until_terminal()
        await self._let_the_watcher_see_the_end()
        await self._keep_outputs()
        score = await self._score() if self._state is JobState.succeeded else None
        return await self._finish(self._snapshot(final=True, score=score))

    @workflow.signal
    def observed(self, job: BackendJob) -> None:
        """The watcher saw this job change state."""
        self._inbox.append(job)
        if job.state.terminal:
            self._watcher_has_it = False  # the watcher drops a job once it saw it end

    @workflow.signal
    def shown(self, job: BackendJob) -> None:
        """The watcher saw a change short of the end and told the episode: show it only (the
        operator's `PtState`), with no report and no activity."""
        if self._job is None or self._state.terminal or job.state.terminal:
            return  # before the submit's answer (it sets the state), or after the end
        if self._state is JobState.cancelling:
            return  # still stopping: the backend's `running` does not undo our cancelling
        self._job = job
        self._state = job.state
        self._show()

    @workflow.signal
    def cancel(self) -> None:
        self._cancel_requested = True

    @workflow.signal
    def retry_cancel_now(self) -> None:
        """An operator: ask the backend to cancel again now, not after the backoff."""
        if self._cancel_requested:
            self._reissue_now = True

    @workflow.signal
    def confirmed_gone(self, reason: str) -> None:
        """An operator attests the job is gone (the provider's console says so): stop following
        it. The episode has settled it already (`posttrain-env episodes confirm-cancelled`)."""
        if not self._state.terminal:
            self._gone = reason

    @workflow.query
    def snapshot(self) -> JobSnapshot:
        return self._snapshot(final=False)

    @workflow.query
    def resume_input(self) -> JobInput:
        """The input of a run that winds this one down (the reconciler starts one when this run
        was terminated from outside): find the job, cancel it, report its end."""
        return self._inp.model_copy(update={"wind_down": True})

    # -- helpers -------------------------------------------------------------------------------

    def _submit_request(self) -> SubmitJob:
        return submit_request(self._inp, workflow.info().workflow_id, workflow.now())

    async def _follow_until_terminal(self) -> None:
        assert self._job is not None
        # One guard timer for the whole job, never cancelled and re-armed: a timer per wake-up
        # would cost two history events each time.
        guard = asyncio.ensure_future(asyncio.sleep(self._inp.timeout_s + GUARD_GRACE_S))
        cancel_sent_at: datetime | None = None
        reissue_s = CANCEL_REISSUE_S
        reissue_alarm = Alarm()
        while not self._state.terminal:
            if self._gone is not None:
                await self._take_operator_word(self._gone)
                return
            if self._cancel_requested and cancel_sent_at is None:
                cancel_sent_at = workflow.now()
                await self._request_cancel()
                continue
            if cancel_sent_at is None:
                await workflow.wait_condition(
                    lambda: (
                        bool(self._inbox)
                        or self._cancel_requested
                        or guard.done()
                        or self._gone is not None
                    )
                )
                if self._gone is not None:
                    continue
                if not self._inbox and not self._cancel_requested:
                    # The job overstayed its own timeout unreported: stop it.
                    self._message = "the job overstayed its timeout and was cancelled"
                    self._cancel_requested = True
                    continue
            else:
                if not await reissue_alarm.wait(
                    lambda: bool(self._inbox) or self._reissue_now or self._gone is not None,
                    reissue_s,
                ) or (self._reissue_now and not self._inbox):
                    if self._gone is not None:
                        continue
                    # Still not confirmed: ask again, less often each time (an operator's
                    # `retry-cancel` asks now and starts the backoff over).
                    if self._reissue_now:
                        reissue_s = CANCEL_REISSUE_S
                    else:
                        reissue_s = min(reissue_s * 2, CANCEL_REISSUE_MAX_S)
                    self._reissue_now = False
                    self._warn_unconfirmed()
                    cancel_sent_at = workflow.now()
                    await self._request_cancel()
                    continue
            inbox, self._inbox = self._inbox, []
            for job in inbox:
                await self._apply(job)
            if workflow.info().is_continue_as_new_suggested():
                workflow.logger.warning("job %s history is long", self._inp.job_id)

    def _warn_unconfirmed(self) -> None:
        """Every re-issued cancel is logged: an operator's alert may point here."""
        asked = self._cancel_requested_at or workflow.now()
        workflow.logger.warning(
            "cancellation of job %s (episode %s, backend job %s) still unconfirmed after %d s; "
            "asking again",
            self._inp.job_id,
            self._inp.episode_id,
            self._job.ref if self._job else None,
            int((workflow.now() - asked).total_seconds()),
        )

    async def _take_operator_word(self, reason: str) -> None:
        """The operator attested the job is gone: it ends `cancelled` as far as we know, and the
        watcher stops following it."""
        self._state = JobState.cancelled
        self._message = f"cancellation confirmed by an operator: {reason}"
        if self._job is not None and self._watcher_has_it:
            handle = workflow.get_external_workflow_handle(self._inp.watcher_workflow_id)
            try:
                await handle.signal("forget", self._job.ref)
            except FailureError:
                pass
        self._watcher_has_it = False

    async def _let_the_watcher_see_the_end(self) -> None:
        if self._watcher_has_it:
            await self._ask_watcher_to_look()
            await wait_until(lambda: not self._watcher_has_it, timedelta(seconds=WATCHER_SETTLE_S))

    async def _request_cancel(self) -> None:
        assert self._job is not None
        if self._state is not JobState.cancelling:
            self._state = JobState.cancelling
            self._cancel_requested_at = workflow.now()
            self._show()
            await self._report(self._snapshot(final=False))
        try:
            job = await workflow.execute_activity_method(
                JobsApi.cancel_job,
                JobRef(ref=self._job.ref, key=workflow.info().workflow_id, now=workflow.now()),
                start_to_close_timeout=OBSERVE_TIMEOUT,
                retry_policy=PERSISTENT_RETRY,
            )
        except ActivityError as err:
            reraise_cancel(err, OUTSIDE_CANCEL_PATCH)
            self._message = tool_error_of(err).message
            return
        await self._apply(job)
        if not self._state.terminal:
            await self._ask_watcher_to_look()

    async def _apply(self, job: BackendJob, *, report: bool | None = None) -> None:
        """Take a backend observation; report it to the episode if our state changed (`report`
        True: always; False: never, someone else did)."""
        self._job = job
        if self._state is JobState.cancelling and not job.state.terminal:
            return  # still stopping: the backend's `running` does not undo our cancelling
        changed = job.state is not self._state if report is None else report
        self._state = job.state
        self._show()
        if changed and not job.state.terminal:
            await self._report(self._snapshot(final=False))

    async def _keep_outputs(self) -> None:
        """An ended agent job whose backend did not measure its outputs as it ended (Hugging
        Face, where they sit in the job's bucket folder): measured now, and kept within its
        caps or deleted whole. Only jobs whose input carries their storage allowance (those of
        episodes that count storage) take it, so histories recorded before replay unchanged;
        a backend that measures at the end (local) needs no activity. When it cannot be
        measured, the episode settles the job's storage at the most it could keep."""
        inp, job = self._inp, self._job
        allowance = inp.storage_allowance_bytes
        if inp.role is not JobRole.agent or allowance is None or job is None:
            return
        if job.stored_bytes is not None or job.started_at is None:
            return  # measured already, or it never ran (it wrote nothing)
        if not job.state.terminal:
            return  # the backend has not seen it end (an operator attested it gone)
        try:
            kept = await workflow.execute_activity_method(
                JobsApi.keep_outputs,
                KeepOutputs(
                    ref=job.ref,
                    key=workflow.info().workflow_id,
                    now=workflow.now(),
                    artifact_cap_bytes=inp.artifact_cap_bytes or allowance,
                    storage_allowance_bytes=allowance,
                    storage_cap_bytes=inp.storage_cap_bytes,
                ),
                start_to_close_timeout=READ_TIMEOUT,
                retry_policy=SCORE_READ_RETRY,
            )
        except ActivityError as err:
            reraise_cancel(err, OUTSIDE_CANCEL_PATCH)
            self._message = (
                f"the job's outputs could not be measured ({tool_error_of(err).message}); its "
                "storage is charged at the most it could keep"
            )
            return
        self._job = kept
        self._state = kept.state

    async def _score(self) -> ScoreResult | None:
        if self._inp.role is JobRole.agent or self._job is None:
            return None
        try:
            return await workflow.execute_activity_method(
                JobsApi.read_score,
                JobRef(ref=self._job.ref, key=workflow.info().workflow_id, now=workflow.now()),
                start_to_close_timeout=READ_TIMEOUT,
                # Only the policy differs from before (a command's attributes, not its kind:
                # recorded histories replay unchanged, tests/replay).
                retry_policy=SCORE_READ_RETRY,
            )
        except ActivityError as err:
            reraise_cancel(err, OUTSIDE_CANCEL_PATCH)
            # Still unreadable after SCORE_READ_RETRY: unscored (`score_failed`), as any
            # Hugging Face fault in grading is; never a score of 0 for our own fault.
            self._message = f"could not read the evaluation's log: {tool_error_of(err).message}"
            return None

    def _snapshot(self, *, final: bool, score: ScoreResult | None = None) -> JobSnapshot:
        message = self._message or (self._job.message if self._job else "")
        return JobSnapshot(
            job_id=self._inp.job_id,
            state=self._state,
            backend=self._job,
            score=score,
            message=message,
            final=final,
            outside=self._outside,
        )

    def _show(self) -> None:
        """Keep the operator's search attributes current (upserts only what changed)."""
        self._visibility.show(
            job_start_attributes(self._inp)
            | job_attributes(
                state=self._state,
                backend_job_id=self._job.ref if self._job else None,
                cancel_requested_at=self._cancel_requested_at,
                reserved_micro_usd=self._inp.reserved_micro_usd,
            )
        )

    async def _finish(self, snapshot: JobSnapshot) -> JobSnapshot:
        # The final report says whether this workflow was cancelled or terminated through
        # Temporal whichever path built it (a failed submit's too).
        snapshot = snapshot.model_copy(update={"outside": self._outside})
        self._state = snapshot.state
        self._show()
        await self._report(snapshot)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return snapshot

    async def _report(self, snapshot: JobSnapshot) -> None:
        handle = workflow.get_external_workflow_handle(self._inp.parent_workflow_id)
        try:
            await handle.signal(SIGNAL_JOB_CHANGED, snapshot)
        except FailureError:
            workflow.logger.warning(
                "episode %s is gone; job %s not reported", self._inp.episode_id, self._inp.job_id
            )

    async def _ask_watcher_to_look(self) -> None:
        handle = workflow.get_external_workflow_handle(self._inp.watcher_workflow_id)
        try:
            await handle.signal(SIGNAL_LOOK_NOW)
        except FailureError:
            pass  # no watcher running: the cancel re-issue loop still looks again
