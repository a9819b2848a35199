"""What the job watcher takes: a registration and its carried input (out of the workflow's module,
see workflows/job/contract.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from posttrain_common.contracts.watching import WATCHER_HISTORY_BUDGET_BYTES


class WatchRequest(BaseModel):
    """Registers a job with the namespace's watcher (sent by signal-with-start)."""

    ref: str
    workflow_id: str  # the job's workflow: told when the job ends
    state: str
    job_id: str = ""
    episode_workflow_id: str = ""  # told directly of changes short of the end


class WatcherInput(BaseModel):
    interval_s: float = 30.0
    # Set: after a change (or a new job, or a pending jobs_wait) look again this soon, doubling
    # the gap on each quiet look up to interval_s, so short jobs are seen to end at once.
    # None: always interval_s (Hugging Face: one Hub listing per look).
    min_interval_s: float | None = None
    idle_exit_s: float = 60.0
    watched: dict[str, WatchRequest] = Field(default_factory=dict)
    # The latest jobs whose end was reported (`ended_key`), oldest first, at most
    # MAX_ENDED_REMEMBERED.
    ended: list[str] = Field(default_factory=list)
    # Continue as new past this much history (a test lowers it).
    history_budget_bytes: int = WATCHER_HISTORY_BUDGET_BYTES
