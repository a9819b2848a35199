"""An episode's state: what continue-as-new hands to the next run (pure)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from posttrain_common.contracts.contamination import ContaminationReport
from posttrain_common.contracts.episode_calls import ToolResult
from posttrain_common.contracts.jobs import JobRole, OutputsRefusal, ScoreResult
from posttrain_common.contracts.known_runs import KnownRun
from posttrain_common.contracts.operator import OperatorAction
from posttrain_env.models import BoundedText, EpisodeEnd, JobState
from workflows.episode.ledger import Ledger, Settlement


class JobRecord(BaseModel):
    """One job of the episode (an agent's, or a dev or grader evaluation)."""

    job_id: str
    workflow_id: str
    role: JobRole
    flavor: str
    timeout_minutes: int
    reserved_micro_usd: int = 0
    state: JobState = JobState.queued
    submitted: bool = False
    backend_ref: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    running_s: float = 0.0
    message: BoundedText = ""
    error: dict[str, Any] | None = None
    settlement: Settlement | None = None
    score: ScoreResult | None = None
    final: bool = False  # terminal, settled, nothing more to come
    version: int = 0  # bumps at every change, for jobs_wait
    evaluated_job_id: str | None = None
    base_model_revision: str | None = None  # the commit the job's /base_model holds
    # When the episode first saw this job cancelling (workflow time): an operator looks for
    # cancellations pending too long (`PtCancelPendingSince`).
    cancel_requested_at: datetime | None = None
    # Its outcome was replayed from a recording (the backend said so: `BackendJob.replayed`).
    replayed: bool = False
    # Its own workflow was cancelled or terminated through Temporal, and the episode's
    # `operator_actions` say so (once: `workflows/episode/operator.py`, `outside_job_action`).
    outside_noted: bool = False
    # The launcher's sandbox: TCP on loopback, or AF_UNIX only and why (`BackendJob`).
    loopback_tcp: bool | None = None
    loopback_reason: str = ""
    # Its whole run, known when it started (the replay backend): it has no workflow of its own,
    # and its state follows from this (`workflows/episode/known.py`). Dropped once it is final
    # (the record then holds all it ended with), so the carry holds only live jobs' runs.
    known: KnownRun | None = None
    # An ended agent job whose outputs were refused: why (it keeps nothing, and can be neither
    # evaluated nor submitted). What a job's artifact keeps is in its settlement.
    outputs_refused: OutputsRefusal | None = Field(default=None, exclude_if=lambda v: v is None)

    @property
    def live(self) -> bool:
        return not self.final


class EpisodeCarry(BaseModel):
    """Everything continue-as-new hands to the next run."""

    started_at: datetime
    steps_used: int = 0
    ledger: Ledger
    jobs: dict[str, JobRecord] = Field(default_factory=dict)
    job_counter: int = 0
    dev_evaluations: int = 0
    end: EpisodeEnd | None = None
    submitting: bool = False
    # Results of recent requests, oldest first, within RECENT_RESULTS_BYTES
    # (workflows/episode/recent.py);
    # Temporal deduplicates update ids within a run only, so these answer retries across runs.
    recent: dict[str, ToolResult] = Field(default_factory=dict)
    # Each kept answer's size in bytes as encoded. (Runs before it counted characters, in
    # `recent_sizes`: that field is ignored when an old carry decodes, and sizes recounted.)
    recent_bytes: dict[str, int] = Field(default_factory=dict)
    # Short hashes of requests whose result was dropped from `recent`: never run again.
    answered: list[str] = Field(default_factory=list)
    # The contamination check's report, kept for the audit record (its evidence may quote test
    # items: it is never part of an answer, a query or the end).
    contamination: ContaminationReport | None = None
    # What operators did (bounded: MAX_OPERATOR_ACTIONS), for the audit record.
    operator_actions: list[OperatorAction] = Field(default_factory=list)
    # Calls the replay backend answered `not_recorded` (its jobs, or evaluations, had no
    # recording): `episode_end.replay_misses`.
    replay_misses: int = 0
    # Backend refs of stray jobs the reaper cancelled and this episode settled (`late_job_settled`):
    # each is charged once, however often it is reported.
    late_refs: list[str] = Field(default_factory=list)
