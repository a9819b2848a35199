"""Long calls sent again with a new request id (issue 20), on the time-skipping server: a
`submit` or `dev_evaluate` that attaches to the work an earlier call started is no step, and is
answered even when no step is left; a grading cut short by a reset, a cancel or a DELETE says so
to the submit and to its repeat, instead of blaming the grader."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowUpdateHandle, WorkflowUpdateStage
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.episode_calls import EndRequest, ToolCall, ToolResult
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.models import EndReason
from tests.workflows.harness import SKIP_STEP, Episode, running_worker, write_task
from workflows.episode.workflow import EpisodeWorkflow

AGENT = FakeJobScript(role=JobRole.agent, queue_s=1, run_s=10)
GRADER = FakeJobScript(role=JobRole.grader, queue_s=1, run_s=300, score=0.75)
SLOW_GRADER = FakeJobScript(role=JobRole.grader, queue_s=1, run_s=3600)
EVALUATION = FakeJobScript(role=JobRole.dev, queue_s=1, run_s=300, score=0.5)


async def start(
    ep: Episode, tool: str, request_id: str, **arguments: object
) -> WorkflowUpdateHandle:
    """A call accepted by the episode, not awaited (its handler waits for the work)."""
    return await ep.handle.start_update(
        EpisodeWorkflow.call_tool,
        ToolCall(request_id=request_id, tool=tool, arguments=arguments),
        id=f"{ep.episode_id}:{request_id}",
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        result_type=ToolResult,
    )


async def answer_of(ep: Episode, request_id: str, within: timedelta) -> ToolResult:
    """The answer to an accepted call, letting workflow time pass until it is there (an open
    poll of an update's result would stall the test server's skipping)."""
    skipped = timedelta(0)
    while (answer := await ep.handle.query(EpisodeWorkflow.result_of, request_id)) is None:
        assert skipped < within, f"{request_id} was not answered within {within}"
        await ep.env.sleep(SKIP_STEP)
        skipped += SKIP_STEP
    return answer


async def succeeded_job(ep: Episode) -> str:
    """An agent job that succeeded, seen by the episode's watcher (one step: its submit)."""
    job_id = await ep.submit_job()
    for _ in range(10):
        await ep.skip(SKIP_STEP)
        states = {job["job_id"]: job["state"] for job in (await ep.status()).jobs}
        if states[job_id] == "succeeded":
            return job_id
    raise AssertionError(f"job {job_id} did not succeed: {states}")


def evaluations(status_jobs: list[dict], prefix: str) -> list[dict]:
    return [job for job in status_jobs if job["job_id"].startswith(prefix)]


async def test_a_submit_sent_again_when_no_step_is_left_attaches_and_takes_no_step(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    write_task(tmp_path / "tasks", "t_three", max_steps=3)
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[GRADER, AGENT])) as h:
        ep = await h.episode("t_three")
        job_id = await succeeded_job(ep)  # step 1
        await ep.call("task_info")  # step 2
        await start(ep, "submit", "grade", job_id=job_id)  # step 3, the last: grading
        await ep.skip(timedelta(seconds=5))
        assert (await ep.status()).steps_used == 3
        # The client gave up; the agent asks again, with a new request id and no step left.
        again = await ep.call_over(
            timedelta(minutes=10), "submit", request_id="again", job_id=job_id
        )
        first = await answer_of(ep, "grade", timedelta(minutes=1))
        assert again.data == first.data and again.data["score"] == 0.75, again.data
        assert again.done is True and again.reward == 0.75
        status = await ep.status()
        assert status.steps_used == 3 and status.steps_left == 0
        assert status.end is not None and status.end.reason is EndReason.submitted
        assert len([r for r in h.backend.requests() if r.role is JobRole.grader]) == 1


async def test_a_dev_evaluate_sent_again_takes_no_step_while_it_runs_nor_once_it_scored(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    scenario = FakeScenario(jobs=[EVALUATION, AGENT])
    async with running_worker(time_skipping_env, tmp_path, scenario) as h:
        ep = await h.episode()
        job_id = await succeeded_job(ep)
        await start(ep, "dev_evaluate", "dev", job_id=job_id)
        await ep.skip(timedelta(seconds=5))
        steps = (await ep.status()).steps_used
        again = await ep.call_over(timedelta(minutes=10), "dev_evaluate", job_id=job_id)
        later = await ep.call("dev_evaluate", job_id=job_id)  # its evaluation has scored
        assert again.data["score"] == 0.5 and later.data == again.data
        assert (await answer_of(ep, "dev", timedelta(minutes=1))).data == again.data
        status = await ep.status()
        assert status.steps_used == steps  # neither repeat was a step
        assert (
            len(evaluations(status.jobs, "eval-")) == 1 and status.service_spend.settled.calls == 1
        )
        # A call that starts something is still a step.
        await ep.call("jobs_status", job_id=job_id)
        assert (await ep.status()).steps_used == steps + 1


@pytest.mark.parametrize(
    ("reason", "says"),
    [
        (EndReason.reset, "the episode was reset"),
        (EndReason.cancelled, "the episode was cancelled"),
        (EndReason.abandoned, "the episode was abandoned (DELETE /episodes/<episode_id>)"),
    ],
)
async def test_a_grading_cut_short_says_why_to_the_submit_and_to_its_repeat(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, reason: EndReason, says: str
) -> None:
    scenario = FakeScenario(jobs=[SLOW_GRADER, AGENT])
    async with running_worker(time_skipping_env, tmp_path, scenario) as h:
        ep = await h.episode()
        job_id = await succeeded_job(ep)
        await start(ep, "submit", "grade", job_id=job_id)
        await ep.skip(timedelta(seconds=5))
        await start(ep, "submit", "again", job_id=job_id)  # attached to the grading
        await ep.skip(timedelta(seconds=5))
        await ep.handle.signal(EpisodeWorkflow.end_requested, EndRequest(reason=reason))
        for request_id in ("grade", "again"):
            answer = (await answer_of(ep, request_id, timedelta(minutes=5))).data
            assert answer["score"] is None, (request_id, answer)
            assert answer["reason"].startswith(says), (request_id, answer)
            assert "before its grading finished" in answer["reason"]
            assert "grader job ended" not in answer["reason"]
        status = await ep.status()
        assert status.end is not None and status.end.reason is reason
        assert len(evaluations(status.jobs, "eval-")) == 1  # one grader, never a second
