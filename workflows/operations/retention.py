"""RetentionWorkflow: one retention sweep, run by a Temporal Schedule for every backend
(docs/operations.md,
"Retention"; the Schedule is created by the worker's wiring).

Each run asks the retention activity for one bounded sweep: job folders of episodes that ended
longer ago than POSTTRAIN_JOB_RETENTION_DAYS are deleted, submitted artifacts after
POSTTRAIN_SUBMITTED_RETENTION_DAYS. The report is the run's result and its `report` query; what
was deleted is also written beside each episode's audit record.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import RetentionApi
    from posttrain_common.contracts.retention import RetentionReport, SweepRetention
    from workflows.operations.retention_contract import RetentionInput
    from workflows.policies import READ_RETRY, RETENTION_HEARTBEAT, RETENTION_TIMEOUT


@workflow.defn
class RetentionWorkflow:
    def __init__(self) -> None:
        self._report = RetentionReport()

    @workflow.run
    async def run(self, inp: RetentionInput) -> RetentionReport:
        self._report = await workflow.execute_activity_method(
            RetentionApi.sweep_retention,
            SweepRetention(now=workflow.now(), dry_run=inp.dry_run),
            start_to_close_timeout=RETENTION_TIMEOUT,
            heartbeat_timeout=RETENTION_HEARTBEAT,
            retry_policy=READ_RETRY,
        )
        report = self._report
        workflow.logger.info(
            "retention %s %d folders (%d bytes) of %d ended episodes; %d refused, %d failed, "
            "%d still running%s",
            "found due" if inp.dry_run else "deleted",
            len(report.deleted),
            report.bytes_deleted,
            report.examined,
            len(report.refused),
            len(report.failed),
            len(report.running),
            "; more next run" if report.more else "",
        )
        return report

    @workflow.query
    def report(self) -> RetentionReport:
        return self._report
