"""The episode's rules and views, pure: tested without Temporal, as the ledger is.

Whether a job may start, which job an id names, how a job looks to the agent, what a backend's
report changes, how much time and how many steps are left, and the episode's answers and status
as they are built from its state. No clock here: `now` is passed in (the workflow's time).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from posttrain_common.contracts.episode_calls import EpisodeStatus, JobsPage, ToolResult
from posttrain_common.contracts.episodes import EpisodeSetup
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import MAX_JOBS_PER_EPISODE
from posttrain_env.models import JobState, JobView, ServiceSpend, StepMetadata, usd
from workflows.episode.paging import page_of
from workflows.episode.state import EpisodeCarry, JobRecord
from workflows.job.workflow import JobSnapshot

# How far along a job is; reports arrive by two routes (the watcher, the job's workflow), so a
# report short of the end never moves a job back.
_RANKS = {JobState.queued: 0, JobState.running: 1, JobState.cancelling: 2}


def rank(state: JobState) -> int:
    return _RANKS.get(state, 3)


# -- may it start ----------------------------------------------------------------------------------


def allowed_flavors(setup: EpisodeSetup) -> list[str]:
    return [f for f in setup.task.flavors if f in setup.prices]


def check_flavor_and_timeout(setup: EpisodeSetup, flavor: str, minutes: int) -> None:
    """Raise ToolError unless an agent job may use `flavor` for `minutes`."""
    task = setup.task
    allowed = allowed_flavors(setup)
    if flavor not in allowed:
        raise ToolError(
            ErrorType.flavor_not_allowed,
            f"flavor {flavor!r} is not allowed; use one of {', '.join(allowed)}",
            flavor=flavor,
        )
    if minutes > task.max_timeout_minutes:
        raise ToolError(
            ErrorType.timeout_not_allowed,
            f"timeout_minutes {minutes} is above this task's maximum of {task.max_timeout_minutes}",
        )


def check_concurrency(setup: EpisodeSetup, carry: EpisodeCarry) -> None:
    """Raise ToolError unless one more job may be live: agent jobs and dev evaluations count
    alike toward the task's `max_concurrent_jobs` (graders do not: they are the episode's)."""
    task = setup.task
    live = [r for r in carry.jobs.values() if r.role is not JobRole.grader and r.live]
    if len(live) >= task.max_concurrent_jobs:
        evaluations = sum(r.role is JobRole.dev for r in live)
        raise ToolError(
            ErrorType.limit_reached,
            f"{len(live)} jobs are live ({evaluations} of them dev evaluations) and this task "
            f"allows {task.max_concurrent_jobs} at once; wait for or cancel one",
        )


def check_not_grading(carry: EpisodeCarry, tool: str) -> None:
    """While `submit` grades, nothing may start or change work (reads still answer)."""
    if carry.submitting:
        raise ToolError(
            ErrorType.not_allowed,
            f"{tool} is not allowed while the submission is being graded; the episode ends when "
            "grading does (jobs_status, jobs_wait and jobs_logs still answer)",
        )


def check_dev_evaluation(setup: EpisodeSetup, carry: EpisodeCarry) -> None:
    allowed = setup.task.max_dev_evaluations
    if carry.dev_evaluations >= allowed:
        raise ToolError(
            ErrorType.limit_reached,
            f"this task allows {allowed} dev evaluations and all are used",
        )


def check_room_for_a_job(carry: EpisodeCarry) -> None:
    """The job table travels through continue-as-new: it must stay bounded."""
    if len(carry.jobs) >= MAX_JOBS_PER_EPISODE:
        raise ToolError(
            ErrorType.limit_reached,
            f"this episode has started {len(carry.jobs)} jobs and evaluations, the most an "
            "episode may; submit one of the finished jobs",
        )


# -- which job ---------------------------------------------------------------------------------


def agent_job(carry: EpisodeCarry, job_id: str) -> JobRecord:
    """The agent job `job_id` of this episode. Raises ToolError(unknown_job)."""
    record = carry.jobs.get(job_id)
    if record is None or record.role is not JobRole.agent:
        raise ToolError(
            ErrorType.unknown_job,
            f"this episode has no job {job_id!r}; jobs_status lists its jobs",
            job_id=job_id,
        )
    return record


def succeeded_agent_job(carry: EpisodeCarry, job_id: str) -> JobRecord:
    """The agent job `job_id`, which must have succeeded. Raises ToolError: the type of its
    outputs' refusal (`limit_reached`, `not_allowed`) when they were not kept, else
    `not_ready`."""
    record = agent_job(carry, job_id)
    refused = record.outputs_refused
    if refused is not None:
        details = refused.model_dump(mode="json", exclude_none=True, exclude={"type", "message"})
        raise ToolError(
            refused.type,
            f"job {job_id}'s outputs were not kept, so there is nothing to evaluate or submit: "
            f"{refused.message}. Run a job whose outputs fit, and evaluate that one",
            job_id=job_id,
            **details,
        )
    if record.state is not JobState.succeeded:
        raise ToolError(
            ErrorType.not_ready,
            f"job {job_id} is {record.state.value}; only a succeeded job's outputs can be "
            "evaluated",
            job_id=job_id,
            state=record.state.value,
        )
    return record


def all_final(carry: EpisodeCarry) -> bool:
    return all(r.final for r in carry.jobs.values())


def unconfirmed(carry: EpisodeCarry) -> list[str]:
    """Jobs whose cancellation was asked for and is not confirmed yet."""
    return [r.job_id for r in carry.jobs.values() if r.state is JobState.cancelling and not r.final]


# -- what a report changes ---------------------------------------------------------------------


def take_snapshot(carry: EpisodeCarry, record: JobRecord, snap: JobSnapshot) -> None:
    """Apply what a job's workflow (or, short of the end, the watcher) reported; settle the
    ledger when the job is final. Reports come by two routes, so none may move a job back."""
    if snap.backend is not None:
        record.submitted = True
        record.backend_ref = snap.backend.ref
        record.created_at = snap.backend.created_at
    if not snap.final and snap.error is None and rank(snap.state) <= rank(record.state):
        return
    record.version += 1
    record.state = snap.state
    record.message = snap.message
    if snap.backend is not None:
        record.started_at = snap.backend.started_at
        record.finished_at = snap.backend.finished_at
        record.running_s = snap.backend.running_s
        record.replayed = snap.backend.replayed
        if snap.backend.loopback_tcp is not None:
            record.loopback_tcp = snap.backend.loopback_tcp
            record.loopback_reason = snap.backend.loopback_reason
    if snap.error is not None:
        record.error = snap.error
        record.final = True
        if record.reserved_micro_usd:
            carry.ledger.release(record.job_id)
        return
    if snap.final:
        record.score = snap.score
        record.final = True
        stored: int | None = None
        if record.role is JobRole.agent and snap.backend is not None:
            record.outputs_refused = snap.backend.outputs_refused
            stored = snap.backend.stored_bytes
        if record.role is not JobRole.grader:
            if snap.backend is not None and snap.backend.vanished:
                # Its real running time is unknown: never 0, always the worst case.
                record.settlement = carry.ledger.settle_at_reservation(record.job_id)
            else:
                record.settlement = carry.ledger.settle(
                    record.job_id,
                    record.running_s,
                    replayed=record.replayed,
                    stored_bytes=_kept(record, stored),
                )


def _kept(record: JobRecord, measured: int | None) -> int | None:
    """What an ended agent job's artifact keeps, as its settlement counts it: nothing when its
    outputs were refused; what the backend `measured` (a replayed run at time scale 0 never
    started, yet keeps its recorded artifact); nothing when it never started; else None (the
    most it could keep: the backend did not say)."""
    if record.outputs_refused is not None:
        return 0
    if measured is not None:
        return measured
    return 0 if record.started_at is None else None


# -- views -------------------------------------------------------------------------------------


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment else None


def job_view(episode_id: str, record: JobRecord, now: datetime) -> JobView:
    running_s = record.running_s
    if record.state in (JobState.running, JobState.cancelling) and record.started_at:
        running_s = max(running_s, (now - record.started_at).total_seconds())
    settlement = record.settlement
    return JobView(
        job_id=record.job_id,
        state=record.state,
        flavor=record.flavor,
        timeout_minutes=record.timeout_minutes,
        created_at=iso(record.created_at),
        started_at=iso(record.started_at),
        finished_at=iso(record.finished_at),
        running_s=round(running_s, 3),
        reserved_usd=usd(record.reserved_micro_usd if settlement is None else 0),
        cost_usd=usd(settlement.cost_micro_usd) if settlement else 0.0,
        overrun_usd=usd(settlement.overrun_micro_usd)
        if settlement and settlement.overrun_micro_usd
        else None,
        settled_at_worst_case=True if settlement and settlement.worst_case else None,
        replayed=True if record.replayed else None,
        loopback_tcp=record.loopback_tcp,
        loopback_reason=record.loopback_reason or None,
        artifact=f"openenv-artifact://{episode_id}/{record.job_id}/outputs"
        if record.role is JobRole.agent
        else None,
        stored_bytes=stored_bytes(record),
        outputs_error=outputs_error(record),
        message=record.message,
    )


def stored_bytes(record: JobRecord) -> int | None:
    """What an ended agent job's artifact keeps (None: not ended, or not an agent job)."""
    if record.role is not JobRole.agent or record.settlement is None:
        return None
    return record.settlement.stored_bytes


