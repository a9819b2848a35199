"""The episode's pure rules and views (workflows/episode/rules.py), without Temporal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from posttrain_common.contracts.episodes import Caps, EpisodeSetup
from posttrain_common.contracts.jobs import BackendJob, JobRole, RepoRef, ScoreResult
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import EndReason, EpisodeEnd, FlavorPrice, JobState, TaskSpec
from tasks.registry import load_task
from workflows.episode.ledger import Ledger
from workflows.episode.rules import (
    agent_job,
    check_concurrency,
    check_dev_evaluation,
    check_flavor_and_timeout,
    job_view,
    step_metadata,
    succeeded_agent_job,
    take_snapshot,
)
from workflows.episode.state import EpisodeCarry, JobRecord
from workflows.job.workflow import JobSnapshot

T0 = datetime(2026, 12, 1, tzinfo=UTC)
CPU = FlavorPrice(name="cpu-basic", micro_usd_per_minute=167)


def setup(**task: object) -> EpisodeSetup:
    spec = TaskSpec.model_validate({**load_task("t0_artifact").model_dump(), **task})
    return EpisodeSetup(
        episode_id="ep-0000000000000000",
        task=spec,
        base_model=RepoRef(repo_id="org/model", revision="a" * 40),
        prices={"cpu-basic": CPU},
        prices_simulated=True,
        watcher_workflow_id="w",
        caps=Caps(account_workflow_id="a"),
    )


def carry() -> EpisodeCarry:
    return EpisodeCarry(started_at=T0, ledger=Ledger(budget_micro_usd=1_000_000))


def agent(state: JobState = JobState.running, job_id: str = "job-1") -> JobRecord:
    return JobRecord(
        job_id=job_id,
        workflow_id=f"w/{job_id}",
        role=JobRole.agent,
        flavor="cpu-basic",
        timeout_minutes=5,
        state=state,
    )


def backend(state: JobState, running_s: float = 0.0) -> BackendJob:
    return BackendJob(
        ref="r", key="k", state=state, created_at=T0, started_at=T0, running_s=running_s
    )


def test_a_flavor_outside_the_task_or_without_a_price_is_refused() -> None:
    with pytest.raises(ToolError) as info:
        check_flavor_and_timeout(setup(), "cpu-upgrade", 5)  # allowed, but no price is known
    assert info.value.type is ErrorType.flavor_not_allowed and "cpu-basic" in info.value.message
    with pytest.raises(ToolError) as info:
        check_flavor_and_timeout(setup(), "cpu-basic", 31)
    assert info.value.type is ErrorType.timeout_not_allowed
    check_flavor_and_timeout(setup(), "cpu-basic", 30)


def test_live_agent_jobs_are_limited_and_finished_ones_do_not_count() -> None:
    state = carry()
    state.jobs = {"job-1": agent(), "job-2": agent(job_id="job-2")}
    with pytest.raises(ToolError) as info:
        check_concurrency(setup(), state)
    assert info.value.type is ErrorType.limit_reached
    state.jobs["job-2"].final = True
    check_concurrency(setup(), state)


def test_dev_evaluations_are_limited_per_task() -> None:
    state = carry()
    state.dev_evaluations = 5
    with pytest.raises(ToolError) as info:
        check_dev_evaluation(setup(), state)
    assert info.value.type is ErrorType.limit_reached
    check_dev_evaluation(setup(max_dev_evaluations=6), state)


def test_only_the_episodes_own_agent_jobs_are_found_and_only_succeeded_ones_evaluated() -> None:
    state = carry()
    state.jobs = {"job-1": agent(JobState.running)}
    state.jobs["eval-1"] = agent(job_id="eval-1").model_copy(update={"role": JobRole.dev})
    assert agent_job(state, "job-1").job_id == "job-1"
    for missing in ("job-2", "eval-1"):
        with pytest.raises(ToolError) as info:
            agent_job(state, missing)
        assert info.value.type is ErrorType.unknown_job
    with pytest.raises(ToolError) as info:
        succeeded_agent_job(state, "job-1")
    assert info.value.type is ErrorType.not_ready and info.value.details["state"] == "running"


def test_a_report_short_of_the_end_never_moves_a_job_back() -> None:
    state = carry()
    record = agent(JobState.cancelling)
    state.jobs[record.job_id] = record
    take_snapshot(
        state,
        record,
        JobSnapshot(job_id="job-1", state=JobState.running, backend=backend(JobState.running)),
    )
    assert record.state is JobState.cancelling and record.version == 0
    assert record.submitted and record.backend_ref == "r"


def test_the_final_report_settles_the_job_at_its_billed_minutes() -> None:
    state = carry()
    record = agent(JobState.running)
    state.ledger.reserve("job-1", "job", CPU, 5)
    state.jobs[record.job_id] = record
    take_snapshot(
        state,
        record,
        JobSnapshot(
            job_id="job-1",
            state=JobState.succeeded,
            backend=backend(JobState.succeeded, running_s=61),
            final=True,
        ),
    )
    assert record.final and record.settlement is not None
    assert record.settlement.cost_micro_usd == 2 * 167  # 61 s bills two minutes
    assert state.ledger.reserved_micro_usd == 0 and state.ledger.settled_jobs == 1


def test_a_vanished_job_settles_at_its_whole_reservation_and_is_flagged() -> None:
    state = carry()
    record = agent(JobState.running)
    state.ledger.reserve("job-1", "job", CPU, 5)
    state.jobs[record.job_id] = record
    vanished = backend(JobState.cancelled, running_s=42).model_copy(update={"vanished": True})
    take_snapshot(
        state,
        record,
        JobSnapshot(job_id="job-1", state=JobState.cancelled, backend=vanished, final=True),
    )
    assert record.settlement is not None and record.settlement.worst_case
    assert record.settlement.cost_micro_usd == 5 * 167  # never the 42 s it was last seen at
    assert state.ledger.settled_micro_usd == 5 * 167 and state.ledger.reserved_micro_usd == 0
    view = job_view("ep-0000000000000000", record, T0)
    assert view.settled_at_worst_case is True and view.cost_usd == 5 * 167 / 1e6
    ordinary = job_view("ep-0000000000000000", agent(JobState.queued, job_id="job-2"), T0)
    assert ordinary.settled_at_worst_case is None


def test_a_failed_start_releases_its_reservation_and_charges_nothing() -> None:
    state = carry()
    record = agent(JobState.queued).model_copy(update={"reserved_micro_usd": 835})
    state.ledger.reserve("job-1", "job", CPU, 5)
    state.jobs[record.job_id] = record
    error = ToolError(ErrorType.hf_error, "the Hub refused").envelope()
    take_snapshot(
        state, record, JobSnapshot(job_id="job-1", state=JobState.failed, error=error, final=True)
    )
    assert record.final and record.error == error and record.settlement is None
    assert state.ledger.reserved_micro_usd == 0 and state.ledger.settled_micro_usd == 0


def test_a_grader_is_never_charged() -> None:
    state = carry()
    record = agent(JobState.running).model_copy(update={"role": JobRole.grader})
    state.jobs[record.job_id] = record
    score = ScoreResult(score=0.5, valid=True)
    take_snapshot(
        state,
        record,
        JobSnapshot(
            job_id="job-1",
            state=JobState.succeeded,
            backend=backend(JobState.succeeded, running_s=600),
            score=score,
            final=True,
        ),
    )
    assert record.final and record.score == score and record.settlement is None
    assert state.ledger.settled_micro_usd == 0


def test_a_running_jobs_view_counts_its_time_up_to_now() -> None:
    record = agent(JobState.running).model_copy(
        update={"started_at": T0, "reserved_micro_usd": 835}
    )
    view = job_view("ep-0", record, T0 + timedelta(seconds=90))
    assert view.running_s == 90.0 and view.reserved_usd == 835 / 1e6
    assert view.artifact == "openenv-artifact://ep-0/job-1/outputs"
    assert view.started_at == "2026-12-01T00:00:00Z"


def test_step_metadata_reports_steps_time_spend_and_the_end() -> None:
    state = carry()
    state.steps_used = 3
    meta = step_metadata(setup(), state, T0 + timedelta(seconds=200))
    assert (meta.steps_used, meta.steps_left, meta.time_left_s) == (3, 97, 7000.0)
    assert meta.prices_simulated and meta.service_spend.final and meta.episode_end is None
    state.end = EpisodeEnd(reason=EndReason.max_steps, reward=0.0)
    ended = step_metadata(setup(), state, T0)
    assert ended.time_left_s == 0.0 and ended.episode_end == state.end
    # Only the step path carries the spend and the end.
    assert "service_spend" in ended.view("step") and "episode_end" in ended.view("step")
    assert set(ended.view("mcp")) == {
        "episode_id",
        "steps_used",
        "steps_left",
        "time_left_s",
        "prices_simulated",
    }
