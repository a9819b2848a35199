"""An episode's audit record: written when it ends, holding every call and job, valid against
the published schema, and carrying no secret."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.audit import SCHEMA_PATH, audit_schema
from posttrain_common.contracts.episode_calls import EndRequest
from posttrain_common.contracts.jobs import JobRole
from posttrain_common.keys import ServerKey
from posttrain_env.models import EndReason
from posttrain_server.commands.episodes import InvalidRecord, export_record, validate_record
from tests.workflows.harness import Episode, running_worker
from workflows.episode.workflow import EpisodeWorkflow
from workflows.policies import READ_RETRY

SCRIPT = "# train\nprint('training')\n"
AGENT = FakeJobScript(
    role=JobRole.agent,
    queue_s=1,
    run_s=10,
    launcher_lines=[
        {"stage": "installed", "packages": {"numpy": "2.4.6"}, "installer": "uv"},
        {"stage": "sandbox", "loopback_tcp": True},
        {"stage": "exit", "exit_code": 0, "signal": None, "loopback_tcp": True},
    ],
)
EVALS = FakeJobScript(queue_s=1, run_s=30, score=0.625)


def test_the_published_schema_is_the_models_schema() -> None:
    assert json.loads(SCHEMA_PATH.read_text()) == audit_schema()


def test_a_record_that_breaks_the_schema_is_refused_naming_where() -> None:
    with pytest.raises(InvalidRecord, match="calls"):
        validate_record({"episode_id": "ep-1", "task_id": "t", "base_model": "m",
                         "base_model_revision": "r", "calls": "not a list"})  # fmt: skip


async def test_a_scripted_episodes_record_holds_every_call_and_job_and_no_secret(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[AGENT, EVALS])) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(script=SCRIPT, dependencies=["numpy>=2"])
        assert (await ep.wait_job(job_id, step=timedelta(seconds=31))).data["state"] == "succeeded"
        dev = await ep.call_over(timedelta(minutes=5), "dev_evaluate", job_id=job_id)
        assert dev.data["score"] == 0.625, dev.data
        refused = await ep.call("jobs_status", job_id="job-nope")
        assert refused.data["error"]["type"] == "unknown_job"
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.done and final.reward == 0.625
        end = await ep.handle.result()
        steps = (await ep.status()).steps_used
        settled = final.metadata["service_spend"]["settled"]["usd"]

        path = h.settings.state_dir / "audit" / f"{ep.episode_id}.json"
        text = path.read_text()
        record = json.loads(text)
        validate_record(record)
        assert await export_record(h.client, h.settings, ep.episode_id) == record

    assert end["reason"] == "submitted"
    assert record["end"] == {
        "reason": "submitted",
        "reward": 0.625,
        "invalid_score": None,
        "replayed": None,  # a measured reward: its jobs ran (on the fake)
        "replay_miss": None,
        "replay_misses": None,
    }
    assert all(job["replayed"] is None for job in record["jobs"])
    assert record["task_id"] == "t_test" and record["backend"] == "fake"
    calls = record["calls"]
    assert len(calls) == steps
    assert calls[0]["tool"] == "jobs_submit" and calls[-1]["tool"] == "submit"
    digest = hashlib.sha256(SCRIPT.encode()).hexdigest()
    assert calls[0]["arguments"]["script"] == {"sha256": digest}
    assert record["scripts"] == {digest: SCRIPT}
    assert [c["error_type"] for c in calls if c["error_type"]] == ["unknown_job"]
    assert all(c["answered_at"] for c in calls)

    jobs = {job["role"]: job for job in record["jobs"]}
    assert set(jobs) == {"agent", "dev", "grader"} and len(record["jobs"]) == 3
    agent = jobs["agent"]
    assert agent["job_id"] == job_id and agent["script_sha256"] == digest
    assert agent["dependencies"] == ["numpy>=2"]
    assert agent["installed"] == {"numpy": "2.4.6"} and agent["installer"] == "uv"
    assert agent["loopback_tcp"] is True  # its launcher's sandbox line
    assert jobs["dev"]["loopback_tcp"] is None  # the fake's evaluation printed none
    assert agent["backend_job_id"] and agent["final_state"] == "succeeded"
    assert [c["state"] for c in agent["state_changes"]][-1] == "succeeded"
    assert agent["reserved_micro_usd"] == 167 * 5 and agent["settled_micro_usd"] == 167 * 1
    assert agent["base_model_revision"] == record["base_model_revision"]
    assert jobs["grader"]["settled_micro_usd"] is None  # graders are not charged
    evaluations = {e["split"]: e for e in record["evaluations"]}
    assert evaluations["dev"]["score"] == 0.625 and evaluations["dev"]["valid"] is True
    assert evaluations["hidden"]["evaluated_job_id"] == job_id
    assert record["final_spend_micro_usd"] / 1e6 == pytest.approx(settled)

    key = ServerKey.load_or_create(h.settings.state_dir / "server.key")
    secrets = [key.hidden_split_seed(ep.episode_id)]
    secrets += [key.job_nonce(job["workflow_id"]) for job in record["jobs"]]
    for secret in secrets:
        assert secret not in text
    assert "HF_TOKEN" not in text and "POSTTRAIN_NONCE" not in text


async def closed(ep: Episode) -> bool:
    """Whether the episode's workflow has closed, described raw."""
    described = await ep.env.client.workflow_service.describe_workflow_execution(
        DescribeWorkflowExecutionRequest(
            namespace=ep.env.client.namespace,
            execution=WorkflowExecution(workflow_id=ep.handle.id),
        )
    )
    return described.workflow_execution_info.HasField("close_time")


