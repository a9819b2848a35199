"""Activities that touch the jobs backend: start, watch, cancel, read logs and scores.

Every secret a job needs (its nonce; a grader's hidden-split seed) is derived here, inside the
activity, and handed to the backend; none is returned to a workflow (DESIGN §9).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import wraps
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from pydantic import BaseModel, Field, field_validator
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from activities.backend import BackendJob, JobRequest, JobRole, JobsBackend, JobSpec, RepoRef
from activities.keys import ServerKey
from job_launcher.trusted_lines import NONCE_ENV, read_score
from posttrain_env.limits import MAX_SCORE_DETAILS_BYTES, bound_log_lines
from posttrain_env.models import BoundedText, ErrorType, ToolError

P = ParamSpec("P")
R = TypeVar("R")

HIDDEN_SEED_SECRET = "POSTTRAIN_HIDDEN_SPLIT_SEED"


# -- inputs and outputs (they cross the workflow boundary: no secrets) ---------------------------


class SubmitJob(JobSpec):
    key: str  # the job workflow's id: the idempotency key
    now: datetime


class ObserveJobs(BaseModel):
    refs: list[str]
    now: datetime


class JobRef(BaseModel):
    ref: str
    key: str
    now: datetime


class JobLogs(JobRef):
    tail: int


class LogLines(BaseModel):
    """The end of a job's log, within the `jobs_logs` limits, and what was cut to fit them."""

    lines: list[str]
    dropped_lines: int = 0
    cut_bytes: int = 0


class ScoreResult(BaseModel):
    """An evaluator's score line as read; its text is cut where it enters (DESIGN §10)."""

    score: float
    valid: bool
    reason: BoundedText = ""
    details: dict[str, Any] = Field(default_factory=dict)

    @field_validator("details")
    @classmethod
    def _bounded_details(cls, details: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(details, default=str))
        if size <= MAX_SCORE_DETAILS_BYTES:
            return details
        return {
            "details_cut": f"the evaluator's details took {size} bytes as JSON; the limit is "
            f"{MAX_SCORE_DETAILS_BYTES}"
        }


class ResolveDatasets(BaseModel):
    repo_ids: list[str]
    denylist: list[str] = Field(default_factory=list)


class WatchRequest(BaseModel):
    """Registers a job with the namespace's watcher (sent by signal-with-start)."""

    ref: str
    workflow_id: str  # the job's workflow: told when the job ends
    state: str
    job_id: str = ""
    episode_workflow_id: str = ""  # told directly of changes short of the end


class WatcherSettings(BaseModel):
    workflow_id: str
    interval_s: float = 30.0
    min_interval_s: float | None = None  # see WatcherInput
    # An idle watcher exits after this long with nothing to watch.
    idle_exit_s: float = 60.0


def agent_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Turn a ToolError into a non-retryable ApplicationError typed by the error enum."""

    @wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except ToolError as err:
            raise ApplicationError(
                err.message, err.details, type=err.type.value, non_retryable=True
            ) from None

    return wrapper


class JobsActivities:
    def __init__(
        self,
        backend: JobsBackend,
        key: ServerKey,
        client: Client,
        tasks_dir: Path,
        watcher: WatcherSettings,
    ) -> None:
        self._backend = backend
        self._key = key
        self._client = client
        self._tasks_dir = tasks_dir
        self._watcher = watcher

    @activity.defn
    @agent_errors
    async def submit_job(self, job: SubmitJob) -> BackendJob:
        """Start the job unless one with its key exists (a retried submit), then watch it."""
        found = await self._backend.find_by_key(job.key, job.now)
        started = found if found is not None else await self._backend.submit(self._request(job))
        await self._watch(started, job)
        return started

    @activity.defn
    async def observe_jobs(self, observe: ObserveJobs) -> dict[str, BackendJob]:
        return await self._backend.observe(observe.refs, observe.now)

    @activity.defn
    @agent_errors
    async def cancel_job(self, job: JobRef) -> BackendJob:
        return await self._backend.cancel(job.ref, job.now)

    @activity.defn
    @agent_errors
    async def job_logs(self, job: JobLogs) -> LogLines:
        lines = await self._backend.logs(job.ref, job.tail, job.now)
        # The launcher's own lines carry the job's nonce; the agent never needs to see it.
        nonce = self._key.job_nonce(job.key)
        # Cut here, before the answer crosses Temporal: a job controls its own log.
        tail = bound_log_lines([line.replace(nonce, "<nonce>") for line in lines], job.tail)
        return LogLines(
            lines=tail.lines, dropped_lines=tail.dropped_lines, cut_bytes=tail.cut_bytes
        )

    @activity.defn
    @agent_errors
    async def read_score(self, job: JobRef) -> ScoreResult:
        lines = await self._backend.logs(job.ref, 10_000, job.now)
        reading = read_score(lines, self._key.job_nonce(job.key))
        return ScoreResult(
            score=reading.score, valid=reading.valid, reason=reading.reason, details=reading.details
        )

    @activity.defn
    @agent_errors
    async def resolve_datasets(self, datasets: ResolveDatasets) -> list[RepoRef]:
        return [
            RepoRef(
                repo_id=repo_id,
                revision=await self._backend.resolve_dataset(repo_id, datasets.denylist),
            )
            for repo_id in datasets.repo_ids
        ]

    # -- helpers -------------------------------------------------------------------------------

    def _request(self, job: SubmitJob) -> JobRequest:
        env = {NONCE_ENV: self._key.job_nonce(job.key)}
        secrets: dict[str, str] = {}
        script = job.script
        if job.role is not JobRole.agent:
            script = self._evaluator_script(job.task_id)
        if job.role is JobRole.grader:
            secrets[HIDDEN_SEED_SECRET] = self._key.hidden_split_seed(job.episode_id)
        # A SubmitJob is a JobRequest without its secrets: copy it, then add them.
        fields = job.model_dump(exclude={"script"})
        return JobRequest(**fields, script=script, env=env, secrets=secrets)

    def _evaluator_script(self, task_id: str) -> str:
        from tasks.registry import TaskSpecError, evaluator_script, load_task

        try:
            # One file: the shared evaluator helpers are embedded (DESIGN §9, "Evaluators").
            return evaluator_script(load_task(task_id, self._tasks_dir), self._tasks_dir)
        except TaskSpecError as err:
            raise ToolError(
                ErrorType.not_allowed, f"evaluations are unavailable for this task: {err}"
            ) from None

    async def _watch(self, started: BackendJob, job: SubmitJob) -> None:
        from workflows.ids import episode_workflow_id
        from workflows.watcher import WatcherInput, WatcherWorkflow

        info = activity.info()
        await self._client.start_workflow(
            WatcherWorkflow.run,
            WatcherInput(
                interval_s=self._watcher.interval_s,
                min_interval_s=self._watcher.min_interval_s,
                idle_exit_s=self._watcher.idle_exit_s,
            ),
            id=self._watcher.workflow_id,
            task_queue=info.task_queue,
            start_signal="watch",
            start_signal_args=[
                WatchRequest(
                    ref=started.ref,
                    workflow_id=job.key,
                    state=started.state.value,
                    job_id=job.job_id,
                    episode_workflow_id=episode_workflow_id(job.episode_id),
                )
            ],
        )
