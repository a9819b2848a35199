"""The activities' interfaces, as workflows call them (`workflow.execute_activity_method`).

Each class lists one group of activities with their inputs and results; the implementations in
`activities/` subclass it and override every method (a test checks that none is left out), so a
workflow depends on these signatures only and loads no activity code, and pyright checks that an
implementation keeps the signature. Activity names are the method names: renaming one changes
the commands of every workflow that calls it (see the README, "Changing workflow code").
"""

from __future__ import annotations

from temporalio import activity

from posttrain_env.contracts.episodes import EpisodeSetup, PrepareEpisode, ServerSpend
from posttrain_env.contracts.jobs import (
    BackendJob,
    CheckScript,
    JobLogs,
    JobRef,
    LogLines,
    ObserveJobs,
    OrphanJob,
    OrphanSearch,
    RepoRef,
    ResolveDatasets,
    ScoreResult,
    SubmitJob,
)


class Unimplemented(NotImplementedError):
    """An interface method that its implementation did not override."""


class JobsApi:
    """Start, watch, cancel and read jobs on the backend (`activities.jobs.JobsActivities`)."""

    @activity.defn
    async def submit_job(self, job: SubmitJob) -> BackendJob:
        """Start the job unless one with its key exists (a retried submit), then watch it."""
        raise Unimplemented

    @activity.defn
    async def observe_jobs(self, observe: ObserveJobs) -> dict[str, BackendJob]:
        """The current state of many jobs in one call (unknown refs are left out)."""
        raise Unimplemented

    @activity.defn
    async def cancel_job(self, job: JobRef) -> BackendJob:
        raise Unimplemented

    @activity.defn
    async def job_logs(self, job: JobLogs) -> LogLines:
        """The end of the job's log, within the `jobs_logs` limits."""
        raise Unimplemented

    @activity.defn
    async def read_score(self, job: JobRef) -> ScoreResult:
        raise Unimplemented

    @activity.defn
    async def resolve_datasets(self, datasets: ResolveDatasets) -> list[RepoRef]:
        raise Unimplemented

    @activity.defn
    async def check_script(self, check: CheckScript) -> None:
        """Raise invalid_script unless the script parses as the job's Python version."""
        raise Unimplemented


class EpisodesApi:
    """Set episodes up and keep the server-wide caps (`activities.episodes.EpisodeActivities`)."""

    @activity.defn
    async def prepare_episode(self, request: PrepareEpisode) -> EpisodeSetup:
        """Load the task, lock its prices, pin the base model, admit the episode."""
        raise Unimplemented

    @activity.defn
    async def reserve_server_spend(self, spend: ServerSpend) -> None:
        raise Unimplemented


class ReaperApi:
    """Find and cancel orphaned Hugging Face jobs (`activities.hf.reaper.ReaperActivities`)."""

    @activity.defn
    async def find_orphan_jobs(self) -> OrphanSearch:
        raise Unimplemented

    @activity.defn
    async def cancel_orphan_job(self, orphan: OrphanJob) -> BackendJob:
        raise Unimplemented
