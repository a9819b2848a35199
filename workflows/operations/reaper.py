"""ReaperWorkflow: the reconciler and the orphan reaper, run by a Temporal Schedule.

First the reconciler (every backend): runs of our workflows closed from outside (terminated
through the UI or `temporal workflow terminate`, or timed out) run no code of their own, so each
is wound down (`posttrain_common/contracts/reconcile.py`): episodes, campaigns, rollouts and jobs
are started again under their ids to end as an operator's cancel, and the watcher's and the
account's state is handed to the running ones.

Then, where the backend can list its live jobs (`Capabilities.reaps_orphans`), the orphans. An
orphan is a job that still runs (and bills) on Hugging Face, carries this deployment's labels,
and belongs to an episode whose workflow is closed (or gone): nothing will ever cancel it. Each
run lists such jobs, cancels them, logs each one, and reports them in its result and the `report`
query. A cancellation the Hub does not confirm is left for the next run (it is reported failed).

And the strays (`OrphanSearch.strays`): live jobs of a running episode that no job workflow
follows any more, because the create landed after every submit attempt had given up, or beside
the job a retried submit adopted, which has ended. Each is cancelled like an orphan, then its
episode is told (`late_job_settled`), which charges its real running time to its ledger at once
instead of leaving it to bill outside the ledger until the episode closes.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import ReaperApi, ReconcilerApi
    from posttrain_common.contracts.jobs import BackendJob, LateJob, OrphanJob
    from posttrain_common.contracts.reconcile import FindStranded
    from posttrain_common.failures import tool_error_of
    from workflows.ids import SIGNAL_LATE_JOB_SETTLED, episode_workflow_id
    from workflows.operations.reaper_contract import ReaperInput, ReaperReport
    from workflows.policies import OBSERVE_TIMEOUT, READ_RETRY, READ_TIMEOUT


# Cancelling and settling strays: runs that find none (every run recorded before) issue no
# command of it and hold no marker.
STRAYS_PATCH = "pt-reaper-strays-1"


@workflow.defn
class ReaperWorkflow:
    def __init__(self) -> None:
        self._report = ReaperReport()

    @workflow.run
    async def run(self, inp: ReaperInput) -> ReaperReport:
        # The reconciler first: an episode started again owns its jobs, which are then no orphans.
        if inp.reconcile:
            await self._reconcile(inp)
        if inp.orphans:
            await self._reap(inp)
        self._report.done = True
        return self._report

    async def _reconcile(self, inp: ReaperInput) -> None:
        found = await workflow.execute_activity_method(
            ReconcilerApi.find_stranded_workflows,
            FindStranded(lookback_s=inp.lookback_s, singleton_lookback_s=inp.singleton_lookback_s),
            start_to_close_timeout=READ_TIMEOUT,
            retry_policy=READ_RETRY,
        )
        self._report.stranded = found.runs
        if inp.dry_run:
            return
        for run in found.runs:  # one at a time, parents first
            try:
                done = await workflow.execute_activity_method(
                    ReconcilerApi.wind_down_workflow,
                    run,
                    start_to_close_timeout=READ_TIMEOUT,
                    retry_policy=READ_RETRY,
                )
            except ActivityError as err:
                why = tool_error_of(err).message
                self._report.failed[run.workflow_id] = why
                workflow.logger.warning("%s not wound down yet: %s", run.workflow_id, why)
            else:
                self._report.wound_down[run.workflow_id] = done

    async def _reap(self, inp: ReaperInput) -> None:
        found = await workflow.execute_activity_method(
            ReaperApi.find_orphan_jobs,
            start_to_close_timeout=READ_TIMEOUT,
            retry_policy=READ_RETRY,
        )
        self._report.checked = found.checked
        self._report.orphans = found.orphans
        for orphan in found.orphans:
            workflow.logger.warning(
                "orphan job %s (%s, %s) of closed episode %s, stage %s: %s",
                orphan.job_id,
                orphan.role,
                orphan.ref,
                orphan.episode_id,
                orphan.stage,
                "reported" if inp.dry_run else "cancelling",
            )
        if not inp.dry_run:
            await asyncio.gather(*(self._cancel(orphan) for orphan in found.orphans))
        self._report.strays = found.strays
        for stray in found.strays:
            workflow.logger.warning(
                "stray job %s (%s, %s) of running episode %s, stage %s: %s",
                stray.job_id,
                stray.role,
                stray.ref,
                stray.episode_id,
                stray.stage,
                "reported" if inp.dry_run else "cancelling and settling",
            )
        if found.strays and not inp.dry_run and workflow.patched(STRAYS_PATCH):
            await asyncio.gather(*(self._settle_stray(stray) for stray in found.strays))

    @workflow.query
    def report(self) -> ReaperReport:
        return self._report

    async def _settle_stray(self, stray: OrphanJob) -> None:
        """Cancel the stray, then have its episode charge what it ran."""
        job = await self._cancel(stray)
        if job is None:
            return  # reported failed: the next run tries again
        late = LateJob(
            job_id=stray.job_id,
            ref=stray.ref,
            role=stray.role,
            running_s=job.running_s,
            state=job.state.value,
        )
        handle = workflow.get_external_workflow_handle(episode_workflow_id(stray.episode_id))
        try:
            await handle.signal(SIGNAL_LATE_JOB_SETTLED, late)
        except FailureError as err:
            # The episode closed meanwhile: its spend is final; the job is stopped anyway.
            self._report.failed[stray.ref] = f"its episode could not be told: {err}"
            workflow.logger.warning("stray job %s not settled: %s", stray.job_id, err)
        else:
            self._report.settled_late.append(stray.ref)

    async def _cancel(self, orphan: OrphanJob) -> BackendJob | None:
        try:
            job = await workflow.execute_activity_method(
                ReaperApi.cancel_orphan_job,
                orphan,
                start_to_close_timeout=OBSERVE_TIMEOUT,
                retry_policy=READ_RETRY,
            )
        except ActivityError as err:
            why = tool_error_of(err).message
            self._report.failed[orphan.ref] = why
            workflow.logger.warning("orphan job %s not cancelled yet: %s", orphan.job_id, why)
            return None
        self._report.cancelled.append(orphan.ref)
        workflow.logger.warning("orphan job %s cancelled", orphan.job_id)
        return job
