"""What retention deletes, decided from an episode's audit record and the policy (pure: no I/O,
unit-tested without Temporal or files)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from posttrain_common.contracts.audit import AuditRecord
from posttrain_common.contracts.jobs import JobRole
from posttrain_common.contracts.retention import RetainedFolder, RetentionEntry, RetentionPolicy


@dataclass(frozen=True)
class Due:
    folder: RetainedFolder
    keep_artifact: bool  # delete the folder but its artifact (a submitted job's, still kept)


def submitted_job_ids(record: AuditRecord) -> set[str]:
    """The agent jobs whose outputs the episode submitted: what a grader evaluated, or what a
    `submit` call that was not refused named (a grader that never started leaves only that)."""
    ids = {j.evaluated_job_id for j in record.jobs if j.role == JobRole.grader.value}
    ids |= {e.evaluated_job_id for e in record.evaluations if e.role == JobRole.grader.value}
    for call in record.calls:
        job_id = call.arguments.get("job_id")
        if call.tool == "submit" and call.error_type is None and isinstance(job_id, str):
            ids.add(job_id)
    return {job_id for job_id in ids if job_id}


def entry_of(record: AuditRecord) -> RetentionEntry:
    """The sidecar of a record that retention sees for the first time: one folder per job the
    backend knows (a job that never reached the backend has none)."""
    submitted = submitted_job_ids(record)
    return RetentionEntry(
        episode_id=record.episode_id,
        backend=record.backend,
        ended_at=record.ended_at,
        folders=[
            RetainedFolder(
                job_id=job.job_id,
                role=job.role,
                ref=job.backend_job_id,
                submitted=job.job_id in submitted,
                artifact_bytes=job.artifact_bytes,
            )
            for job in record.jobs
            if job.backend_job_id
        ],
    )


def due(entry: RetentionEntry, now: datetime, policy: RetentionPolicy) -> list[Due]:
    """The folders of `entry` that are due for deletion at `now` (none without an end time)."""
    if entry.ended_at is None:
        return []
    age = now - entry.ended_at
    job_due = policy.job_after is not None and age >= policy.job_after
    submitted_due = policy.submitted_after is not None and age >= policy.submitted_after
    found = []
    for folder in entry.folders:
        if folder.deleted_at is not None or folder.refused is not None:
            continue
        if not folder.submitted:
            if job_due:
                found.append(Due(folder, keep_artifact=False))
        elif submitted_due:
            found.append(Due(folder, keep_artifact=False))
        elif job_due and folder.rest_deleted_at is None:
            found.append(Due(folder, keep_artifact=True))
    return found


# -- job folders whose episode has no audit record -------------------------------------------


@dataclass(frozen=True)
class JobFolder:
    """A job folder as its own metadata file names it (`job.json` of a local job): the
    episode it belongs to, and when the job ended (None: no result yet)."""

    ref: str
    episode_id: str
    job_id: str
    role: str
    ended_at: datetime | None


def unrecorded_due(folder: JobFolder, now: datetime, policy: RetentionPolicy) -> bool:
    """Whether the folder of a job whose episode left no audit record (it ended before records
    existed, or its record failed to write) is due at `now`.

    Without a record nothing says which job's outputs the episode submitted, so an agent job's
    folder is kept as long as a submitted artifact would be (`submitted_after`); an
    evaluation's (dev or grader) goes after `job_after`. Measured from the job's own end: a job
    that has not ended is never due (and the storage refuses it anyway)."""
    if folder.ended_at is None:
        return False
    after = policy.submitted_after if folder.role == JobRole.agent.value else policy.job_after
    return after is not None and now - folder.ended_at >= after
