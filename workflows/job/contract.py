"""What a job workflow takes and reports.

Kept out of the workflow's module: the sandbox imports that module afresh for every workflow
instance (a new job, a continue-as-new, a replay after eviction), and building pydantic models
was most of that import (about a fifth of a workflow process's time at thousands of new jobs,
bench/watch_scale.py). Modules passed through the sandbox are imported once per process."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from posttrain_common.contracts.jobs import BackendJob, JobSpec, ScoreResult, SubmitJob
from posttrain_env.models import JobState


class JobInput(JobSpec):
    parent_workflow_id: str
    watcher_workflow_id: str
    # Keep the operator's search attributes current. Set by episodes that run the visibility
    # patch, which also give the job its memo and first attributes at start (so a job's
    # history holds no patch marker and no memo event: it stays within ~30 events). False in
    # the inputs of jobs recorded before, which replay without upserts.
    visible: bool = False
    # Started again by the reconciler after its run was terminated from outside: find the job
    # (the submit is keyed by this workflow's id, so it is never started twice), cancel it at
    # once, and report its end to the episode.
    wind_down: bool = False
    # The submit activity tells the episode the job started (set by episodes since issue 26's
    # last change, in the input rather than by a patch so that a job's history holds no marker).
    # False in the inputs of jobs recorded before, which report their start themselves.
    start_reported_by_submit: bool = False
    # The money the episode reserved for it (its worst case), shown on the job's row
    # (PtReservedMicroUsd) until it is final. 0 in the inputs of jobs recorded before.
    reserved_micro_usd: int = 0


class JobSnapshot(BaseModel):
    """What a job workflow reports to its episode, at every state change."""

    job_id: str
    state: JobState
    backend: BackendJob | None = None
    error: dict | None = None  # the typed error envelope when the submit failed
    score: ScoreResult | None = None
    message: str = ""
    final: bool = False  # nothing about this job will change any more
    # Set in every report after the job's own workflow was cancelled through Temporal
    # ("cancel"), or terminated and started again by the reconciler ("terminate"): the episode
    # records the first as an operator's action. None in reports recorded before.
    outside: Literal["cancel", "terminate"] | None = None


def submit_request(inp: JobInput, key: str, now: datetime) -> SubmitJob:
    """What the submit activity is asked to start for this job (`key`: its workflow's id)."""
    fields = inp.model_dump(
        exclude={
            "parent_workflow_id",
            "watcher_workflow_id",
            "visible",
            "wind_down",
            "start_reported_by_submit",
            "reserved_micro_usd",
        }
    )
    return SubmitJob(
        **fields,
        key=key,
        now=now,
        report_start=inp.start_reported_by_submit,
        watcher_workflow_id=inp.watcher_workflow_id,
    )


def rejected_artifact(job_id: str, reason: str) -> JobSnapshot:
    """An evaluation refused for its artifact: it scores 0, as invalid, and is final."""
    return JobSnapshot(
        job_id=job_id,
        state=JobState.failed,
        score=ScoreResult(
            score=0.0,
            valid=True,
            reason=reason,
            details={"artifact_valid": False, "reason": reason},
        ),
        message=reason,
        final=True,
    )


def refused_start(job_id: str, error: dict[str, Any], message: str) -> JobSnapshot:
    """A job whose start was refused (`error`: the typed envelope): final, never started."""
    return JobSnapshot(
        job_id=job_id, state=JobState.failed, error=error, message=message, final=True
    )
