"""The one interface every jobs backend implements (Hugging Face, local, fake).

Activities call it; nothing else does. `now` arguments carry the workflow's time: real backends
ignore it, the fake derives its jobs' progress from it so that time skipping works (DESIGN §9).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, Field

from posttrain_env.models import BoundedText, FlavorPrice, JobState


class JobRole(enum.StrEnum):
    agent = "agent"
    dev = "dev"
    grader = "grader"


class RepoRef(BaseModel):
    repo_id: str
    revision: str


class JobSpec(BaseModel):
    """What a job is, as the episode decides it (no secrets: this crosses workflow history)."""

    role: JobRole
    episode_id: str
    task_id: str
    job_id: str
    flavor: str
    timeout_s: int
    script: str = ""  # agent jobs: the agent's script (evaluations get the task's evaluator)
    dependencies: list[str] = Field(default_factory=list)
    datasets: list[RepoRef] = Field(default_factory=list)
    base_model: RepoRef
    artifact_ref: str | None = None  # evaluations: backend ref of the job whose outputs are /model
    # The task's cap on a job's outputs; None: the backend's default (DESIGN §9).
    artifact_cap_bytes: int | None = None


class JobRequest(JobSpec):
    """Everything a backend needs to start one job. Built inside an activity: it may hold the
    job's nonce and, for graders, the hidden-split seed, so it never enters workflow history."""

    key: str  # idempotency key: the job's workflow id
    env: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(default_factory=dict)
    now: datetime


class BackendJob(BaseModel):
    """A backend's view of one job."""

    ref: str  # the backend's own job id; internal, never shown to the agent
    key: str
    state: JobState  # never `cancelling`: that is ours, not the backend's
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    running_s: float = 0.0
    message: BoundedText = ""  # may quote the job's own output: cut where it enters


class TransientBackendError(Exception):
    """A failure that a retry may fix (HTTP 429, 5xx, a dropped connection)."""


class JobsBackend(Protocol):
    name: str
    prices_simulated: bool
    # True: the task's generated local model (`[base_model] local`) replaces its Hub repo.
    uses_local_models: bool

    async def submit(self, request: JobRequest) -> BackendJob:
        """Start a job. Callers look for an existing job with the key first (find_by_key)."""
        ...

    async def find_by_key(self, key: str, now: datetime) -> BackendJob | None: ...

    async def observe(self, refs: Sequence[str], now: datetime) -> dict[str, BackendJob]:
        """The current state of many jobs in one call (unknown refs are left out)."""
        ...

    async def cancel(self, ref: str, now: datetime) -> BackendJob:
        """Ask for cancellation; returns the job as the backend sees it right after."""
        ...

    async def logs(self, ref: str, tail: int, now: datetime) -> list[str]: ...

    async def hardware(self) -> list[FlavorPrice]: ...

    async def resolve_model(self, repo_id: str, revision: str) -> str:
        """The commit a branch or tag points at (looked up without the broker's token)."""
        ...

    async def resolve_dataset(self, repo_id: str, denylist: Sequence[str]) -> str:
        """The dataset's current commit, or ToolError(dataset_not_allowed) with the reason."""
        ...
