"""WatcherWorkflow: one per namespace and task queue; lists watched jobs in one call and signals
only the job workflows whose state changed, so a job's own history grows with its state changes,
not with its duration (DESIGN §3). Started by signal-with-start; exits when it has nothing to
watch, so nothing keeps polling under time skipping.

A change short of the end goes to the episode and (since `JOB_SEES_CHANGES_PATCH`) to the job's
workflow, to show as its `PtState`: before it, a job's `PtState` went from `queued` to its end
and never said `running`.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import JobsApi
    from posttrain_common.contracts.jobs import BackendJob, ObserveJobs
    from posttrain_env.models import JobState
    from workflows.cancellation import reraise_cancel
    from workflows.ids import SIGNAL_JOB_CHANGED, SIGNAL_LOOK_NOW
    from workflows.job.workflow import JobSnapshot, JobWorkflow
    from workflows.policies import OBSERVE_TIMEOUT, PERSISTENT_RETRY
    from workflows.waiting import Alarm, wait_until

# A cancel of the watcher from outside (the Temporal UI, `temporal workflow cancel`) is not
# obeyed: nothing would follow its jobs to their ends. It continues as new with them.
WATCHER_OUTSIDE_CANCEL_PATCH = "pt-watcher-outside-cancel-1"
# Changes short of a job's end are shown by the job's workflow too (see the module's docstring).
# Asked only when such a change is sent, so a watcher that saw only ends records no marker.
JOB_SEES_CHANGES_PATCH = "pt-watcher-job-sees-changes-1"


class WatchRequest(BaseModel):
    """Registers a job with the namespace's watcher (sent by signal-with-start)."""

    ref: str
    workflow_id: str  # the job's workflow: told when the job ends
    state: str
    job_id: str = ""
    episode_workflow_id: str = ""  # told directly of changes short of the end


class WatcherInput(BaseModel):
    interval_s: float = 30.0
    # Set: after a change (or a new job, or a pending jobs_wait) look again this soon, doubling
    # the gap on each quiet look up to interval_s, so short jobs are seen to end at once.
    # None: always interval_s (Hugging Face: one Hub listing per look).
    min_interval_s: float | None = None
    idle_exit_s: float = 60.0
    watched: dict[str, WatchRequest] = Field(default_factory=dict)


@workflow.defn
class WatcherWorkflow:
    def __init__(self) -> None:
        self._watched: dict[str, WatchRequest] = {}
        self._look_now = False
        self._changed = False
        self._alarm = Alarm()

    @workflow.run
    async def run(self, inp: WatcherInput) -> None:
        self._inp = inp
        try:
            await self._run(inp)
        except asyncio.CancelledError:
            if not workflow.patched(WATCHER_OUTSIDE_CANCEL_PATCH):
                raise
            workflow.logger.warning(
                "the job watcher was cancelled from outside; it goes on with %d jobs (a "
                "watcher is never cancelled: its jobs would go unwatched)",
                len(self._watched),
            )
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self.resume_input())

    async def _run(self, inp: WatcherInput) -> None:
        self._watched.update(inp.watched)
        gap = inp.min_interval_s or inp.interval_s
        while True:
            if not self._watched:
                await wait_until(lambda: bool(self._watched), timedelta(seconds=inp.idle_exit_s))
                if not self._watched:
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    if not self._watched:
                        return
            await self._observe_once()
            if inp.min_interval_s is not None:
                brisk = self._changed or self._look_now
                gap = inp.min_interval_s if brisk else min(gap * 2, inp.interval_s)
            else:
                gap = inp.interval_s
            self._look_now = self._changed = False
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(inp.model_copy(update={"watched": dict(self._watched)}))
            await self._alarm.wait(lambda: self._look_now, gap)

    @workflow.signal
    def watch(self, request: WatchRequest) -> None:
        if not JobState(request.state).terminal:
            self._watched[request.ref] = request
        self._look_now = True

    @workflow.signal(name=SIGNAL_LOOK_NOW)
    def look_now(self) -> None:
        """A `jobs_wait` is pending: look sooner than the interval."""
        self._look_now = True

    @workflow.signal
    def forget(self, ref: str) -> None:
        """An operator attested this job is gone: stop following it."""
        self._watched.pop(ref, None)

    @workflow.query
    def watched(self) -> list[str]:
        return sorted(self._watched)

    @workflow.query
    def resume_input(self) -> WatcherInput:
        """What a new run needs to go on where this one stopped (the reconciler starts one when
        this run was terminated from outside)."""
        return self._inp.model_copy(update={"watched": dict(self._watched)})

    async def _observe_once(self) -> None:
        refs = sorted(self._watched)
        try:
            observed: dict[str, BackendJob] = await workflow.execute_activity_method(
                JobsApi.observe_jobs,
                ObserveJobs(refs=refs, now=workflow.now()),
                start_to_close_timeout=OBSERVE_TIMEOUT,
                retry_policy=PERSISTENT_RETRY,
            )
        except ActivityError as err:
            reraise_cancel(err, WATCHER_OUTSIDE_CANCEL_PATCH)
            raise
        for ref, job in observed.items():
            request = self._watched.get(ref)
            if request is None or job.state.value == request.state:
                continue
            request.state = job.state.value
            self._changed = True
            await self._notify(request, job)
            if job.state.terminal:
                self._watched.pop(ref, None)

    async def _notify(self, request: WatchRequest, job: BackendJob) -> None:
        """The end goes to the job's workflow (it settles and scores); changes short of the end
        go straight to the episode, so the job's own history grows only at its end, and (under
        JOB_SEES_CHANGES_PATCH) to the job's workflow as `shown`, which only upserts its
        `PtState` (5 events a change, where a report through the job would cost 10)."""
        try:
            if job.state.terminal or not request.episode_workflow_id:
                handle = workflow.get_external_workflow_handle(request.workflow_id)
                await handle.signal(JobWorkflow.observed, job)
            else:
                handle = workflow.get_external_workflow_handle(request.episode_workflow_id)
                await handle.signal(
                    SIGNAL_JOB_CHANGED,
                    JobSnapshot(
                        job_id=request.job_id, state=job.state, backend=job, message=job.message
                    ),
                )
                if workflow.patched(JOB_SEES_CHANGES_PATCH):
                    job_handle = workflow.get_external_workflow_handle(request.workflow_id)
                    await job_handle.signal(JobWorkflow.shown, job)
        except FailureError:
            # The job's workflow is gone (it finished or was terminated): stop watching for it.
            self._watched.pop(request.ref, None)
