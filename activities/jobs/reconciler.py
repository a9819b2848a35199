"""Activities of the reconciler (`workflows/operations/reaper.py` runs them before it looks for
orphan jobs, on every backend): find runs of our workflows closed from outside and wind each
down. The Temporal side is `posttrain_server/reconcile.py` (`StrandedWorkflows`)."""

from __future__ import annotations

from temporalio import activity

from activities.ports import StrandedWorkflows
from posttrain_common.contracts.activities import ReconcilerApi
from posttrain_common.contracts.reconcile import FindStranded, StrandedRun, StrandedSearch


class ReconcilerActivities(ReconcilerApi):
    def __init__(self, stranded: StrandedWorkflows) -> None:
        self._stranded = stranded

    @activity.defn
    async def find_stranded_workflows(self, request: FindStranded) -> StrandedSearch:
        found = await self._stranded.find(request)
        for run in found.runs:
            activity.logger.warning(
                "%s %s was %s from outside: winding it down",
                run.workflow_type,
                run.workflow_id,
                run.status.lower().replace("_", " "),
            )
        return found

    @activity.defn
    async def wind_down_workflow(self, run: StrandedRun) -> str:
        done = await self._stranded.wind_down(run)
        activity.logger.warning("%s %s: %s", run.workflow_type, run.workflow_id, done)
        return done
