"""A whole episode, money and the end of an episode, on the time-skipping test server."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.episode_calls import ToolCall
from posttrain_common.contracts.jobs import JobRole
from tests.workflows.harness import running_worker, write_task
from workflows.episode.workflow import EpisodeWorkflow

CPU_PRICE = 167  # micro-USD per minute of cpu-basic in the fake's price list
T4_PRICE = 6_667


def scenario(*rules: FakeJobScript) -> FakeScenario:
    return FakeScenario(jobs=list(rules))


async def test_a_job_runs_and_submit_rewards_the_hidden_score(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    grader = FakeJobScript(role=JobRole.grader, score=0.75, run_s=30)
    async with running_worker(time_skipping_env, tmp_path, scenario(grader)) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        done = await ep.wait_job(job_id)
        assert done.data["state"] == "succeeded"
        assert done.data["artifact"] == f"openenv-artifact://{ep.episode_id}/{job_id}/outputs"
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.done and final.reward == 0.75
        assert final.metadata["episode_end"] == {"reason": "submitted", "reward": 0.75}
        spend = final.metadata["service_spend"]
        # 60 s of running is one minute of cpu-basic; the grader is free.
        assert spend == {
            "version": 2,
            "settled": {"usd": CPU_PRICE / 1e6, "gpu_s": 0.0, "jobs": 1, "calls": 0},
            "reserved": {"usd": 0.0},
            # The fake's job wrote nothing; its episode may keep the fake's default 100 GiB.
            "storage": {"bytes": 0, "reserved_bytes": 0, "cap_bytes": 100 << 30, "usd": 0.0},
            "final": True,
        }
        assert await h.client.get_workflow_handle(ep.handle.id).result() is not None


async def test_61_seconds_of_running_settle_as_2_minutes(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, scenario(FakeJobScript(run_s=61))) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        done = await ep.wait_job(job_id)
        assert done.data["running_s"] == 61.0
        assert done.data["cost_usd"] == 2 * CPU_PRICE / 1e6
        assert done.metadata["service_spend"]["settled"]["usd"] == 2 * CPU_PRICE / 1e6


async def test_an_overrun_past_the_timeout_is_settled_at_real_cost_and_reported(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    lagging = FakeJobScript(run_s=3600, stop_lag_s=90)  # times out at 5 min, stops 90 s later
    async with running_worker(time_skipping_env, tmp_path, scenario(lagging)) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(timeout_minutes=5)
        done = await ep.wait_job(job_id)
        assert done.data["state"] == "timed_out"
        assert done.data["cost_usd"] == 7 * CPU_PRICE / 1e6  # 390 s -> 7 minutes
        assert done.data["overrun_usd"] == 2 * CPU_PRICE / 1e6  # 5 minutes were reserved
        assert done.metadata["service_spend"]["reserved"]["usd"] == 0.0


async def test_the_budget_boundary_is_exact_to_the_micro_dollar(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        write_task(tmp_path / "tasks", "t_tight", budget_usd=(10 * CPU_PRICE) / 1e6)
        ep = await h.episode("t_tight")
        await ep.submit_job(timeout_minutes=9)
        refused = await ep.call(
            "jobs_submit", script="pass\n", flavor="cpu-basic", timeout_minutes=2
        )
        assert refused.data["error"]["type"] == "budget_exhausted"
        assert refused.data["error"]["remaining_usd"] == CPU_PRICE / 1e6
        exact = await ep.call("jobs_submit", script="pass\n", flavor="cpu-basic", timeout_minutes=1)
        assert "error" not in exact.data, exact.data
        assert exact.metadata["service_spend"]["reserved"]["usd"] == 10 * CPU_PRICE / 1e6


async def test_cancel_releases_the_reservation_and_settles_what_ran(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(
        time_skipping_env, tmp_path, scenario(FakeJobScript(queue_s=5, run_s=3600))
    ) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(timeout_minutes=60)
        running = await ep.call_over(
            timedelta(seconds=125), "jobs_wait", job_id=job_id, timeout_s=60
        )
        assert running.data["state"] == "running"
        await ep.skip(timedelta(seconds=60))
        cancelled = await ep.call_over(timedelta(seconds=30), "jobs_cancel", job_id=job_id)
        assert cancelled.data["state"] == "cancelled"
        ran = cancelled.data["running_s"]
        assert 60 < ran < 240
        minutes = -(-int(ran) // 60)
        assert cancelled.data["cost_usd"] == minutes * CPU_PRICE / 1e6
        spend = cancelled.metadata["service_spend"]
        assert spend["reserved"]["usd"] == 0.0 and spend["final"] is True
        assert spend["settled"]["jobs"] == 1


async def test_dev_evaluations_are_charged_and_counted_as_calls_and_the_grader_is_free(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    rules = scenario(
        FakeJobScript(role=JobRole.dev, run_s=100, score=0.25),
        FakeJobScript(role=JobRole.grader, run_s=500, score=0.5),
    )
    async with running_worker(time_skipping_env, tmp_path, rules) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        await ep.wait_job(job_id)
        dev = await ep.call_over(timedelta(minutes=5), "dev_evaluate", job_id=job_id)
        assert dev.data["score"] == 0.25 and dev.data["split"] == "dev"
        assert dev.data["cost_usd"] == 2 * CPU_PRICE / 1e6
        settled = dev.metadata["service_spend"]["settled"]
        assert settled["jobs"] == 1 and settled["calls"] == 1
        assert settled["usd"] == 3 * CPU_PRICE / 1e6
        final = await ep.call_over(timedelta(minutes=15), "submit", job_id=job_id)
        assert final.reward == 0.5
        # The grader ran 500 s on cpu-basic and cost the agent nothing.
        assert final.metadata["service_spend"]["settled"]["usd"] == 3 * CPU_PRICE / 1e6


async def test_gpu_seconds_count_accelerator_time(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, scenario(FakeJobScript(run_s=90))) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(flavor="t4-small")
        done = await ep.wait_job(job_id)
        settled = done.metadata["service_spend"]["settled"]
        assert settled["gpu_s"] == 90.0
        assert settled["usd"] == 2 * T4_PRICE / 1e6


async def test_final_is_false_while_a_job_is_live(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        ep = await h.episode()
        first = await ep.call("task_info")
        assert first.metadata["service_spend"]["final"] is True
        job_id = await ep.submit_job()
        live = await ep.call("jobs_status", job_id=job_id)
        assert live.metadata["service_spend"]["final"] is False
        done = await ep.wait_job(job_id)
        assert done.metadata["service_spend"]["final"] is True


async def test_the_last_allowed_call_runs_and_ends_the_episode_with_reward_0(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        ep = await h.episode()
        for n in range(1, 100):
            result = await ep.call("task_info")
            assert not result.done and result.metadata["steps_left"] == 100 - n
        last = await ep.call("list_hardware")
        assert "flavors" in last.data  # the 100th call ran
        assert last.done and last.reward == 0.0
        assert last.metadata["episode_end"]["reason"] == "max_steps"
        after = await ep.call("task_info")
        assert after.data["error"]["type"] == "episode_over"


async def test_a_call_after_the_end_says_what_to_do_next_on_its_own_path(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The episode answers every path alike (it never branches on a call's path); the edge adds
    what to do next on each: reset on OpenEnv, `POST /episodes` for an MCP-only client."""
    stuck = FakeJobScript(run_s=100_000, cancel_confirm_after_s=None)  # keeps the episode open
    async with running_worker(time_skipping_env, tmp_path, scenario(stuck)) as h:
        write_task(tmp_path / "tasks", "t_two_steps", max_steps=2)
        ep = await h.episode("t_two_steps")
        await ep.submit_job(timeout_minutes=60)
        assert (await ep.call("task_info")).metadata["episode_end"]["reason"] == "max_steps"
        raw = await ep.handle.execute_update(
            EpisodeWorkflow.call_tool, ToolCall(request_id="raw", tool="task_info", path="mcp")
        )
        assert raw.data["error"] == {
            "type": "episode_over",
            "message": "the episode is over (it ended: max_steps)",
        }
        step = (await ep.call("task_info", path="step")).data["error"]
        openenv_mcp = (await ep.call("task_info", path="openenv_mcp")).data["error"]
        mcp = (await ep.call("task_info", path="mcp")).data["error"]
    assert (
        step["message"] == "the episode is over (it ended: max_steps); call reset to start another"
    )
    assert openenv_mcp["message"] == step["message"]
    assert mcp["type"] == "episode_over" and mcp["message"].startswith(raw.data["error"]["message"])
    assert "POST /episodes" in mcp["message"] and "reset" not in mcp["message"]