async def test_an_audit_record_that_cannot_be_written_is_retried_until_it_is(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A write that keeps failing (here the audit folder's path is a file) is retried past
    twice the 5 attempts it had before (then it was given up), with the episode's workflow
    open, and the record lands once it can."""
    blocked = tmp_path / "audit"
    blocked.write_text("not a folder")
    async with running_worker(time_skipping_env, tmp_path, audit_dir=blocked) as h:
        ep = await h.episode()
        await ep.handle.signal(
            EpisodeWorkflow.end_requested, EndRequest(reason=EndReason.cancelled)
        )

        async def audit_attempt() -> int:
            described = await ep.handle.describe()
            pending = described.raw_description.pending_activities
            attempts = [p.attempt for p in pending if p.activity_type.name == "write_audit"]
            return attempts[0] if attempts else 0

        for _ in range(200):
            if await audit_attempt() > 2 * READ_RETRY.maximum_attempts:
                break
            await ep.skip(timedelta(seconds=30))
        assert await audit_attempt() > 2 * READ_RETRY.maximum_attempts
        assert not await closed(ep)
        status = await ep.status()  # the episode's end is given meanwhile
        assert status.done and status.end is not None and status.end.reason is EndReason.cancelled

        blocked.unlink()
        # The next attempt comes within AUDIT_RETRY's longest interval (5 minutes). Time is
        # skipped here, not by awaiting the result: the test server ends a result's long poll
        # empty when it skips past the poll's timeout before the workflow closes.
        for _ in range(20):
            if await closed(ep):
                break
            await ep.skip(timedelta(seconds=30))
        end = await ep.handle.result()
        record = json.loads((blocked / f"{ep.episode_id}.json").read_text())

    assert end["reason"] == "cancelled"
    validate_record(record)
    assert record["episode_id"] == ep.episode_id and record["end"]["reason"] == "cancelled"


async def test_an_episode_that_cancelled_a_job_writes_its_record_on_the_test_server(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The episode ends with its job running: PtCancelPendingSince is set, then cleared once the
    cancellation is confirmed. The time-skipping server keeps the cleared Datetime attribute as
    a null payload, which the SDK's `describe()` cannot decode; the record is written anyway
    (it failed on every attempt before, and is retried until written now)."""
    long_job = FakeJobScript(role=JobRole.agent, queue_s=1, run_s=3600, cancel_confirm_after_s=30)
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[long_job])) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(script=SCRIPT)
        await ep.skip(timedelta(minutes=2))  # the job is running
        await ep.handle.signal(
            EpisodeWorkflow.end_requested, EndRequest(reason=EndReason.cancelled)
        )
        for _ in range(40):
            if await closed(ep):  # not `describe()`, which fails on that attribute here too
                break
            await ep.skip(timedelta(seconds=30))
        end = await ep.handle.result()
        path = h.settings.state_dir / "audit" / f"{ep.episode_id}.json"
        assert path.exists(), "no audit record"
        record = json.loads(path.read_text())

    assert end["reason"] == "cancelled"
    (job,) = record["jobs"]
    assert job["job_id"] == job_id and job["final_state"] == "cancelled"
