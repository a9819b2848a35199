"""Whole episodes through the real workflows with the hf backend (the fake Hub behind it):
activity retry policies, settlement, scoring, and a stuck cancellation as the UI shows it."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateStage
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.backends.hf.labels import HfRef
from activities.jobs.activities import HIDDEN_SEED_SECRET
from job_launcher.trusted_lines import SCORE_TAG, format_trusted_line
from tests.hf.fake_hub import FakeHub, JobPlan
from tests.hf.temporal import MODEL_SHA, hf_worker
from workflows.episode.session import ResetRequest, ResetResult, SessionWorkflow
from workflows.ids import job_workflow_id

CPU_PRICE = 167
SCORE_LINE = format_trusted_line(SCORE_TAG, "{nonce}", {"score": 0.75, "split": "hidden"})


def plans(hub: FakeHub, agent: JobPlan) -> None:
    evaluation = JobPlan(scheduling_s=5, running_s=30, logs=["evaluating", SCORE_LINE])
    hub.plan_for = lambda labels: agent if labels["posttrain-role"] == "agent" else evaluation


async def test_an_episode_runs_settles_61_s_as_2_minutes_and_is_scored_by_a_grader_job(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, hub: FakeHub
) -> None:
    plans(hub, JobPlan(scheduling_s=10, running_s=61, outputs={"model.safetensors": 1000}))
    async with hf_worker(time_skipping_env, tmp_path, hub) as h:
        ep = await h.episode()
        assert ep.reset.setup.base_model.revision == MODEL_SHA  # the branch, pinned
        job_id = await ep.submit_job()
        done = await ep.wait_job(job_id)
        assert done.data["state"] == "succeeded" and done.data["running_s"] == 61.0
        assert done.data["cost_usd"] == 2 * CPU_PRICE / 1e6
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.done and final.reward == 0.75
        assert final.metadata["service_spend"]["settled"]["usd"] == 2 * CPU_PRICE / 1e6
        await ep.handle.result()
        audit = h.settings.state_dir / "audit" / f"{ep.episode_id}.json"
        jobs = {job["role"]: job for job in json.loads(audit.read_text())["jobs"]}
    # The record measures each job's artifact in the bucket (the agent's checkpoint).
    assert jobs["agent"]["artifact_bytes"] == 1000
    assert jobs["grader"]["artifact_bytes"] == 0
    agent, grader = hub.calls_to("run_uv_job")
    assert grader.args["secrets"] == {
        HIDDEN_SEED_SECRET: grader.args["secrets"][HIDDEN_SEED_SECRET]
    }
    assert agent.args["secrets"] is None
    agent_folder = next(
        j.folder for j in hub.jobs.values() if j.spec["labels"]["posttrain-role"] == "agent"
    )
    model = next(v for v in grader.args["volumes"] if v.mount_path == "/model")
    assert model.path == f"{agent_folder}/outputs" and model.read_only


async def test_a_submit_whose_answer_is_lost_is_retried_by_its_policy_into_one_job(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, hub: FakeHub
) -> None:
    plans(hub, JobPlan(scheduling_s=5, running_s=30))
    hub.fail("run_uv_job", 503, after=True)  # created, then the connection drops
    hub.fail("list_jobs", 429)  # and the retry's first look is rate-limited
    async with hf_worker(time_skipping_env, tmp_path, hub) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        assert (await ep.wait_job(job_id)).data["state"] == "succeeded"
    assert len(hub.jobs) == 1 and len(hub.calls_to("run_uv_job")) == 1


async def test_no_credits_fails_the_job_at_once_with_an_hf_error(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, hub: FakeHub
) -> None:
    hub.fail("run_uv_job", 402)
    async with hf_worker(time_skipping_env, tmp_path, hub) as h:
        ep = await h.episode()
        answer = await ep.call(
            "jobs_submit", script="print('x')\n", flavor="cpu-basic", timeout_minutes=5
        )
        shown = str(answer.data)
        assert "hf_error" in shown and "no credits" in shown, shown
        assert answer.metadata["service_spend"]["reserved"]["usd"] == 0.0
    assert len(hub.calls_to("run_uv_job")) == 1  # not retried


async def test_a_stuck_cancellation_retries_visibly_with_the_job_id_and_fails_reset(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, hub: FakeHub
) -> None:
    plans(hub, JobPlan(scheduling_s=5, running_s=100_000, cancel_after_s=None))
    async with hf_worker(time_skipping_env, tmp_path, hub, cancel_confirm_s=120) as h:
        session = await h.session()
        first = await h.episode(session=session)
        job_id = await first.submit_job(timeout_minutes=60)
        reset = await session.start_update(
            SessionWorkflow.reset,
            ResetRequest(task_id="t_test"),
            result_type=ResetResult,
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        )
        await first.skip(timedelta(minutes=4))
        with pytest.raises(WorkflowUpdateFailedError) as failure:
            await reset.result()
        cause = failure.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "hf_error"
        assert job_id in cause.message and "not confirmed" in cause.message
        # What the Temporal UI shows: the job workflow's cancel activity, retrying, naming the
        # Hugging Face job in its failure and its heartbeat details.
        hf_id = HfRef.decode(next(iter(hub.jobs))).job_id
        job = h.client.get_workflow_handle(job_workflow_id(first.episode_id, 1))
        pending = (await job.describe()).raw_description.pending_activities
        (cancel,) = [a for a in pending if a.activity_type.name == "cancel_job"]
        assert cancel.attempt > 1 and hf_id in cancel.last_failure.message
        details = await h.client.data_converter.decode(cancel.heartbeat_details.payloads)
        assert details and details[0]["hf_job_id"] == hf_id
    assert hub.jobs[hf_id].cancel_at is not None


async def test_outputs_over_the_cap_are_measured_refused_deleted_and_typed_at_submit(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, hub: FakeHub
) -> None:
    """A Hugging Face job writes its outputs into its bucket folder as it runs; once it ended
    its job workflow measures them (issue 41): over the 20 GiB cap they are deleted whole, the
    job ends `failed` saying by how much, and dev_evaluate and submit answer `limit_reached`
    (the agent may submit another job), never not_ready and never an unscored end."""
    huge = 21 * 1024**3  # the default cap on Hugging Face is 20 GiB
    plans(hub, JobPlan(scheduling_s=5, running_s=30, outputs={"model.safetensors": huge}))
    async with hf_worker(time_skipping_env, tmp_path, hub) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        ended = await ep.wait_job(job_id)
        assert ended.data["state"] == "failed" and ended.data["stored_bytes"] == 0
        error = ended.data["outputs_error"]
        assert error["type"] == "limit_reached" and error["cap"] == "artifact"
        assert error["over_by_bytes"] == 1024**3
        for tool in ("dev_evaluate", "submit"):
            answer = await ep.call(tool, job_id=job_id)
            assert answer.data["error"]["type"] == "limit_reached" and not answer.done
        # Nothing over the cap is kept: the folder holds no outputs any more.
        kept = [path for bucket in hub.buckets.values() for path in bucket if "/outputs/" in path]
        assert kept == []
    # No evaluation job was ever started for it.
    assert [c.args["labels"]["posttrain-role"] for c in hub.calls_to("run_uv_job")] == ["agent"]