async def test_the_time_limit_ends_the_episode_with_reward_0_and_cancels_live_jobs(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    endless = FakeJobScript(run_s=100_000)
    async with running_worker(time_skipping_env, tmp_path, scenario(endless)) as h:
        write_task(tmp_path / "tasks", "t_30_min", time_limit_s=1800)
        ep = await h.episode("t_30_min")
        job_id = await ep.submit_job(timeout_minutes=60)
        await ep.skip(timedelta(minutes=35))
        status = await ep.status()
        assert status.done and status.end is not None
        assert status.end.reason == "time_limit" and status.end.reward == 0.0
        job = next(j for j in status.jobs if j["job_id"] == job_id)
        assert job["state"] == "cancelled"
        assert status.service_spend.final is True
        after = await ep.call("jobs_status", job_id=job_id)
        assert after.data["error"]["type"] == "episode_over"
        assert after.done and after.reward == 0.0


async def test_a_submit_in_flight_at_the_deadline_still_counts(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    slow_grader = FakeJobScript(role=JobRole.grader, run_s=540, score=0.9)
    async with running_worker(time_skipping_env, tmp_path, scenario(slow_grader)) as h:
        write_task(tmp_path / "tasks", "t_short", time_limit_s=600)
        ep = await h.episode("t_short")
        job_id = await ep.submit_job()
        await ep.wait_job(job_id, step=timedelta(seconds=30))
        final = await ep.call_over(timedelta(minutes=20), "submit", job_id=job_id)
        assert final.reward == 0.9
        assert final.metadata["episode_end"]["reason"] == "submitted"


async def test_a_grader_failure_ends_unscored_with_spend_still_reported(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    broken = FakeJobScript(role=JobRole.grader, outcome="failed")
    async with running_worker(time_skipping_env, tmp_path, scenario(broken)) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        await ep.wait_job(job_id)
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.done and final.reward is None
        assert final.metadata["episode_end"]["reason"] == "score_failed"
        assert final.metadata["service_spend"]["settled"]["usd"] == CPU_PRICE / 1e6
        assert final.metadata["service_spend"]["final"] is True


async def test_a_score_line_without_the_nonce_is_ignored_and_scores_0_as_invalid(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    forged = FakeJobScript(role=JobRole.grader, eval_output="no_nonce", score=1.0)
    async with running_worker(time_skipping_env, tmp_path, scenario(forged)) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        await ep.wait_job(job_id)
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.reward == 0.0 and final.data["valid"] is False
        assert final.metadata["episode_end"]["reason"] == "submitted"
        assert "no score line" in final.metadata["episode_end"]["invalid_score"]


async def test_two_valid_score_lines_score_0_as_invalid(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    twice = FakeJobScript(role=JobRole.grader, eval_output="several", score=1.0)
    async with running_worker(time_skipping_env, tmp_path, scenario(twice)) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        await ep.wait_job(job_id)
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.reward == 0.0
        assert "2 score lines" in final.metadata["episode_end"]["invalid_score"]
