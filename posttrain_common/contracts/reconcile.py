"""What the reconciler finds and does (pure): runs of our workflows closed from outside.

A workflow terminated through Temporal (the UI, `temporal workflow terminate`) or timed out runs
no code of its own: whatever it held (an episode's reservations, a job on the backend, a
campaign's rollouts, the jobs the watcher followed, a session's episode) would be stranded. The
reconciler, run with the orphan reaper on its Schedule, finds such runs and has each wound down:
an episode, a job, a rollout or a campaign is started again under its id to end as an operator's
cancel; the watcher's jobs and the account's live episodes are handed to the one running now; a
session's current episode is ended.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

# Parents first: an episode started again before its jobs hears their final reports.
WIND_DOWN_ORDER = (
    "CampaignWorkflow",
    "RolloutWorkflow",
    "SessionWorkflow",
    "EpisodeWorkflow",
    "JobWorkflow",
    "WatcherWorkflow",
    "AccountWorkflow",
)
# Started again on demand by anyone (the watcher and the account: one per task queue; a session:
# by its client's next reset), so a closed run's state is handed on rather than started again,
# and these are looked at while recently closed, not by their latest run.
SINGLETONS = frozenset({"WatcherWorkflow", "AccountWorkflow", "SessionWorkflow"})
# At most this many closed runs are looked at per pass (the rest wait for the next one).
MAX_STRANDED_PER_PASS = 500


class FindStranded(BaseModel):
    lookback_s: float  # closed at most this long ago
    singleton_lookback_s: float  # the watcher's and the account's: about two reaper periods
    limit: int = Field(default=MAX_STRANDED_PER_PASS, ge=1, le=10_000)


class StrandedRun(BaseModel):
    workflow_id: str
    run_id: str
    workflow_type: str
    status: str  # TERMINATED | TIMED_OUT
    closed_at: datetime | None = None


class StrandedSearch(BaseModel):
    checked: int = 0  # closed runs looked at
    runs: list[StrandedRun] = Field(default_factory=list)  # to wind down, parents first
