"""A Hugging Face `JobInfo` as a `BackendJob`: its state and the running time it is billed for.

SCHEDULING → queued, RUNNING → running, COMPLETED → succeeded, ERROR → failed (timed_out when
the Hub says so or the job ran up to the timeout we gave it), CANCELED and DELETED → cancelled;
a stage this code does not know is taken as still queued (looked at again, never settled).

**How a job is billed (the rule settlement follows).** The Hub prices a job per started minute
of its flavor (`list_jobs_hardware`: `unit_cost_micro_usd` per `unit_label`). The seconds we
settle are the Hub's own `durations.running_secs`, which it recomputes on every request while a
job runs; scheduling (`scheduling_secs`) is not billed. Only when the Hub gives no running time
is it computed from `started_at` and `finished_at`. The episode charges `price × ceil(seconds /
60)` (`workflows/episode/ledger.py`), even above the reservation (a stop lag past the timeout).
Whether a
phase between scheduling and running is billed, and whether a job's timeout clock includes its
scheduling, are not documented by the Hub: `scripts/hf_smoke.py --check-billing` prints the
Hub's durations beside our settlement for whoever first runs it with a token.

A job the Hub no longer knows (404 on its own URL, repeatedly: `activities/backends/hf/missing.py`)
is
reported `vanished`: the episode settles it at its worst case, the whole reservation, never at
0 s, since it may have run, and may still run, up to its timeout.
"""

from __future__ import annotations

from datetime import datetime

from huggingface_hub import JobInfo, JobStage

from activities.backends.hf.labels import timeout_of
from posttrain_common.contracts.jobs import BackendJob
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
# A job stopped by its timeout reports a running (or, if the Hub's timeout clock includes
# scheduling, a total) time within a few seconds of it.
TIMEOUT_SLACK_S = 5


def stage_of(info: JobInfo) -> str:
    stage = info.status.stage
    return stage.value if isinstance(stage, JobStage) else str(stage).upper()


def running_seconds(info: JobInfo, now: datetime) -> float:
    """Seconds the job has run (so far, if it still runs): what it is billed for."""
    durations = info.durations
    if durations is not None and durations.running_secs is not None:
        return float(max(0, durations.running_secs))
    if info.started_at is None:
        return 0.0
    end = info.finished_at or now
    return max(0.0, (end - info.started_at).total_seconds())


def _reached_timeout(info: JobInfo, running_s: float) -> bool:
    timeout_s = timeout_of(info)
    if timeout_s is None:
        return False
    total = info.durations.total_secs if info.durations is not None else None
    longest = max(running_s, float(total or 0))
    return longest >= timeout_s - TIMEOUT_SLACK_S


def state_of(info: JobInfo, running_s: float) -> JobState:
    state = STAGES.get(stage_of(info), JobState.queued)
    if state is JobState.failed:
        message = (info.status.message or "").lower()
        if "timeout" in message or "timed out" in message or _reached_timeout(info, running_s):
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


def vanished_job(*, ref: str, key: str, now: datetime, missing_s: float, looks: int) -> BackendJob:
    """A job the Hub has answered 404 for, `looks` times over `missing_s` seconds."""
    return BackendJob(
        ref=ref,
        key=key,
        state=JobState.cancelled,
        created_at=now,
        finished_at=now,
        vanished=True,
        message=(
            f"Hugging Face no longer knows this job (404 on {looks} looks over "
            f"{missing_s:.0f} s); it is settled at its worst case, the whole reservation, "
            "since it may have run up to its timeout"
        ),
    )
