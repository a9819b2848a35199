"""Tool rules: typed errors as data (and counted as steps), ownership, retries, idempotency."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeDataset, FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.models import MAX_DATASETS, MAX_DEPENDENCIES, MAX_SCRIPT_BYTES
from tests.workflows.harness import running_worker, write_task


async def error_of(ep, tool: str, **arguments) -> dict:
    result = await ep.call(tool, **arguments)
    assert "error" in result.data, result.data
    return result.data["error"]


async def test_argument_and_policy_errors_are_typed_data_and_each_counts_as_a_step(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        ep = await h.episode()
        base = {"script": "print(1)\n", "flavor": "cpu-basic", "timeout_minutes": 5}
        cases = [
            ({**base, "flavor": "a100-large"}, "flavor_not_allowed"),
            ({**base, "timeout_minutes": 61}, "timeout_not_allowed"),
            ({**base, "timeout_minutes": 0}, "timeout_not_allowed"),
            ({**base, "script": "def broken(:\n"}, "invalid_script"),
            ({**base, "script": "x" * (MAX_SCRIPT_BYTES + 1)}, "invalid_script"),
            ({**base, "dependencies": ["git+https://example.org/x.git"]}, "invalid_dependency"),
            (
                {**base, "dependencies": [f"pkg{i}" for i in range(MAX_DEPENDENCIES + 1)]},
                "invalid_dependency",
            ),
            (
                {**base, "datasets": [f"org/d{i}" for i in range(MAX_DATASETS + 1)]},
                "dataset_not_allowed",
            ),
            ({**base, "unexpected": 1}, "invalid_argument"),
        ]
        for n, (arguments, expected) in enumerate(cases, start=1):
            result = await ep.call("jobs_submit", **arguments)
            assert result.data["error"]["type"] == expected, (arguments.keys(), result.data)
            assert result.data["error"]["message"]
            assert result.metadata["steps_used"] == n
        for tool, arguments, expected in [
            ("jobs_wait", {"job_id": "job-000000000000", "timeout_s": 601}, "invalid_argument"),
            ("jobs_logs", {"job_id": "job-000000000000", "tail": 2001}, "invalid_argument"),
            ("no_such_tool", {}, "invalid_argument"),
        ]:
            assert (await error_of(ep, tool, **arguments))["type"] == expected
        status = await ep.status()
        assert status.steps_used == len(cases) + 3
        assert status.service_spend.reserved.usd == 0.0 and status.jobs == []


async def test_the_largest_allowed_script_and_dependency_list_are_accepted(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        ep = await h.episode()
        script = "#" + "x" * (MAX_SCRIPT_BYTES - 2) + "\n"
        deps = [f"pkg{i}" for i in range(MAX_DEPENDENCIES)]
        await ep.submit_job(script=script, dependencies=deps)
        submitted = h.backend.requests()[0]
        assert submitted.script == script and len(submitted.dependencies) == MAX_DEPENDENCIES


async def test_datasets_must_exist_be_public_ungated_and_not_denylisted(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    datasets = {
        "org/public": FakeDataset(revision="a" * 40),
        "org/private": FakeDataset(private=True),
        "org/gated": FakeDataset(gated=True),
    }
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(datasets=datasets)) as h:
        ep = await h.episode()
        for name, reason in [
            ("org/private", "private"),
            ("org/gated", "gated"),
            ("org/missing", "does not exist"),
        ]:
            error = await error_of(
                ep,
                "jobs_submit",
                script="pass\n",
                flavor="cpu-basic",
                timeout_minutes=5,
                datasets=[name],
            )
            assert error["type"] == "dataset_not_allowed" and reason in error["message"]
        await ep.submit_job(datasets=["org/public"])
        mounted = h.backend.requests()[0].datasets
        assert [(d.repo_id, d.revision) for d in mounted] == [("org/public", "a" * 40)]


async def test_concurrent_jobs_are_limited_per_task(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        ep = await h.episode()  # the test task allows 2 live jobs
        await ep.submit_job()
        await ep.submit_job()
        error = await error_of(
            ep, "jobs_submit", script="pass\n", flavor="cpu-basic", timeout_minutes=5
        )
        assert error["type"] == "limit_reached"


async def test_submit_and_dev_evaluate_on_a_job_that_has_not_succeeded_are_not_ready(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    failing = FakeJobScript(role=JobRole.agent, script_contains="FAIL", outcome="failed")
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[failing])) as h:
        ep = await h.episode()
        queued = await ep.submit_job()
        for tool in ("submit", "dev_evaluate"):
            error = await error_of(ep, tool, job_id=queued)
            assert error["type"] == "not_ready" and error["state"] == "queued"
        failed = await ep.submit_job(script="print('FAIL')\n")
        assert (await ep.wait_job(failed)).data["state"] == "failed"
        assert (await error_of(ep, "submit", job_id=failed))["type"] == "not_ready"
        assert not (await ep.status()).done


async def test_another_episodes_job_is_an_unknown_job(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        mine, theirs = await h.episode(), await h.episode()
        their_job = await theirs.submit_job()
        for tool in (
            "jobs_status",
            "jobs_logs",
            "jobs_cancel",
            "jobs_wait",
            "dev_evaluate",
            "submit",
        ):
            error = await error_of(mine, tool, job_id=their_job)
            assert error["type"] == "unknown_job", tool
        assert (await mine.call("jobs_status")).data == {
            "jobs": [],
            "total": 0,
            "next_cursor": None,
        }
        assert (await theirs.call("jobs_status", job_id=their_job)).data["state"] == "queued"


async def test_jobs_logs_returns_the_jobs_lines_without_its_nonce(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    chatty = FakeJobScript(logs=["step 1 loss 2.0", "step 2 loss 1.5"])
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[chatty])) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        await ep.wait_job(job_id)
        lines = (await ep.call("jobs_logs", job_id=job_id, tail=2)).data["lines"]
        assert lines == ["step 1 loss 2.0", "step 2 loss 1.5"]
        nonce = h.backend.requests()[0].env["POSTTRAIN_NONCE"]
        everything = (await ep.call("jobs_logs", job_id=job_id)).data["lines"]
        assert not any(nonce in line for line in everything)


async def test_the_same_request_id_twice_is_applied_once(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        ep = await h.episode()
        arguments = {"script": "pass\n", "flavor": "cpu-basic", "timeout_minutes": 5}
        first = await ep.call("jobs_submit", request_id="same", **arguments)
        second = await ep.call("jobs_submit", request_id="same", **arguments)
        assert first == second
        status = await ep.status()
        assert len(status.jobs) == 1 and status.steps_used == 1
        assert len(h.backend.requests()) == 1


async def test_a_submit_that_fails_after_creating_the_job_is_retried_and_one_job_exists(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    flaky = FakeJobScript(fail_after_create=True)
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[flaky])) as h:
        ep = await h.episode()
        result = await ep.call_over(
            timedelta(seconds=40),
            "jobs_submit",
            script="pass\n",
            flavor="cpu-basic",
            timeout_minutes=5,
        )
        assert result.data["state"] == "queued", result.data
        assert len(h.backend.requests()) == 1
        assert (await ep.wait_job(result.data["job_id"])).data["state"] == "succeeded"


async def test_transient_service_errors_are_retried(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    busy = FakeJobScript(transient_errors={"submit": 2, "observe": 2, "logs": 1})
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[busy])) as h:
        ep = await h.episode()
        result = await ep.call_over(
            timedelta(seconds=40),
            "jobs_submit",
            script="pass\n",
            flavor="cpu-basic",
            timeout_minutes=5,
        )
        job_id = result.data["job_id"]
        assert (await ep.wait_job(job_id)).data["state"] == "succeeded"
        logs = await ep.call_over(timedelta(seconds=40), "jobs_logs", job_id=job_id)
        assert "lines" in logs.data


async def test_a_service_that_keeps_failing_is_an_hf_error_and_nothing_is_reserved(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    down = FakeJobScript(transient_errors={"submit": 100})
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[down])) as h:
        ep = await h.episode()
        result = await ep.call_over(
            timedelta(minutes=10),
            "jobs_submit",
            script="pass\n",
            flavor="cpu-basic",
            timeout_minutes=5,
        )
        assert result.data["error"]["type"] == "hf_error"
        assert "503" in result.data["error"]["message"]
        assert result.metadata["service_spend"]["reserved"]["usd"] == 0.0
        assert result.metadata["service_spend"]["final"] is True


async def test_only_the_step_path_carries_reward_and_spend(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        await ep.wait_job(job_id)
        before = (await ep.status()).steps_used
        direct = await ep.call("jobs_status", path="mcp", job_id=job_id)
        assert "service_spend" not in direct.metadata and direct.reward is None
        assert direct.metadata["steps_used"] == before + 1  # every path counts
        final = await ep.call_over(timedelta(minutes=5), "submit", path="mcp", job_id=job_id)
        assert final.done and final.reward is None
        assert "service_spend" not in final.metadata
        status = await ep.status()
        assert status.end is not None and status.end.reward == 0.5


async def test_a_task_without_its_evaluator_answers_evaluations_with_a_clear_error(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        write_task(tmp_path / "tasks", "t_no_eval", evaluator=False)
        ep = await h.episode("t_no_eval")
        job_id = await ep.submit_job()
        await ep.wait_job(job_id)
        before = (await ep.status()).steps_used
        for _ in range(3):  # the task allows 2: failed starts use up no allowance
            result = await ep.call("dev_evaluate", job_id=job_id)
            assert result.data["error"]["type"] == "not_allowed"
            assert "evaluator.py does not exist" in result.data["error"]["message"]
            assert result.metadata["service_spend"]["reserved"]["usd"] == 0.0
            assert result.metadata["service_spend"]["settled"]["calls"] == 0
            assert not result.done
        assert (await ep.status()).steps_used == before + 3  # each error counted as a step
