"""A Hugging Face `JobInfo` as a `BackendJob`: its state and the running time it is billed for.

SCHEDULING → queued, RUNNING → running, COMPLETED → succeeded, ERROR → failed (timed_out when
the job ran up to the timeout we gave it), CANCELED and DELETED → cancelled. The running time is
the Hub's own `durations.running_secs` (recomputed on every request while a job runs); only
when the Hub gives none is it computed from `started_at` and `finished_at`.
"""

from __future__ import annotations

from datetime import datetime

from huggingface_hub import JobInfo, JobStage

from activities.hf.labels import timeout_of
from posttrain_env.contracts.jobs import BackendJob
from posttrain_env.models import JobState

STAGES: dict[str, JobState] = {
    JobStage.SCHEDULING.value: JobState.queued,
    JobStage.RUNNING.value: JobState.running,
    JobStage.COMPLETED.value: JobState.succeeded,
    JobStage.ERROR.value: JobState.failed,
    JobStage.CANCELED.value: JobState.cancelled,
    JobStage.DELETED.value: JobState.cancelled,
}
LIVE_STAGES = [JobStage.SCHEDULING.value, JobStage.RUNNING.value]
# A job stopped by its timeout reports a running time within a few seconds of it.
TIMEOUT_SLACK_S = 5


def stage_of(info: JobInfo) -> str:
    stage = info.status.stage
    return stage.value if isinstance(stage, JobStage) else str(stage).upper()


def running_seconds(info: JobInfo, now: datetime) -> float:
    """Seconds the job has run (so far, if it still runs)."""
    durations = info.durations
    if durations is not None and durations.running_secs is not None:
        return float(max(0, durations.running_secs))
    if info.started_at is None:
        return 0.0
    end = info.finished_at or now
    return max(0.0, (end - info.started_at).total_seconds())


def state_of(info: JobInfo, running_s: float) -> JobState:
    stage = stage_of(info)
    # An unknown stage is treated as still queued: the watcher looks again rather than settle.
    state = STAGES.get(stage, JobState.queued)
    if state is JobState.failed:
        timeout_s = timeout_of(info)
        message = (info.status.message or "").lower()
        if "timeout" in message or "timed out" in message:
            return JobState.timed_out
        if timeout_s is not None and running_s >= timeout_s - TIMEOUT_SLACK_S:
            return JobState.timed_out
    return state


def backend_job(info: JobInfo, *, ref: str, key: str, now: datetime) -> BackendJob:
    running_s = running_seconds(info, now)
    state = state_of(info, running_s)
    stage = stage_of(info)
    message = info.status.message or ""
    if state.terminal and not message:
        message = f"Hugging Face job {stage.lower()}"
    if stage == JobStage.DELETED.value:
        message = message or "the job was deleted on Hugging Face"
    return BackendJob(
        ref=ref,
        key=key,
        state=state,
        created_at=info.created_at or now,
        started_at=info.started_at,
        finished_at=info.finished_at if state.terminal else None,
        running_s=running_s,
        message=message,
    )


def vanished_job(*, ref: str, key: str, now: datetime) -> BackendJob:
    """A job the Hub no longer knows (404): it will not run or bill any more."""
    return BackendJob(
        ref=ref,
        key=key,
        state=JobState.cancelled,
        created_at=now,
        finished_at=now,
        message="the job no longer exists on Hugging Face",
    )
