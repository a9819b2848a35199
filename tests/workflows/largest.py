"""An episode at its limits: the most jobs an episode may hold, each with its largest fields, for
the tests that bound what an episode answers and carries (issue 27)."""

from __future__ import annotations

from datetime import UTC, datetime

from posttrain_common.contracts.episodes import Caps, EpisodeSetup
from posttrain_common.contracts.jobs import JobRole, RepoRef, ScoreResult
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import MAX_FLAVOR_CHARS, MAX_JOB_ID_CHARS, MAX_JOBS_PER_EPISODE
from posttrain_env.models import FlavorPrice, JobState
from tasks.registry import load_task
from workflows.episode.ledger import Ledger, Settlement
from workflows.episode.state import EpisodeCarry, JobRecord

NOW = datetime(2026, 1, 1, tzinfo=UTC)
# The costliest character as JSON: a control character takes six bytes (`\u0001`).
CONTROL = "\x01"


def largest_setup() -> EpisodeSetup:
    return EpisodeSetup(
        episode_id="ep-0000000000000000",
        task=load_task("t0_artifact"),
        base_model=RepoRef(repo_id="org/model", revision="a" * 40),
        prices={"cpu-basic": FlavorPrice(name="cpu-basic", micro_usd_per_minute=167)},
        watcher_workflow_id="w",
        caps=Caps(account_workflow_id="a"),
    )


def largest_record(n: int, role: JobRole = JobRole.agent) -> JobRecord:
    """A finished job whose every text is as long as it may be, in the costliest characters."""
    job_id = f"job-{n:012x}".ljust(MAX_JOB_ID_CHARS, "0")
    return JobRecord(
        job_id=job_id,
        workflow_id=f"episode-ep-{'0' * 16}/job/{n}",
        role=role,
        flavor="f" * MAX_FLAVOR_CHARS,
        timeout_minutes=240,
        reserved_micro_usd=10**12,
        state=JobState.failed,
        submitted=True,
        backend_ref="r" * 200,
        final=True,
        message=CONTROL * 1_000_000,  # cut where it enters
        error=ToolError(
            ErrorType.invalid_dependency, CONTROL * 1_000_000, requirement=CONTROL * 240_000
        ).envelope(),
        score=ScoreResult(
            score=0.5,
            valid=True,
            reason=CONTROL * 100_000,
            details={"per_item": [CONTROL * 10] * 20},  # under MAX_SCORE_DETAILS_BYTES
        ),
        settlement=Settlement(
            key=job_id,
            kind="job",
            running_s=60.0,
            billed_minutes=1,
            cost_micro_usd=10**12,
            reserved_micro_usd=10**12,
            overrun_micro_usd=10**12,
            worst_case=True,
        ),
        created_at=NOW,
        started_at=NOW,
        finished_at=NOW,
        version=10**6,
        evaluated_job_id=job_id,
        base_model_revision="a" * 40,
        cancel_requested_at=NOW,
    )


def largest_episode() -> tuple[EpisodeSetup, EpisodeCarry]:
    """The setup, and a carry holding MAX_JOBS_PER_EPISODE of the largest agent jobs."""
    carry = EpisodeCarry(started_at=NOW, ledger=Ledger(budget_micro_usd=10**12))
    for n in range(MAX_JOBS_PER_EPISODE):
        record = largest_record(n)
        carry.jobs[record.job_id] = record
    carry.job_counter = MAX_JOBS_PER_EPISODE
    return largest_setup(), carry
