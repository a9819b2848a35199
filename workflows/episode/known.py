"""Jobs whose whole run was known at their start (pure): how they stand at a moment.

A backend that knows a job's run when it starts (the replay backend, `KnownRunSource`) answers
`KnownRun`, and the episode keeps it in the job's record: no job workflow, no watcher, no
report by signal (each of those cost the server a workflow and a dozen history events per job:
issue 43). The job's state at any moment follows from the run, as the backend's own view of it
does (`KnownRun.view`); the episode applies it as a report (`take_snapshot`) whenever it looks,
and wakes at the next change while one of these jobs is live (`EpisodeJobs.follow_known`).
"""

from __future__ import annotations

from datetime import datetime

from workflows.episode.rules import rank
from workflows.episode.state import EpisodeCarry, JobRecord
from workflows.job.contract import JobSnapshot


def known_snapshot(record: JobRecord, now: datetime) -> JobSnapshot | None:
    """What the job's run says of it at `now`, as its workflow would have reported it; None
    when that changes nothing (or the job is not a known one, or final already)."""
    run = record.known
    if run is None or record.final:
        return None
    view = run.view(now, record.cancel_requested_at)
    final = view.state.terminal
    if not final and rank(view.state) <= rank(record.state):
        return None  # `cancelling` stays until the cancellation shows, as any job's does
    return JobSnapshot(
        job_id=record.job_id,
        state=view.state,
        backend=view,
        score=run.score_at_end(view.state) if final else None,
        message=view.message,
        final=final,
    )


def live_known(carry: EpisodeCarry) -> list[JobRecord]:
    return [r for r in carry.jobs.values() if r.known is not None and not r.final]


def next_known_change(carry: EpisodeCarry, now: datetime) -> datetime | None:
    """When a live known job next changes state after `now` (None: none will by itself)."""
    moments = [
        moment
        for r in live_known(carry)
        if r.known is not None
        and (moment := r.known.next_change(now, r.cancel_requested_at)) is not None
    ]
    return min(moments, default=None)
