"""Payloads that cross Temporal stay bounded (DESIGN §10): oversized calls, long logs and large
messages are answered within their limits, and the episode goes on working."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pydantic_core
import pytest
from temporalio.testing import WorkflowEnvironment

import workflows.episode.payload_guard
import workflows.episode.rules
from activities.backends.fake.backend import FakeJobScript, FakeScenario
from mcp_gateway.episode_calls import call_tool, tool_call
from posttrain_common.contracts.episode_calls import ToolCall
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.errors import SessionError
from posttrain_env.limits import (
    MAX_LOG_ANSWER_BYTES,
    MAX_LOG_LINE_BYTES,
    MAX_MESSAGE_CHARS,
    MAX_SCRIPT_BYTES,
    json_size,
)
from tests.workflows.harness import Answer, Episode, running_worker

SUBMIT = {"flavor": "cpu-basic", "timeout_minutes": 5}
# A job that prints 2,000 lines of 4 KB with one 5 MB line among them, inside the last 2,000.
LOUD = FakeJobScript(
    role=JobRole.agent,
    script_contains="LOUD",
    queue_s=1,
    run_s=10,
    logs=[f"{i:04d} " + "y" * 4_000 for i in range(1000)]
    + ["L" * 5_000_000]
    + [f"{i:04d} " + "y" * 4_000 for i in range(1000, 2000)],
)


async def bounded_call(ep: Episode, tool: str, request_id: str, **arguments: object) -> Answer:
    """A call built by the edge's own constructor (which measures the arguments)."""
    call = tool_call(request_id, tool, arguments, "step")
    return Answer.of(await call_tool(ep.env.client, ep.episode_id, call), "step")


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"script": "x=1\n" * 600_000, **SUBMIT}, "invalid_script"),  # 2.4 MB
        ({"script": "x" * 20_000_000, **SUBMIT}, "invalid_script"),  # 20 MB
        (
            {"script": "print(1)\n", "dependencies": ["d" * 200] * 10_000, **SUBMIT},
            "invalid_argument",
        ),
    ],
)
async def test_an_oversized_call_is_one_typed_step_and_the_episode_goes_on(
    time_skipping_env: WorkflowEnvironment,
    tmp_path: Path,
    arguments: dict[str, object],
    expected: str,
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        ep = await h.episode()
        refused = await bounded_call(ep, "jobs_submit", "big", **arguments)
        assert refused.data["error"]["type"] == expected, refused.data
        assert refused.metadata["steps_used"] == 1
        answered = await bounded_call(ep, "task_info", "next")
        assert answered.data["task_id"] == "t_test" and answered.metadata["steps_used"] == 2
        status = await ep.status()
        assert status.jobs == [] and status.service_spend.reserved.usd == 0.0


async def test_a_call_too_large_to_send_is_refused_at_the_edge_not_sent(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The edge's last guard: a call built without `tool_call` is never sent over the limit."""
    async with running_worker(time_skipping_env, tmp_path) as h:
        ep = await h.episode()
        crafted = ToolCall(
            request_id="crafted", tool="jobs_submit", arguments={"script": "x" * 2_400_000}
        )
        with pytest.raises(SessionError) as info:
            await call_tool(h.client, ep.episode_id, crafted)
        assert info.value.code == "PAYLOAD_TOO_LARGE"
        assert (await ep.call("task_info")).metadata["steps_used"] == 1  # nothing was counted


@pytest.mark.parametrize("script", ["", "   \n\t\n", "\x01" * MAX_SCRIPT_BYTES])
async def test_empty_and_control_character_scripts_are_invalid_and_reserve_nothing(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, script: str
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        ep = await h.episode()
        result = await bounded_call(ep, "jobs_submit", "r1", script=script, **SUBMIT)
        assert result.data["error"]["type"] == "invalid_script"
        assert result.metadata["service_spend"]["reserved"]["usd"] == 0.0
        assert (await ep.status()).jobs == [] and h.backend.requests() == []


async def test_long_logs_are_answered_within_limits_and_survive_continue_as_new(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(
        time_skipping_env, tmp_path, FakeScenario(jobs=[LOUD]), continue_as_new_events=100
    ) as h:
        ep = await h.episode()
        first_run = (await ep.handle.describe()).run_id
        job_id = await ep.submit_job(script="print('LOUD')\n")
        assert (await ep.wait_job(job_id)).data["state"] == "succeeded"
        answers = []
        for n in range(10):
            arguments = {"job_id": job_id, "tail": 2000}
            call = ToolCall(request_id=f"logs-{n}", tool="jobs_logs", arguments=arguments)
            result = await call_tool(ep.env.client, ep.episode_id, call)
            # The whole answer as it crossed Temporal, its metadata included.
            assert len(pydantic_core.to_json(result)) < MAX_LOG_ANSWER_BYTES + 4_096
            logs = Answer.of(result, "step")
            answers.append(logs)
            lines = logs.data["lines"]
            assert all(json_size(line) <= MAX_LOG_LINE_BYTES for line in lines)
            assert lines[-1].startswith("1999 ")
            truncated = logs.data["truncated"]
            assert truncated["lines"] == 2000 - len(lines) > 0
            # The 5 MB line is among the 2,000 asked for: all but its first 4 KiB is cut.
            assert truncated["bytes"] >= 5_000_000 - MAX_LOG_LINE_BYTES
        await ep.skip(timedelta(seconds=40))
        assert (await ep.handle.describe()).run_id != first_run  # it continued as new
        steps = (await ep.status()).steps_used
        # The newest answer is carried over and repeated; the oldest was dropped from the
        # carried answers (their budget is 512 KiB) and is refused, never run again.
        assert await ep.call("jobs_logs", request_id="logs-9", job_id=job_id) == answers[-1]
        dropped = await ep.call("jobs_logs", request_id="logs-0", job_id=job_id)
        assert dropped.data["error"]["type"] == "already_answered"
        assert (await ep.status()).steps_used == steps
        fresh = await ep.call("jobs_status", job_id=job_id)
        assert fresh.data["state"] == "succeeded" and fresh.metadata["steps_used"] == steps + 1


async def test_an_answer_over_the_workers_bound_is_a_typed_error_and_the_episode_goes_on(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real bound (1 MiB) is far above any answer; 16 KiB puts a 64 KiB log answer over it.
    monkeypatch.setattr(workflows.episode.payload_guard, "MAX_ANSWER_BYTES", 16 * 1024)
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[LOUD])) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(script="print('LOUD')\n")
        assert (await ep.wait_job(job_id)).data["state"] == "succeeded"
        steps = (await ep.status()).steps_used
        refused = await ep.call("jobs_logs", request_id="big", job_id=job_id, tail=2000)
        assert refused.data["error"]["type"] == "limit_reached", refused.data
        assert refused.data["error"]["answer_bytes"] > 16 * 1024
        assert refused.metadata["steps_used"] == steps + 1  # one step, answered as data
        # Sent again, it is the same answer (the call is never run twice).
        assert await ep.call("jobs_logs", request_id="big", job_id=job_id, tail=2000) == refused
        small = await ep.call("jobs_logs", job_id=job_id, tail=2)
        assert small.data["lines"][-1].startswith("1999 ")


async def test_a_carry_over_its_bound_drops_carried_answers_and_continues_as_new(
    time_skipping_env: WorkflowEnvironment,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The real bound (1.5 MiB) holds every carry; 96 KiB makes the guard act on this one.
    monkeypatch.setattr(workflows.episode.payload_guard, "MAX_CARRY_BYTES", 96 * 1024)
    async with running_worker(
        time_skipping_env, tmp_path, FakeScenario(jobs=[LOUD]), continue_as_new_events=100
    ) as h:
        ep = await h.episode()
        first_run = (await ep.handle.describe()).run_id
        job_id = await ep.submit_job(script="print('LOUD')\n")
        assert (await ep.wait_job(job_id)).data["state"] == "succeeded"
        for n in range(6):  # 6 answers of ~64 KiB: within their own budget, over the carry's
            await ep.call("jobs_logs", request_id=f"logs-{n}", job_id=job_id, tail=2000)
        await ep.skip(timedelta(seconds=40))
        assert (await ep.handle.describe()).run_id != first_run  # it continued as new
        # Without its answers the input took ~66 KB; with one of them it would not have fit.
        assert any("dropped" in r.getMessage() for r in caplog.records), "the guard did not act"
        steps = (await ep.status()).steps_used
        oldest = await ep.call("jobs_logs", request_id="logs-0", job_id=job_id)
        assert oldest.data["error"]["type"] == "already_answered", oldest.data
        for n in range(1, 6):  # dropped (already answered) or answered after the new run began
            again = await ep.call("jobs_logs", request_id=f"logs-{n}", job_id=job_id)
            assert "lines" in again.data or again.data["error"]["type"] == "already_answered"
        assert (await ep.status()).steps_used == steps  # nothing was run again
        fresh = await ep.call("jobs_status", job_id=job_id)
        assert fresh.data["state"] == "succeeded" and fresh.metadata["steps_used"] == steps + 1


async def test_a_backend_message_and_evaluator_details_of_megabytes_are_bounded(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    scenario = FakeScenario(
        jobs=[
            FakeJobScript(
                role=JobRole.agent,
                script_contains="FAIL",
                outcome="failed",
                message="M" * 3_000_000,
            ),
            FakeJobScript(role=JobRole.dev, eval_details={"per_item": ["q" * 100] * 100}),
            FakeJobScript(role=JobRole.grader, eval_details={"huge": "h" * 3_000_000}),
            FakeJobScript(queue_s=1, run_s=10),
        ]
    )
    async with running_worker(time_skipping_env, tmp_path, scenario) as h:
        ep = await h.episode()
        failed = await ep.submit_job(script="print('FAIL')\n")
        ended = await ep.wait_job(failed)
        assert ended.data["state"] == "failed"
        assert 0 < len(ended.data["message"]) <= MAX_MESSAGE_CHARS
        good = await ep.submit_job()
        assert (await ep.wait_job(good)).data["state"] == "succeeded"
        dev = await ep.call_over(timedelta(minutes=5), "dev_evaluate", job_id=good)
        assert dev.data["valid"] is True and "details_cut" in dev.data["details"]
        # A score line of megabytes is not a score line at all: invalid, scored 0.
        graded = await ep.call_over(timedelta(minutes=5), "submit", job_id=good)
        assert graded.done and graded.reward == 0.0
        assert graded.data["valid"] is False and "no score line" in graded.data["reason"]


async def test_history_size_alone_makes_an_episode_continue_as_new(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, continue_as_new_bytes=64 * 1024) as h:
        ep = await h.episode()
        first_run = (await ep.handle.describe()).run_id
        job_id = await ep.submit_job(script="#" + "x" * 100_000 + "\n")  # ~300 KB of history
        await ep.skip(timedelta(seconds=5))
        assert (await ep.handle.describe()).run_id != first_run
        status = await ep.call("jobs_status", job_id=job_id)
        assert status.data["job_id"] == job_id and status.metadata["steps_used"] == 2


async def test_an_episode_starts_a_bounded_number_of_jobs(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real limit (256) holds the job table's share of the carry; 3 shows the rule at work.
    monkeypatch.setattr(workflows.episode.rules, "MAX_JOBS_PER_EPISODE", 3)
    quick = FakeJobScript(queue_s=1, run_s=1)
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[quick])) as h:
        ep = await h.episode()
        for _ in range(3):
            job_id = await ep.submit_job()
            await ep.wait_job(job_id)
        refused = await ep.call("jobs_submit", script="print(1)\n", **SUBMIT)
        assert refused.data["error"]["type"] == "limit_reached"
        assert "3 jobs" in refused.data["error"]["message"]
