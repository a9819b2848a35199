"""ReaperWorkflow: the orphan reaper, run by a Temporal Schedule when the backend is `hf`.

An orphan is a job that still runs (and bills) on Hugging Face, carries this deployment's labels,
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
    from posttrain_common.contracts.activities import ReaperApi
    from posttrain_common.contracts.jobs import OrphanJob
    from posttrain_common.failures import tool_error_of
    from workflows.policies import OBSERVE_TIMEOUT, READ_RETRY, READ_TIMEOUT


class ReaperInput(BaseModel):
    dry_run: bool = False  # report orphans without cancelling them


class ReaperReport(BaseModel):
    checked: int = 0  # live jobs of this deployment looked at
    orphans: list[OrphanJob] = Field(default_factory=list)
    cancelled: list[str] = Field(default_factory=list)  # refs
    failed: dict[str, str] = Field(default_factory=dict)  # ref -> why
    done: bool = False


@workflow.defn
class ReaperWorkflow:
    def __init__(self) -> None:
        self._report = ReaperReport()

    @workflow.run
    async def run(self, inp: ReaperInput) -> ReaperReport:
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
        self._report.done = True
        return self._report

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
