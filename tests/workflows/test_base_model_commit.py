"""The base model is known by commit (issue 13): the reset metadata names the commit the task's
branch resolved to, and every job's record keeps the commit its /base_model holds (carried
through continue-as-new with the episode's other state)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from mcp_gateway.observations import reset_metadata
from posttrain_common.contracts.jobs import JobRole
from tests.workflows.harness import running_worker
from workflows.episode.workflow import EpisodeInput

AGENT = FakeJobScript(role=JobRole.agent, queue_s=1, run_s=3600)


async def test_the_commit_is_in_the_reset_metadata_and_in_every_jobs_record(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(
        time_skipping_env, tmp_path, FakeScenario(jobs=[AGENT]), continue_as_new_events=100
    ) as h:
        ep = await h.episode()
        commit = ep.reset.setup.base_model.revision
        assert len(commit) == 40  # the task's `main`, resolved once at reset
        metadata = reset_metadata(ep.reset, session_id=None, episode_token="t", mcp_url="u")
        assert metadata["base_model"] == {"repo_id": "test-org/tiny-model", "revision": commit}

        first_run = (await ep.handle.describe()).run_id
        job_id = await ep.submit_job(timeout_minutes=60)
        for _ in range(25):
            await ep.call("task_info")
        await ep.skip(timedelta(seconds=40))
        assert (await ep.handle.describe()).run_id != first_run  # it continued as new

        history = await h.client.get_workflow_handle(ep.handle.id, run_id=first_run).fetch_history()
        (continued,) = [
            event
            for event in history.events
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        ]
        payloads = continued.workflow_execution_continued_as_new_event_attributes.input.payloads
        (carried,) = await h.client.data_converter.decode(payloads, [EpisodeInput])
        assert carried.carry is not None
        assert carried.carry.jobs[job_id].base_model_revision == commit
        assert h.backend.requests()[0].base_model.revision == commit
