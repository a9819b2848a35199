"""The one interface every jobs backend implements (Hugging Face, local, fake), and what a
backend declares about itself.

Activities call `JobsBackend`; nothing else does. `now` arguments carry the workflow's time: real
backends ignore it, the fake derives its jobs' progress from it so that time skipping works
(DESIGN §9). Each backend's folder declares a `BackendInfo` in its `info.py` (its name, its
`Capabilities` and how to build it; `activities/backends/registry.py` lists them): the server
reads capabilities, never a backend's name. What every backend must do is tests/backends/ (the
conformance suite).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

from pydantic import BaseModel, ConfigDict, Field

from activities.backends.storage import JobStorage
from posttrain_common.contracts.episodes import JobLimits
from posttrain_common.contracts.jobs import BackendJob, JobSpec, KeepOutputs
from posttrain_common.contracts.known_runs import KnownRun
from posttrain_env.models import FlavorPrice

if TYPE_CHECKING:
    from temporalio.worker import Interceptor

    from posttrain_common.keys import ServerKey
    from posttrain_common.settings import Settings


class JobRequest(JobSpec):
    """Everything a backend needs to start one job. Built inside an activity: it may hold the
    job's nonce and, for graders, the hidden-split seed, so it never enters workflow history."""

    key: str  # idempotency key: the job's workflow id
    env: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(default_factory=dict)
    now: datetime


class TransientBackendError(Exception):
    """A failure that a retry may fix (HTTP 429, 5xx, a dropped connection)."""


class ArtifactRejected(Exception):
    """An evaluation refused before it starts because of the evaluated job's outputs (over the
    task's cap, or refused by the backend's own checks): the artifact's fault, so the evaluation
    scores 0 with `artifact_valid: false`, never `score_failed` (DESIGN §10)."""


@dataclass(frozen=True)
class DatasetBytes:
    """The first bytes of a dataset at one revision, as a job would see it mounted: its files in
    path order, read until `max_bytes` in all (the last file read may be cut)."""

    files: list[tuple[str, bytes]] = field(default_factory=list)  # (path in the repo, bytes)
    cut: bool = False  # True when files or bytes were left unread at the cap


class JobsBackend(Protocol):
    name: str
    prices_simulated: bool
    # True: the task's generated local model (`[base_model] local`) replaces its Hub repo.
    uses_local_models: bool
    # The Python version agent jobs run ("3.12"): their scripts' syntax is checked for it, by
    # the episode and by the launcher's builder, which every backend calls for an agent job.
    job_python_version: str
    # What one agent job's artifact, and all of one episode's artifacts together, may hold
    # where the task sets no cap (posttrain_env/limits.py, "storage").
    default_artifact_cap_bytes: int
    default_storage_cap_bytes: int

    async def submit(self, request: JobRequest) -> BackendJob:
        """Start a job. Callers look for an existing job with the key first (find_by_key).
        An agent job's launcher is built first (`build_launcher(..., python=job_python_version)`):
        ToolError(invalid_script / invalid_dependency) for what it refuses, and no job starts."""
        ...

    async def find_by_key(self, key: str, now: datetime) -> BackendJob | None: ...

    async def observe(self, refs: Sequence[str], now: datetime) -> dict[str, BackendJob]:
        """The current state of many jobs in one call (unknown refs are left out). The `key`
        of a job seen here is the key as the backend records it: Hugging Face records only a
        hash of it (its job label); callers know their jobs by ref."""
        ...

    async def cancel(self, ref: str, now: datetime) -> BackendJob:
        """Ask for cancellation; returns the job as the backend sees it right after (a job
        that already ended: its end). A cancellation the backend has not seen take effect is
        never reported `cancelled`: the job is returned still live, or (Hugging Face, after
        its confirmation looks) TransientBackendError is raised so that the caller asks
        again."""
        ...

    async def logs(self, ref: str, tail: int, now: datetime) -> list[str]: ...

    async def keep_outputs(self, job: KeepOutputs) -> BackendJob:
        """An ended agent job as it ends, its outputs measured (`stored_bytes`, apparent
        sizes) and kept within `job`'s caps, or deleted whole (`outputs_refused`; the job then
        ends `failed` if it had succeeded). Idempotent. A backend whose views of ended jobs
        carry `stored_bytes` already answers from them. Raises TransientBackendError when a
        retry may help."""
        ...

    async def hardware(self) -> list[FlavorPrice]: ...

    def job_limits(self) -> JobLimits | None:
        """What one job of each flavor may use, and which limits this host cannot enforce
        (shown by `task_info`); None when the backend does not say."""
        ...

    async def resolve_model(self, repo_id: str, revision: str) -> str:
        """The commit a branch or tag points at (looked up without the broker's token)."""
        ...

    async def resolve_dataset(self, repo_id: str, denylist: Sequence[str]) -> str:
        """The dataset's current commit, or ToolError(dataset_not_allowed) with the reason."""
        ...

    def storage(self) -> JobStorage:
        """Where this backend keeps its jobs' folders (artifact sizes, retention)."""
        ...

    async def read_dataset(self, repo_id: str, revision: str, max_bytes: int) -> DatasetBytes:
        """What a job mounting `repo_id@revision` at `/datasets/<repo_id>` reads, up to
        `max_bytes` (for the grader-side contamination check; without the broker's token).
        Raises TransientBackendError when a retry may help, ToolError when it cannot."""
        ...

    async def read_outputs(self, ref: str, max_bytes: int) -> DatasetBytes:
        """What the job `ref` left under `/data/outputs/` (its artifact), up to `max_bytes`, in
        `activities.contamination.dataset_bytes.outputs_order` (weights last, their headers
        only), for the contamination check. Raises TransientBackendError when a retry may
        help, ToolError when it cannot (no such job, outputs gone)."""
        ...


