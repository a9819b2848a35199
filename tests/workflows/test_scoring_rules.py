"""Scoring rules a reward-seeking agent would probe (issue 13): nothing starts or changes while
submit grades, dev evaluations count as live jobs, an unscored end says `reward: null`, and a
script's syntax is the job's Python's, not the server's."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from temporalio.client import WorkflowUpdateStage
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.episode_calls import ToolCall, ToolResult
from posttrain_common.contracts.jobs import JobRole
from tests.workflows.harness import Answer, Episode, running_worker, write_task
from workflows.episode.workflow import EpisodeWorkflow

AGENT = FakeJobScript(role=JobRole.agent, queue_s=1, run_s=10)
SLOW_EVALUATION = FakeJobScript(role=JobRole.dev, queue_s=1, run_s=3600)
SLOW_GRADER = FakeJobScript(role=JobRole.grader, queue_s=1, run_s=3600)
# Python 3.12 only: a `type` statement and an f-string reusing its quotes (PEP 695, PEP 701).
PY312_ONLY = 'type Pair = tuple[int, int]\nprint(f"{"nested"}")\n'


async def start(ep: Episode, tool: str, request_id: str, **arguments: object):
    """An update accepted by the episode but not awaited (its handler may block)."""
    return await ep.handle.start_update(
        EpisodeWorkflow.call_tool,
        ToolCall(request_id=request_id, tool=tool, arguments=arguments),
        id=f"{ep.episode_id}:{request_id}",
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        result_type=ToolResult,
    )


async def succeeded_job(ep: Episode) -> str:
    job_id = await ep.submit_job()
    assert (await ep.wait_job(job_id, step=timedelta(seconds=31))).data["state"] == "succeeded"
    return job_id


async def test_while_submit_grades_nothing_may_start_or_change_but_reads_answer(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    scenario = FakeScenario(jobs=[SLOW_GRADER, AGENT])
    async with running_worker(time_skipping_env, tmp_path, scenario) as h:
        ep = await h.episode()
        job_id = await succeeded_job(ep)
        await start(ep, "submit", "grade", job_id=job_id)  # grades for an hour
        await ep.skip(timedelta(seconds=5))
        refused = {
            "jobs_submit": await ep.call(
                "jobs_submit", script="print(1)\n", flavor="cpu-basic", timeout_minutes=5
            ),
            "jobs_cancel": await ep.call("jobs_cancel", job_id=job_id),
            "dev_evaluate": await ep.call("dev_evaluate", job_id=job_id),
        }
        for tool, answer in refused.items():
            assert answer.data["error"]["type"] == "not_allowed", tool
            assert "graded" in answer.data["error"]["message"]
        assert (await ep.call("jobs_status", job_id=job_id)).data["state"] == "succeeded"
        status = await ep.status()
        assert [job["job_id"] for job in status.jobs if job["job_id"].startswith("job-")] == [
            job_id
        ]
        assert status.service_spend.reserved.usd == 0.0  # nothing was reserved meanwhile


async def test_dev_evaluations_count_toward_the_live_job_limit(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    tasks_dir = tmp_path / "tasks"
    write_task(tasks_dir, "t_evals", max_dev_evaluations=10)  # the allowance is not the limit
    scenario = FakeScenario(jobs=[SLOW_EVALUATION, AGENT])
    async with running_worker(time_skipping_env, tmp_path, scenario) as h:
        ep = await h.episode("t_evals")
        # One job each: a second dev_evaluate of a job under evaluation attaches to it (issue 20).
        job_ids = [await succeeded_job(ep) for _ in range(6)]
        await asyncio.gather(
            *(start(ep, "dev_evaluate", f"dev-{n}", job_id=job_ids[n]) for n in range(6))
        )
        await ep.skip(timedelta(seconds=5))
        answers = [await ep.handle.query(EpisodeWorkflow.result_of, f"dev-{n}") for n in range(6)]
        refused = [a for a in answers if a is not None]
        # Two evaluations run (the task allows 2 live jobs); the other four were refused at once.
        assert len(refused) == 4
        assert all(a.data["error"]["type"] == "limit_reached" for a in refused)
        assert all("dev evaluations" in a.data["error"]["message"] for a in refused)
        status = await ep.status()
        assert sum(job["job_id"].startswith("eval-") for job in status.jobs) == 2
        # And a running dev evaluation holds a slot against a new agent job too.
        another = await ep.call(
            "jobs_submit", script="x = 1\n", flavor="cpu-basic", timeout_minutes=5
        )
        assert another.data["error"]["type"] == "limit_reached"


async def test_an_unscored_end_says_reward_null(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    broken = FakeJobScript(role=JobRole.grader, outcome="failed", queue_s=1, run_s=5)
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[broken, AGENT])) as h:
        ep = await h.episode()
        job_id = await succeeded_job(ep)
        final: Answer = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.done and final.reward is None
        end = final.metadata["episode_end"]
        assert end["reason"] == "score_failed"
        assert "reward" in end and end["reward"] is None


async def test_a_script_is_checked_for_the_python_its_job_runs(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The fake backend stands in for Hugging Face, whose jobs run Python 3.12: a 3.12-only script
    is accepted (the server runs 3.11), and a 3.12 syntax error is invalid_script."""
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[AGENT])) as h:
        ep = await h.episode()
        assert h.backend.job_python_version == "3.12"
        accepted = await ep.call(
            "jobs_submit", script=PY312_ONLY, flavor="cpu-basic", timeout_minutes=5
        )
        assert "error" not in accepted.data, accepted.data
        refused = await ep.call(
            "jobs_submit", script="def broken(:\n    pass\n", flavor="cpu-basic", timeout_minutes=5
        )
        assert refused.data["error"]["type"] == "invalid_script"
        assert "Python 3.12" in refused.data["error"]["message"]
        assert "line 2" in refused.data["error"]["message"]  # where the parser stopped


async def test_a_job_records_the_base_model_commit_it_mounts(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[AGENT])) as h:
        ep = await h.episode()
        commit = ep.reset.setup.base_model.revision
        assert len(commit) == 40  # the task's `main`, resolved once at reset
        info = await ep.call("task_info")
        assert info.data["base_model"]["revision"] == commit
        await ep.submit_job()
        assert h.backend.requests()[0].base_model.revision == commit
