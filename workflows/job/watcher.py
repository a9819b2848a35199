"""WatcherWorkflow: one per shard of a task queue's jobs (`watch_shards`, each job's shard picked
by a stable hash of its workflow id); looks at its jobs in one call and signals only the job
workflows whose state changed, so a job's own history grows with its state changes, not with
its duration (DESIGN §3). Started by signal-with-start; exits when it has nothing to watch, so
nothing keeps polling under time skipping. What a shard carries and sends grows with the jobs it
follows, never with the deployment (posttrain_common/contracts/watching.py).

A change short of the end goes to the episode and (since `JOB_SEES_CHANGES_PATCH`) to the job's
workflow, to show as its `PtState`: before it, a job's `PtState` went from `queued` to its end
and never said `running`.
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import JobsApi
    from posttrain_common.contracts.jobs import BackendJob, ObserveJobs
    from posttrain_common.contracts.watching import (
        MAX_ENDED_REMEMBERED,
        MAX_JOBS_PER_SHARD,
    )
    from posttrain_env.models import JobState
    from workflows.cancellation import reraise_cancel
    from workflows.ids import SIGNAL_JOB_CHANGED, SIGNAL_LOOK_NOW
    from workflows.job.watcher_contract import WatcherInput, WatchRequest
    from workflows.job.workflow import JobSnapshot, JobWorkflow
    from workflows.policies import OBSERVE_TIMEOUT, PERSISTENT_RETRY
    from workflows.waiting import Alarm, wait_until

# A cancel of the watcher from outside (the Temporal UI, `temporal workflow cancel`) is not
# obeyed: nothing would follow its jobs to their ends. It continues as new with them.
WATCHER_OUTSIDE_CANCEL_PATCH = "pt-watcher-outside-cancel-1"
# Changes short of a job's end are shown by the job's workflow too (see the module's docstring).
# Asked only when such a change is sent, so a watcher that saw only ends records no marker.
JOB_SEES_CHANGES_PATCH = "pt-watcher-job-sees-changes-1"
# A job's end is reported once: a retried submit's registration of a job whose end was already
# reported is not followed again (before, its end was reported a second time, to a closed
# workflow). Asked only when such a registration comes.
ENDS_ONCE_PATCH = "pt-watcher-ends-once-1"
# Continue as new past WATCHER_HISTORY_BUDGET_BYTES of history, not only at Temporal's
# suggestion. Asked only when the budget is passed.
HISTORY_BUDGET_PATCH = "pt-watcher-history-budget-1"
# Without brisk looks (Hugging Face), a shard looks at the interval's boundaries of workflow time,
# so every shard of a queue looks at the same moments and one Hub listing serves them all
# (activities/backends/hf/listing_reuse.py).
ALIGNED_LOOKS_PATCH = "pt-watcher-aligned-looks-1"

# With aligned looks, a new job does not make its shard look at once: it was just created, and
# its next change is seen at the next boundary (at most `interval_s` away). Before, each
# registration made a look at every job of the shard, so a shard of N jobs sent N states per
# submitted job: at a 1000x10 campaign, most of the shards' looks (and history). Asked only when
# such a registration comes.
REGISTRATION_WAITS_PATCH = "pt-watcher-registration-waits-1"


def aligned_gap(now: datetime, interval_s: float) -> float:
    """Seconds to the next boundary of `interval_s` in epoch time (never less than a second)."""
    gap = interval_s - now.timestamp() % interval_s
    return gap if gap >= 1.0 else gap + interval_s


def ended_key(request: WatchRequest) -> str:
    """A job's end is reported once per (job workflow, backend job): 16 hex digits of their
    digest, so that remembering MAX_ENDED_REMEMBERED ends costs ~40 KiB of carry."""
    pair = f"{request.workflow_id} {request.ref}".encode()
    return hashlib.sha256(pair).hexdigest()[:16]


@workflow.defn
class WatcherWorkflow:
    @workflow.init
    def __init__(self, inp: WatcherInput) -> None:
        # From the input here, not in `run`: a signal that starts a run (signal-with-start, or
        # one sent while the previous run continued as new) is handled before `run` begins.
        self._inp = inp
        self._watched: dict[str, WatchRequest] = dict(inp.watched)
        # Insertion-ordered: the oldest is forgotten first.
        self._ended: dict[str, None] = dict.fromkeys(inp.ended)
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
            elif workflow.patched(ALIGNED_LOOKS_PATCH):
                gap = aligned_gap(workflow.now(), inp.interval_s)
            else:
                gap = inp.interval_s
            self._look_now = self._changed = False
            if self._history_is_long():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self.resume_input())
            await self._alarm.wait(lambda: self._look_now, gap)

    def _history_is_long(self) -> bool:
        info = workflow.info()
        if info.is_continue_as_new_suggested():
            return True
        over = info.get_current_history_size() > self._inp.history_budget_bytes
        return over and workflow.patched(HISTORY_BUDGET_PATCH)

    @workflow.signal
    def watch(self, request: WatchRequest) -> None:
        if ended_key(request) in self._ended and workflow.patched(ENDS_ONCE_PATCH):
            return  # a retried submit's registration: its end was reported already
        if not JobState(request.state).terminal:
            self._watched[request.ref] = request
            if len(self._watched) == MAX_JOBS_PER_SHARD + 1:
                workflow.logger.warning(
                    "watcher %s follows more than %d jobs, the most a shard is sized for: "
                    "raise POSTTRAIN_WATCH_SHARDS",
                    workflow.info().workflow_id,
                    MAX_JOBS_PER_SHARD,
                )
        if self._inp.min_interval_s is None and workflow.patched(REGISTRATION_WAITS_PATCH):
            return  # aligned looks: the job's next change is seen at the next boundary
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
        return self._inp.model_copy(
            update={"watched": dict(self._watched), "ended": list(self._ended)}
        )

    async def _observe_once(self) -> None:
        # The states we know: the answer holds only the jobs whose state changed.
        known = {ref: self._watched[ref].state for ref in sorted(self._watched)}
        try:
            observed: dict[str, BackendJob] = await workflow.execute_activity_method(
                JobsApi.observe_jobs,
                ObserveJobs(now=workflow.now(), states=known),
                start_to_close_timeout=OBSERVE_TIMEOUT,
                retry_policy=PERSISTENT_RETRY,
            )
        except ActivityError as err:
            reraise_cancel(err, WATCHER_OUTSIDE_CANCEL_PATCH)
            raise
        # One change after the other, each signal awaited (a workflow task of the shard's own):
        # that paces a look's burst of ends by the server's own queue. Sent all at once, a
        # 100x10 campaign's job ends made 1,047 workflow tasks over 1 s where this made 6, and
        # its p99 went from 795 ms to 2,219 ms (bench/watch_scale.py, one run each, 2026-12-06).
        for ref, job in observed.items():
            request = self._watched.get(ref)
            if request is None or job.state.value == request.state:
                continue
            request.state = job.state.value
            self._changed = True
            await self._notify(request, job)
            if job.state.terminal:
                self._watched.pop(ref, None)
                self._remember_end(request)

    def _remember_end(self, request: WatchRequest) -> None:
        self._ended[ended_key(request)] = None
        while len(self._ended) > MAX_ENDED_REMEMBERED:
            del self._ended[next(iter(self._ended))]

    async def _notify(self, request: WatchRequest, job: BackendJob) -> None:
        """The end goes to the job's workflow (it settles and scores); changes short of the end
        go straight to the episode, so the job's own history grows only at its end, and (under
        JOB_SEES_CHANGES_PATCH) to the job's workflow as `shown`, which only upserts its
        `PtState` (5 events a change, where a report through the job would cost 10)."""
        if job.state.terminal or not request.episode_workflow_id:
            await self._signal_job(request, JobWorkflow.observed, job)
            return
        handle = workflow.get_external_workflow_handle(request.episode_workflow_id)
        try:
            await handle.signal(
                SIGNAL_JOB_CHANGED,
                JobSnapshot(
                    job_id=request.job_id, state=job.state, backend=job, message=job.message
                ),
            )
        except FailureError:
            if not workflow.patched(ENDS_ONCE_PATCH):
                self._watched.pop(request.ref, None)
                return
            # The episode is gone, but the job's workflow may not be: it is still owed the
            # job's end (it cancels the job, or reports to an episode run started again).
        if workflow.patched(JOB_SEES_CHANGES_PATCH):
            await self._signal_job(request, JobWorkflow.shown, job)

    async def _signal_job(self, request: WatchRequest, signal: Any, job: BackendJob) -> None:
        handle = workflow.get_external_workflow_handle(request.workflow_id)
        try:
            await handle.signal(signal, job)
        except FailureError:
            # The job's workflow is gone (it finished or was terminated): nobody is owed its
            # end any more, so stop following the job.
            self._watched.pop(request.ref, None)
