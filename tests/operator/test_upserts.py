"""Search attributes are upserted at changes that matter, never on every call or poll."""

from __future__ import annotations

from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from tests.workflows.harness import running_worker
from workflows.operations.visibility import VISIBILITY_PATCH

UPSERT = EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
MEMO = EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED


async def test_reads_cost_no_upsert_and_a_job_or_an_end_does(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    agent = FakeJobScript(role=JobRole.agent, queue_s=1, run_s=10)
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[agent])) as h:
        ep = await h.episode()

        async def upserts() -> int:
            history = await ep.handle.fetch_history()
            return sum(e.event_type == UPSERT for e in history.events)

        await ep.call("jobs_status")
        first = await upserts()
        assert first >= 1  # the episode showed itself once it ran
        history = await ep.handle.fetch_history()
        assert sum(e.event_type == MEMO for e in history.events) == 1
        markers = [
            e for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        ]
        assert any(VISIBILITY_PATCH.encode() in e.SerializeToString() for e in markers)
        for _ in range(5):
            await ep.call("jobs_status")
            await ep.call("task_info")
        assert await upserts() == first  # ten calls that changed nothing: no event

        job_id = await ep.submit_job()
        await ep.wait_job(job_id)
        after_job = await upserts()
        assert after_job > first  # the job settled: spend changed
        await ep.call("submit", job_id="job-nope")  # an error answer: nothing changes
        assert await upserts() == after_job
