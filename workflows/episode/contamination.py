"""The grader-side contamination check, as the episode runs it (workflow code: deterministic).

Between the grader's score and the episode's end, for a task with a `[contamination]` table:
a task whose hidden split is generated inside the grader is answered at once (skipped, no
command); one with public test items runs the check as an activity on the main worker (not a
job, not charged). The report's counts go on `episode_end.contamination`, its evidence to the
audit record only. A check that fails after its retries is reported as `check_failed`, and the
reward stands: a grader-side failure never costs the agent its reward.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import ContaminationApi
    from posttrain_common.contracts.contamination import (
        CheckContamination,
        ContaminationReport,
        check_failed,
        skipped_generated,
    )
    from posttrain_common.contracts.episodes import EpisodeSetup
    from workflows.policies import CONTAMINATION_TIMEOUT, READ_RETRY

# Patch id: the check's activity is a new command at the end of a submit. Only episodes of tasks
# that declare test items reach it (none did before), so replayed histories never take it; the
# patch marks the histories that did.
CONTAMINATION_CHECK = "pt-contamination-check-1"


async def check_contamination(setup: EpisodeSetup) -> ContaminationReport | None:
    """The check's report, or None when the task declares nothing (no check, no field)."""
    spec = setup.task.contamination
    if spec is None:
        return None
    if spec.test_items is None:
        return skipped_generated()
    if not workflow.patched(CONTAMINATION_CHECK):
        return None
    try:
        return await workflow.execute_activity_method(
            ContaminationApi.check_contamination,
            CheckContamination(
                episode_id=setup.episode_id,
                task_id=setup.task.id,
                family=setup.task.family,
                spec=spec,
            ),
            start_to_close_timeout=CONTAMINATION_TIMEOUT,
            retry_policy=READ_RETRY,
        )
    except ActivityError as err:
        workflow.logger.warning("contamination check of %s failed: %s", setup.episode_id, err)
        return check_failed(spec, "the check's activity failed after its retries")