def outputs_error(record: JobRecord) -> dict[str, Any] | None:
    """The typed error for a job whose outputs were refused (None: they were kept)."""
    refused = record.outputs_refused
    if refused is None:
        return None
    return refused.model_dump(mode="json", exclude_none=True)


def deadline(setup: EpisodeSetup, carry: EpisodeCarry) -> datetime:
    return carry.started_at + timedelta(seconds=setup.task.time_limit_s)


def time_left_s(setup: EpisodeSetup, carry: EpisodeCarry, now: datetime) -> float:
    if carry.end is not None:
        return 0.0
    return max(0.0, (deadline(setup, carry) - now).total_seconds())


def steps_left(setup: EpisodeSetup, carry: EpisodeCarry) -> int:
    return max(0, setup.task.max_steps - carry.steps_used)


def service_spend(carry: EpisodeCarry) -> ServiceSpend:
    return carry.ledger.service_spend(final=all_final(carry))


def step_metadata(setup: EpisodeSetup, carry: EpisodeCarry, now: datetime) -> StepMetadata:
    """What every answer of the episode reports (the one place it is built)."""
    return StepMetadata(
        episode_id=setup.episode_id,
        steps_used=carry.steps_used,
        steps_left=steps_left(setup, carry),
        time_left_s=round(time_left_s(setup, carry, now), 3),
        prices_simulated=setup.prices_simulated,
        service_spend=service_spend(carry),
        episode_end=carry.end,
    )


