"""Retention of job folders (pure; docs/operations.md, issue 16).

Job folders (a local job's folder under the state dir; on Hugging Face a job's folder of script
and outputs in the namespace's `jobs-artifacts` bucket) are deleted once their episode ended
longer ago than `RetentionPolicy.job_after`. A submitted artifact (the outputs of the job an
episode submitted) is kept until `submitted_after`, for the audit record's reference; the rest
of that job's folder goes with the others.

The sweep finds folders through the audit records (`<audit dir>/<episode_id>.json`): a record
exists only for an episode that ended, holds its end time, and names every job's backend ref,
also after Temporal's retention removed the history. A backend whose folders name their own
episode (the local backend's `job.json`) also has its folders of episodes without a record
swept (ended before records existed, or the record failed to write): once the episode's
workflow is not open and the job ended longer ago than the retention (an agent job's folder:
the submitted retention, since nothing says whether it was submitted). What the sweep did to
an episode's folders is kept beside its record, in `<audit dir>/retention/<episode_id>.json`
(`RetentionEntry`), which is also what later sweeps read instead of the larger record.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from posttrain_env.limits import MAX_RETENTION_MESSAGE_CHARS

# A sweep's work is bounded: at most this many folders acted on (deleted, refused, failed) per
# run, so one activity never runs for hours; the rest waits for the next run (`more`).
DEFAULT_MAX_FOLDERS = 100
# Messages are cut where they enter (every payload crossing Temporal stays bounded): to
# MAX_RETENTION_MESSAGE_CHARS characters.


class RetentionPolicy(BaseModel):
    """None: kept forever."""

    job_after: timedelta | None = timedelta(days=14)
    submitted_after: timedelta | None = timedelta(days=90)
    max_folders: int = Field(default=DEFAULT_MAX_FOLDERS, ge=1)

    @property
    def deletes_anything(self) -> bool:
        return self.job_after is not None or self.submitted_after is not None


class RetainedFolder(BaseModel):
    """One job's folder, as the sweep knows it."""

    job_id: str
    role: str
    ref: str  # the backend's ref of the job (names its folder)
    submitted: bool = False  # its outputs are the episode's submitted artifact
    artifact_bytes: int | None = None  # from the audit record (None: not measured)
    # A submitted job's folder without its artifact was deleted at this time.
    rest_deleted_at: datetime | None = None
    deleted_at: datetime | None = None  # the whole folder is gone
    bytes_deleted: int = 0
    # The storage refused this folder for good (outside its root, a link): never tried again.
    refused: str | None = None


class RetentionEntry(BaseModel):
    """The sidecar of one audit record: what retention did to the episode's folders. For an
    episode without a record (`unrecorded`), the folders its jobs' own metadata named."""

    episode_id: str
    backend: str | None = None
    ended_at: datetime | None = None
    folders: list[RetainedFolder] = Field(default_factory=list)
    updated_at: datetime | None = None
    unrecorded: bool = False

    @property
    def finished(self) -> bool:
        """Nothing is left for retention to delete (or to try again)."""
        return all(f.deleted_at is not None or f.refused is not None for f in self.folders)


class SweepRetention(BaseModel):
    """The retention activity's input."""

    now: datetime  # workflow time: what folder ages are measured against
    dry_run: bool = False  # report what is due, delete nothing, write nothing


class RetentionDeletion(BaseModel):
    episode_id: str
    job_id: str
    ref: str
    artifact_kept: bool  # a submitted job's folder without its artifact
    bytes: int = 0
    unrecorded: bool = False  # found by its own metadata: its episode has no audit record


class RetentionReport(BaseModel):
    examined: int = 0  # audit records looked at
    deleted: list[RetentionDeletion] = Field(default_factory=list)  # or due, in a dry run
    bytes_deleted: int = 0
    running: list[str] = Field(default_factory=list)  # episodes due but still running
    refused: dict[str, str] = Field(default_factory=dict)  # ref -> why (for good)
    failed: dict[str, str] = Field(default_factory=dict)  # ref -> why (tried again next run)
    unreadable: list[str] = Field(default_factory=list)  # audit records that do not parse
    more: bool = False  # the per-run cap was reached: the next run goes on
    done: bool = False


def cut(message: str) -> str:
    limit = MAX_RETENTION_MESSAGE_CHARS
    return message if len(message) <= limit else message[: limit - 1] + "…"
