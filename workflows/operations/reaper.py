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
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import ReaperApi, ReconcilerApi
    from posttrain_common.contracts.jobs import OrphanJob
    from posttrain_common.contracts.reconcile import FindStranded, StrandedRun
    from posttrain_common.failures import tool_error_of
    from workflows.policies import OBSERVE_TIMEOUT, READ_RETRY, READ_TIMEOUT


# Runs closed at most this long ago are looked at (a deployment down longer than this leaves
# older ones to `posttrain-env episodes` and the runbook).
RECONCILE_LOOKBACK_S = 7 * 24 * 3600


class ReaperInput(BaseModel):
    dry_run: bool = False  # report what it finds without acting
    orphans: bool = True  # the backend lists its live jobs (Capabilities.reaps_orphans)
    reconcile: bool = True
    lookback_s: float = RECONCILE_LOOKBACK_S
    # The watcher's and the account's closed runs: about two Schedule periods.
    singleton_lookback_s: float = 1800.0


class ReaperReport(BaseModel):
    checked: int = 0  # live jobs of this deployment looked at
    orphans: list[OrphanJob] = Field(default_factory=list)
    cancelled: list[str] = Field(default_factory=list)  # refs
    failed: dict[str, str] = Field(default_factory=dict)  # ref or workflow id -> why
    stranded: list[StrandedRun] = Field(default_factory=list)  # closed from outside
    wound_down: dict[str, str] = Field(default_factory=dict)  # workflow id -> what was done
    done: bool = False


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

    @workflow.query
    def report(self) -> ReaperReport:
        return self._report

    async def _cancel(self, orphan: OrphanJob) -> None:
        try:
            await workflow.execute_activity_method(
                ReaperApi.cancel_orphan_job,
                orphan,
                start_to_close_timeout=OBSERVE_TIMEOUT,
                retry_policy=READ_RETRY,
            )
        except ActivityError as err:
            why = tool_error_of(err).message
            self._report.failed[orphan.ref] = why
            workflow.logger.warning("orphan job %s not cancelled yet: %s", orphan.job_id, why)
        else:
            self._report.cancelled.append(orphan.ref)
            workflow.logger.warning("orphan job %s cancelled", orphan.job_id)
