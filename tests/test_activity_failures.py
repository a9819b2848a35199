"""The failures activities raise for the workflow above them (not an agent's tool errors) are
built in one place (`posttrain_env.errors`) and typed, so the workflow branches on the type."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.backends.fake.backend import FakeBackend
from activities.backends.interface import ArtifactRejected, JobRequest
from activities.campaigns.activities import CampaignActivities, CampaignConfig
from activities.campaigns.store import CampaignStore
from activities.jobs.activities import JobsActivities
from activities.ports import JobToWatch
from posttrain_common.campaigns.spec import parse_spec
from posttrain_common.contracts.campaigns import PlanCampaign, ReopenCampaign
from posttrain_common.contracts.jobs import BackendJob, JobRole, RepoRef, SubmitJob
from posttrain_common.failures import (
    AGENT_FAILED,
    AGENT_INVALID,
    ARTIFACT_REJECTED,
    CAMPAIGN_INVALID,
    NON_RETRYABLE,
    agent_failure,
    artifact_rejected,
    artifact_rejection,
    campaign_invalid,
)
from posttrain_common.keys import ServerKey

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class RejectingBackend(FakeBackend):
    async def submit(self, request: JobRequest) -> BackendJob:
        raise ArtifactRejected("the artifact is over this task's cap")


class NoWatch:
    async def watch(self, job: JobToWatch) -> None:
        raise AssertionError("a job that never started is not watched")


async def test_an_artifact_the_backend_rejects_fails_the_submit_as_artifact_rejected(
    tmp_path: Path,
) -> None:
    jobs = JobsActivities(
        RejectingBackend(tmp_path / "fake"), ServerKey(b"k" * 32), NoWatch(), tmp_path / "tasks"
    )
    submit = SubmitJob(
        role=JobRole.agent,
        episode_id="ep-1",
        task_id="t_test",
        job_id="job-1",
        flavor="cpu-basic",
        timeout_s=60,
        script="print(1)\n",
        base_model=RepoRef(repo_id="org/base", revision="a" * 40),
        key="episode-ep-1/job/1",
        now=NOW,
    )
    with pytest.raises(ApplicationError) as raised:
        await jobs.submit_job(submit)
    assert raised.value.type == ARTIFACT_REJECTED and raised.value.non_retryable
    # What the job's workflow reads back from it (it scores the evaluation 0).
    assert artifact_rejection(raised.value) == "the artifact is over this task's cap"


def test_every_typed_failure_is_non_retryable_unless_said_otherwise() -> None:
    assert artifact_rejected("big").non_retryable and ARTIFACT_REJECTED in NON_RETRYABLE
    assert campaign_invalid("no task").type == CAMPAIGN_INVALID
    assert campaign_invalid("no task").non_retryable
    assert agent_failure(AGENT_INVALID, "no key").non_retryable
    retried = agent_failure(AGENT_FAILED, "no turn", non_retryable=False)
    assert retried.type == AGENT_FAILED and not retried.non_retryable
    with pytest.raises(ValueError, match="not an agent failure type"):
        agent_failure("campaign_invalid", "wrong family")


def campaigns(tmp_path: Path) -> CampaignActivities:
    calls: Any = None  # planning sends no tool call
    return CampaignActivities(
        FakeBackend(tmp_path / "fake"),
        CampaignStore(tmp_path / "campaigns"),
        calls,
        CampaignConfig(tasks_dir=tmp_path / "tasks"),
    )


SPEC = parse_spec(
    {
        "name": "smoke",
        "tasks": ["t_missing"],
        "agents": [{"name": "ref", "agent": "reference"}],
        "epochs": 1,
        "concurrency": 1,
        "budget_usd": 5.0,
    }
)


async def test_a_campaign_whose_task_does_not_exist_is_planned_as_campaign_invalid(
    tmp_path: Path,
) -> None:
    with pytest.raises(ApplicationError) as raised:
        await campaigns(tmp_path).plan_campaign(
            PlanCampaign(campaign_id="c1", spec=SPEC, created_at=NOW)
        )
    assert raised.value.type == CAMPAIGN_INVALID and raised.value.non_retryable
    assert "t_missing" in raised.value.message


async def test_a_campaign_reopened_without_its_folder_is_campaign_invalid(tmp_path: Path) -> None:
    with pytest.raises(ApplicationError) as raised:
        await campaigns(tmp_path).reopen_campaign(ReopenCampaign(campaign_id="c1", spec=SPEC))
    assert raised.value.type == CAMPAIGN_INVALID
    assert "has no campaign.json" in raised.value.message
