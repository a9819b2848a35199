"""The episode's state that survives continue-as-new, and the views built from it (pure)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from activities.backend import JobRole, RepoRef
from activities.jobs import ScoreResult
from posttrain_env.limits import (
    CONTINUE_AS_NEW_HISTORY_BYTES,
    MAX_REQUEST_ID_CHARS,
    MAX_TOOL_NAME_CHARS,
)
from posttrain_env.models import (
    BoundedText,
    EpisodeEnd,
    FlavorPrice,
    JobState,
    JobView,
    TaskSpec,
    usd,
)
from workflows.ledger import Ledger, Settlement

ToolPath = Literal["step", "mcp", "openenv_mcp"]


class Oversized(BaseModel):
    """Stands in for arguments the edge refused to send for their size (DESIGN §10)."""

    field: str = Field(max_length=MAX_TOOL_NAME_CHARS)  # the largest argument, or "tool_name"
    bytes: int  # its size as JSON
    total_bytes: int  # all the arguments' size as JSON


class ToolCall(BaseModel):
    """One tool call, from any path. The update id is `<episode_id>:<request_id>`.

    Built by the edge (`mcp_gateway.episode_calls.tool_call`), which measures the arguments:
    over MAX_ARGUMENTS_BYTES they are replaced by `oversized` and the episode answers a typed
    error, so no update ever comes near Temporal's payload limit."""

    request_id: str = Field(min_length=1, max_length=MAX_REQUEST_ID_CHARS)
    tool: str = Field(max_length=MAX_TOOL_NAME_CHARS)
    arguments: dict[str, Any] = Field(default_factory=dict)
    path: ToolPath = "step"
    oversized: Oversized | None = None


class ToolResult(BaseModel):
    tool: str
    data: dict[str, Any]  # the tool's answer, or {"error": {...}}
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Caps(BaseModel):
    """Server-wide limits, enforced through the account workflow when set."""

    account_workflow_id: str
    spend_cap_micro_usd: int | None = None
    max_live_episodes: int | None = None

    @property
    def enabled(self) -> bool:
        """A spend cap is set: each reservation is checked against it."""
        return self.spend_cap_micro_usd is not None

    @property
    def tracked(self) -> bool:
        """Any cap is set: the episode is admitted, reported and retired in the account."""
        return self.enabled or self.max_live_episodes is not None


class EpisodeSetup(BaseModel):
    """What an episode is started with (prepared by an activity at reset)."""

    episode_id: str
    task: TaskSpec
    base_model: RepoRef  # revision resolved to a commit, once per episode
    prices: dict[str, FlavorPrice]
    prices_simulated: bool = False
    cancel_confirm_s: int = 120
    watcher_workflow_id: str
    caps: Caps
    session_workflow_id: str | None = None
    # None: continue as new when Temporal suggests it; else past this many history events.
    continue_as_new_events: int | None = None
    # Continue as new past this many bytes of history, whatever the event count.
    continue_as_new_bytes: int = CONTINUE_AS_NEW_HISTORY_BYTES


class JobRecord(BaseModel):
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
    # Results of recent requests, oldest first, within RECENT_RESULTS_BYTES (workflows/recent.py);
    # Temporal deduplicates update ids within a run only, so these answer retries across runs.
    recent: dict[str, ToolResult] = Field(default_factory=dict)
    recent_sizes: dict[str, int] = Field(default_factory=dict)
    # Short hashes of requests whose result was dropped from `recent`: never run again.
    answered: list[str] = Field(default_factory=list)


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
        artifact=f"openenv-artifact://{episode_id}/{record.job_id}/outputs"
        if record.role is JobRole.agent
        else None,
        message=record.message,
    )