def tool_result(
    setup: EpisodeSetup, carry: EpisodeCarry, tool: str, data: dict[str, Any], now: datetime
) -> ToolResult:
    """An answer of the episode: the tool's data with the step metadata, and once the episode is
    done, its reward."""
    end = carry.end
    return ToolResult(
        tool=tool,
        data=data,
        done=end is not None,
        reward=end.reward if end is not None else None,
        metadata=step_metadata(setup, carry, now),
    )


def episode_status(
    setup: EpisodeSetup, carry: EpisodeCarry, now: datetime, page: JobsPage | None = None
) -> EpisodeStatus:
    """The `status` query: the episode as an operator, the gateway or a rollout reads it, with
    one page of its jobs (`page`; the first by default), so that it stays bounded however many
    jobs there are. `now` is the time of the workflow's last task; readers take `as_of` their
    own clock. Raises ToolError(invalid_argument) for a cursor this episode did not give."""
    page = page or JobsPage()
    records = list(carry.jobs.values())
    listed = page_of(setup.episode_id, "all", records, page.cursor, page.limit)
    views = [job_view(setup.episode_id, record, now) for record in listed.items]
    return EpisodeStatus(
        episode_id=setup.episode_id,
        task_id=setup.task.id,
        steps_used=carry.steps_used,
        steps_left=steps_left(setup, carry),
        time_left_s=time_left_s(setup, carry, now),
        done=carry.end is not None,
        end=carry.end,
        service_spend=service_spend(carry),
        jobs=[view.model_dump(mode="json") for view in views],
        cancelling=unconfirmed(carry),
        metadata=step_metadata(setup, carry, now),
        deadline=None if carry.end is not None else deadline(setup, carry),
        jobs_total=listed.total,
        jobs_next_cursor=listed.next_cursor,
    )


def already_answered(request_id: str) -> ToolError:
    """A request sent again whose answer the episode no longer keeps: it is not run again."""
    return ToolError(
        ErrorType.already_answered,
        f"request {request_id!r} was already answered and its answer is no longer kept; it is "
        "not run again (jobs_status shows the jobs)",
        request_id=request_id,
    )
