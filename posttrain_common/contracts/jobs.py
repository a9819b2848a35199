"""Jobs as the episode and the backends speak of them (pure; no secret ever in here).

Everything in this module crosses workflow history: what an episode decides a job is
(`JobSpec`), what a backend reports of it (`BackendJob`), and the inputs and outputs of the
activities that start, watch, cancel and read jobs. Secrets (a job's nonce, a grader's seed) are
added inside the activity (`activities.backends.interface.JobRequest`) and never appear here.
"""

from __future__ import annotations

import enum
import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, field_validator

from posttrain_env.errors import ErrorType
from posttrain_env.limits import MAX_SCORE_DETAILS_BYTES, artifact_over_cap
from posttrain_env.models import BoundedText, JobState


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
    # Agent jobs: what the episode may still keep of this job's outputs (its storage cap less
    # its other jobs' artifacts and storage reservations), and that whole cap; None: no
    # episode cap (jobs started before storage was capped).
    storage_allowance_bytes: int | None = None
    storage_cap_bytes: int | None = None


class OutputsRefusal(BaseModel):
    """Why a job's outputs were not kept (its artifact is empty): `type` is the error an agent
    gets for them (`limit_reached` for a cap, `not_allowed` for what an artifact cannot hold),
    `cap` which cap ("artifact": the job's own, "storage": what its episode may still keep,
    "entries": files and folders), and by how much it was over."""

    type: ErrorType
    message: BoundedText
    cap: str | None = None
    cap_bytes: int | None = None
    over_by_bytes: int | None = None


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
    # The backend lost track of the job (Hugging Face answers 404 for it): its real running time
    # is unknown, so the episode settles it at its worst case, the whole reservation.
    vanished: bool = False
    # The job never ran: its outcome was answered from a recording of an earlier run with the
    # same script and inputs (the replay backend, activities/backends/replay/). Its spend and
    # any score it yields are flagged replayed, never taken for measured ones.
    replayed: bool = False
    # What the launcher's sandbox allowed the script (its trusted `sandbox` line, read once the
    # job has ended): TCP on loopback (True) or AF_UNIX sockets only (False, and why). None: not
    # known (still running, never started, or a backend that runs no launcher).
    loopback_tcp: bool | None = None
    loopback_reason: BoundedText = ""
    # An agent job that ended: the apparent bytes its artifact keeps (what the episode's
    # storage counts and is charged for); None while it runs, for evaluations, and where the
    # backend has not measured it.
    stored_bytes: int | None = None
    # Its outputs were refused whole (nothing was kept): why, typed.
    outputs_refused: OutputsRefusal | None = None
    # The limits the job met, by name ("memory", "processes", "disk", "files", ...): its
    # message then says so, and is kept over the launcher's plainer account of the exit.
    limits_met: list[str] = Field(default_factory=list)


# -- activity inputs and outputs -----------------------------------------------------------------


def with_outputs_judged(
    job: BackendJob, stored_bytes: int | None, refused: OutputsRefusal | None
) -> BackendJob:
    """An ended `job` with what its artifact keeps, or with its outputs refused: it then keeps
    nothing, and a job that would have succeeded fails, its message the refusal's."""
    if refused is None:
        return job.model_copy(update={"stored_bytes": stored_bytes})
    state = JobState.failed if job.state is JobState.succeeded else job.state
    return job.model_copy(
        update={
            "stored_bytes": 0,
            "outputs_refused": refused,
            "state": state,
            "message": refused.message,
        }
    )


class SubmitJob(JobSpec):
    key: str  # the job workflow's id: the idempotency key
    now: datetime
    # Tell the episode the job started, from the activity (before the watcher follows it), so
    # the job's workflow need not: 5 history events fewer per job (issue 26).
    report_start: bool = False
    # The watcher shard that follows the job (the job's input names it); empty: the worker's
    # one watcher (jobs started before sharding).
    watcher_workflow_id: str = ""


class ObserveJobs(BaseModel):
    refs: list[str] = Field(default_factory=list)
    now: datetime
    # The state the watcher knows of each job: given, the answer holds only the jobs whose
    # state differs (a look's answer grows with the changes, not with the jobs watched), and
    # `refs` may be empty (the jobs are the keys).
    states: dict[str, str] | None = None

    def all_refs(self) -> list[str]:
        return list(self.states) if self.states is not None and not self.refs else self.refs


class JobRef(BaseModel):
    ref: str
    key: str
    now: datetime


class JobLogs(JobRef):
    tail: int


class KeepOutputs(JobRef):
    """An ended agent job's outputs, to be measured and kept within its caps (backends that do
    not measure them as the job ends: Hugging Face, where they sit in the job's bucket folder)."""

    artifact_cap_bytes: int
    storage_allowance_bytes: int
    storage_cap_bytes: int | None = None

    def over(self, size: int) -> OutputsRefusal | None:
        """The refusal of outputs of `size` apparent bytes, or None when they may be kept."""
        over = artifact_over_cap(
            size, self.artifact_cap_bytes, self.storage_allowance_bytes, self.storage_cap_bytes
        )
        return None if over is None else OutputsRefusal(type=ErrorType.limit_reached, **over)


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


class CheckScript(BaseModel):
    script: str
    python: str  # the version the job runs, "3.12"


class ResolveDatasets(BaseModel):
    repo_ids: list[str]
    denylist: list[str] = Field(default_factory=list)


# -- the orphan reaper (Hugging Face) -------------------------------------------------------------


class OrphanJob(BaseModel):
    ref: str
    episode_id: str
    job_id: str = ""
    role: str = ""
    stage: str = ""


class OrphanSearch(BaseModel):
    checked: int = 0
    orphans: list[OrphanJob] = Field(default_factory=list)
    # Live jobs of running episodes that no job workflow follows any more (a create that landed
    # after its submit gave up, or beside a job that has ended): cancelled, then settled
    # against their episode (`LateJob`). Empty in results recorded before this field.
    strays: list[OrphanJob] = Field(default_factory=list)


class LateJob(BaseModel):
    """A stray job the reaper cancelled, as its episode settles it (`late_job_settled`)."""

    job_id: str  # the episode's job whose submit created it (its label)
    ref: str  # the backend's job: never the one the episode follows or settled
    role: str = ""
    running_s: float = 0.0  # the backend's own running time, as for any settlement
    state: str = ""