class LiveJob(BaseModel):
    """One of this deployment's jobs that is still starting or running (for the orphan reaper)."""

    ref: str
    episode_id: str
    job_id: str
    role: str
    stage: str


class OrphanSource(Protocol):
    """A backend that can list this deployment's live jobs, so that the orphan reaper finds the
    ones whose episode has closed (`Capabilities.reaps_orphans`)."""

    async def live_jobs(self) -> list[LiveJob]: ...

    async def cancel(self, ref: str, now: datetime) -> BackendJob: ...


class KnownRunSource(Protocol):
    """A backend that knows a job's whole run when it starts (the replay backend: a recorded
    run). Its jobs need no workflow and no watching: the episode keeps the `KnownRun` in its job
    table (`workflows/episode/known.py`). `known_run_source` finds one."""

    async def start_known(self, request: JobRequest) -> KnownRun | None:
        """Start the job if its run is known, and answer that run; None when it is not (nothing
        is started: `submit` starts it as any job). Raises what `submit` raises for a job it
        refuses."""
        ...


def known_run_source(backend: JobsBackend) -> KnownRunSource | None:
    """The backend as a `KnownRunSource`, or None when it knows no run at a job's start."""
    return cast(KnownRunSource, backend) if hasattr(backend, "start_known") else None


class Capabilities(BaseModel):
    """What a backend declares about itself. The server and the worker read these, never the
    backend's name."""

    model_config = ConfigDict(frozen=True)

    # It starts jobs that cost real money: API keys are required even on loopback (DESIGN §6).
    spends_money: bool
    # How often the job watcher looks at running jobs, unless POSTTRAIN_WATCH_INTERVAL_S says.
    watch_interval_s: float
    # How soon the watcher may look again after a look that found a change (None: at its
    # interval). Jobs that are files on this machine can be looked at briskly.
    brisk_look_s: float | None = None
    # The backend is an `OrphanSource`: the worker runs the orphan reaper on a Schedule.
    reaps_orphans: bool = False


def no_interceptors() -> Sequence[Interceptor]:
    return ()


def built_by(module: str) -> Callable[[Settings, ServerKey], JobsBackend]:
    """The `build(settings, key)` of `module` (a backend's factory), imported only when a backend
    is built: a declaration is read by processes that run no job (the gateway's)."""

    def build(settings: Settings, key: ServerKey) -> JobsBackend:
        factory: Any = importlib.import_module(module)
        return factory.build(settings, key)

    return build


@dataclass(frozen=True)
class BackendInfo:
    """A backend as its folder declares it (`activities/backends/<name>/info.py`)."""

    name: str  # the value of POSTTRAIN_BACKEND that chooses it
    summary: str  # one line, for `posttrain-env backends` and the docs
    capabilities: Capabilities
    # Builds it from the settings and the deployment's key. Raises SystemExit with a message a
    # person can act on when this machine or these settings cannot run it.
    build: Callable[[Settings, ServerKey], JobsBackend]
    # Worker interceptors the backend's activities rely on.
    interceptors: Callable[[], Sequence[Interceptor]] = no_interceptors
    # A backend whose declaration depends on its own settings (the replay backend's on the
    # backend under it: over `hf` it spends money) returns the one in force here, reading them
    # and looking other backends up with the function it is given (the registry's
    # `backend_info`, passed in so that no declaration imports the registry);
    # `registry.backend_info` answers with it. Raises SystemExit when they are invalid.
    in_force: Callable[[Callable[[str], BackendInfo]], BackendInfo] | None = None
