"""Jobs whose whole run is known when they start (pure; crosses workflow history).

A backend that can tell at a job's start how the job will go (the replay backend: a recorded
run, its times scaled) answers `KnownRun`: the job's timeline, from which its view at any
moment of workflow time follows. Such a job needs no workflow of its own and no watching: the
episode keeps the run in its job table and reads the job's state from it (DESIGN §12, "a job
known at once needs no workflow of its own"). The replay backend's own views come from the same
`KnownRun.view`, so the two never disagree.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel

from posttrain_common.contracts.jobs import (
    BackendJob,
    OutputsRefusal,
    ScoreResult,
    with_outputs_judged,
)
from posttrain_env.models import BoundedText, JobState


class KnownRun(BaseModel):
    """One job's run as its backend knows it at the start."""

    ref: str
    key: str
    created_at: datetime
    queue_s: float  # workflow seconds queued (the recorded queueing, scaled)
    ran_s: float  # billed seconds of running at its end (recorded; cut by its timeout)
    outcome: JobState  # how it ends unless cancelled first
    # Workflow seconds per billed second (the replay's time scale): it runs for ran_s * scale.
    # 0: it ends the moment it starts.
    time_scale: float
    message: BoundedText = ""
    replayed: bool = True
    # An evaluation that ends `succeeded`: the score its log gives (read at the start, as the
    # job's workflow would read it at the end). None for an agent job, or no score line read.
    score: ScoreResult | None = None
    # An agent job whose storage counts: what its artifact keeps when it ends as known (the
    # recorded artifact's size), or why its outputs are refused (judged by the caps it started
    # with, as the backend that ran it judged them). None for both: not counted.
    stored_bytes: int | None = None
    outputs_refused: OutputsRefusal | None = None

    @property
    def started_at(self) -> datetime:
        return self.created_at + timedelta(seconds=self.queue_s * self.time_scale)

    @property
    def ends_at(self) -> datetime:
        return self.started_at + timedelta(seconds=self.ran_s * self.time_scale)

    def view(
        self, now: datetime, cancel_at: datetime | None = None, *, hold_cancel: bool = False
    ) -> BackendJob:
        """The job at workflow time `now`, cancelled at `cancel_at` if that is before its end
        (`hold_cancel`: a cancellation asked for is never confirmed, a test control)."""
        start, end, final = self.started_at, self.ends_at, self.outcome
        if cancel_at is not None and cancel_at < end:
            end = datetime.max.replace(tzinfo=end.tzinfo) if hold_cancel else cancel_at
            final = JobState.cancelled
            if cancel_at <= start:  # cancelled while queued: it never ran
                start = end
        base = BackendJob(
            ref=self.ref,
            key=self.key,
            state=JobState.queued,
            created_at=self.created_at,
            replayed=self.replayed,
        )
        if now < min(start, end):
            return base
        if now < end:
            running = (now - start).total_seconds() / self.time_scale if self.time_scale else 0
            return base.model_copy(
                update={
                    "state": JobState.running,
                    "started_at": start,
                    "running_s": min(self.ran_s, running),
                }
            )
        ran = max(0.0, (end - start).total_seconds())
        if final is self.outcome:
            running_s, message = self.ran_s, self.message or f"replayed job {final.value}"
        else:  # cut by a cancellation: its share of the run
            running_s = ran / self.time_scale if self.time_scale else 0.0
            message = f"replayed job {final.value}"
        ended = base.model_copy(
            update={
                "state": final,
                "started_at": start if ran > 0 else None,
                "finished_at": end,
                "running_s": running_s,
                "message": message,
            }
        )
        if self.stored_bytes is None and self.outputs_refused is None:
            return ended
        if final is not self.outcome and ended.started_at is None:
            return ended  # cancelled before it ran: it wrote nothing
        return with_outputs_judged(ended, self.stored_bytes, self.outputs_refused)

    def next_change(self, now: datetime, cancel_at: datetime | None = None) -> datetime | None:
        """When the view next changes after `now` (None: it is final)."""
        if cancel_at is not None and cancel_at < self.ends_at:
            return None if now >= cancel_at else cancel_at
        for moment in (self.started_at, self.ends_at):
            if now < moment:
                return moment
        return None

    def score_at_end(self, state: JobState) -> ScoreResult | None:
        """The evaluation's score when it ended `state` (only a succeeded one has one)."""
        return self.score if state is JobState.succeeded else None


class KnownStart(BaseModel):
    """What `JobsApi.start_known_job` answers: the job's known run, or None when its backend
    does not know it (the job then starts as any job does, with a workflow of its own). A start
    refused, or an evaluation's artifact rejected, fails the activity as `submit_job` does."""

    run: KnownRun | None = None
