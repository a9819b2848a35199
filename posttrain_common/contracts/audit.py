"""An episode's audit record: what the agent did, kept outside Temporal so that it outlives
the history's retention (pure; DESIGN §10, "Operators").

Written once per episode, when it ends, by an activity that reads the episode's history
itself (no large payload crosses Temporal); `posttrain-env episodes export` prints it. The
published JSON Schema is `audit.schema.json` beside this module, generated from these models
(a test keeps the two equal). Nothing secret goes in: no token, nonce, hidden-split seed or
session id; scripts by hash, with their text once in `scripts`.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from posttrain_common.contracts.contamination import ContaminationReport
from posttrain_common.contracts.operator import OperatorAction
from posttrain_env.models import ReplayMiss, StorageSpend

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("audit.schema.json")


class AuditCall(BaseModel):
    """One tool call, in the order the episode accepted them."""

    request_id: str
    tool: str
    path: str
    # The call's arguments; a script is replaced by {"sha256": …} (its text is in `scripts`).
    arguments: dict[str, Any]
    accepted_at: datetime | None = None
    answered_at: datetime | None = None
    error_type: str | None = None  # the typed error it was answered with, if any
    result: dict[str, Any] | None = None  # the answer's data when it was not an error


class AuditStateChange(BaseModel):
    state: str
    at: datetime
    message: str = ""


class AuditJob(BaseModel):
    """One job (an agent's, or a dev or grader evaluation)."""

    job_id: str
    workflow_id: str
    role: str
    flavor: str
    timeout_s: int
    script_sha256: str | None = None  # agent jobs; evaluations run the task's evaluator
    dependencies: list[str] = Field(default_factory=list)
    datasets: dict[str, str] = Field(default_factory=dict)  # repo id -> resolved revision
    base_model: str
    base_model_revision: str
    evaluated_job_id: str | None = None
    backend_job_id: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    running_s: float = 0.0
    reserved_micro_usd: int = 0
    settled_micro_usd: int | None = None
    state_changes: list[AuditStateChange] = Field(default_factory=list)
    final_state: str | None = None
    installed: dict[str, str] = Field(default_factory=dict)  # from the launcher's own line
    installer: str | None = None
    # The launcher's sandbox (its own line): TCP on loopback, or AF_UNIX sockets only.
    loopback_tcp: bool | None = None
    artifact_bytes: int | None = Field(
        default=None,
        description=(
            "Bytes of the job's outputs (its artifact) when the episode ended, as its backend "
            "stores them; null: not measured. Retention may delete the folder later: what it "
            "deleted is in <audit dir>/retention/<episode_id>.json."
        ),
    )
    replayed: bool | None = Field(
        default=None,
        description=(
            "True: the job never ran; its outcome was replayed from a recording of an earlier "
            "run with the same script and inputs (the replay backend)."
        ),
    )
    stored_bytes: int | None = Field(
        default=None,
        description=(
            "An agent job: the bytes its artifact keeps as the episode's storage counted and "
            "charged them (apparent sizes); null: not counted (an episode before storage was)."
        ),
    )
    outputs_refused: str | None = Field(
        default=None,
        description="Why the job's outputs were not kept (over a cap, or what an artifact "
        "cannot hold); null: kept.",
    )


class AuditEvaluation(BaseModel):
    job_id: str
    role: str  # dev | grader
    split: str  # dev | hidden
    evaluated_job_id: str | None = None
    valid: bool | None = None
    score: float | None = None
    reason: str = ""


class AuditEnd(BaseModel):
    reason: str
    reward: float | None = None
    invalid_score: str | None = None
    # True when some job of the episode was replayed (the replay backend): not a measured reward.
    replayed: bool | None = None
    # Reason `replay_miss`: the evaluation the replay backend had no recording for (the key it
    # looked for, the nearest recorded keys).
    replay_miss: ReplayMiss | None = None
    # Calls the replay backend answered `not_recorded`, when any was.
    replay_misses: int | None = None


class AuditRecord(BaseModel):
    schema_version: int = SCHEMA_VERSION
    episode_id: str
    task_id: str
    base_model: str
    base_model_revision: str
    backend: str | None = None
    deployment: str | None = None
    campaign_id: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    calls: list[AuditCall] = Field(default_factory=list)
    jobs: list[AuditJob] = Field(default_factory=list)
    evaluations: list[AuditEvaluation] = Field(default_factory=list)
    scripts: dict[str, str] = Field(default_factory=dict)  # sha256 -> the script's text
    end: AuditEnd | None = None
    final_spend_micro_usd: int = 0  # settled (so far, in an export of an episode still open)
    # Held for jobs not yet settled: 0 in the record written at the end; in an export of an
    # `ending` episode, what its cancelling jobs still hold.
    reserved_micro_usd: int = 0
    # The grader-side contamination check (tasks with a `[contamination]` table, episodes
    # ended by `submit`): its counts and its evidence, which may quote test items.
    contamination: ContaminationReport | None = None
    # What operators did to the episode (repairs, a cancel or terminate through Temporal), with
    # who and why, oldest first.
    operator_actions: list[OperatorAction] = Field(default_factory=list)
    # What the episode's artifacts hold against its storage cap, and their charge (part of
    # `final_spend_micro_usd`): `service_spend.storage` at its end. None: not counted.
    storage: StorageSpend | None = None


def audit_schema() -> dict[str, Any]:
    """The published JSON Schema of the record."""
    schema = AuditRecord.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://posttrain-env/audit.schema.json"
    return schema


class WriteAudit(BaseModel):
    """The audit activity's input: the episode's id and its end (the run has not completed
    when the record is written, so its history does not hold the end yet)."""

    episode_id: str
    end: AuditEnd
    now: datetime  # workflow time: what the backend's reads are asked at (fakes need it)
    # The contamination check's report (bounded: posttrain_common/contracts/contamination.py).
    contamination: ContaminationReport | None = None
    operator_actions: list[OperatorAction] = Field(default_factory=list)
    # The ledger's word on money, which the history alone cannot always tell (a job settled at
    # its worst case, or at the minutes an operator read on the provider's console): each
    # settled job's cost, and the total. None from episodes recorded before it was sent.
    settled_micro_usd: dict[str, int] | None = None
    final_spend_micro_usd: int | None = None
    final_states: dict[str, str] | None = None  # job id -> its final state
    stored_bytes: dict[str, int] | None = None  # agent job id -> what its artifact keeps
    outputs_refused: dict[str, str] | None = None  # agent job id -> why nothing was kept
    storage: StorageSpend | None = None
