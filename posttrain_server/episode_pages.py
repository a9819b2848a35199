"""An episode's `status` with every job, read through the pages of its `status` query (issue
27: one answer holds one page, so that it stays bounded however many jobs there are). For
readers that need every job: `posttrain-env episodes show`, and a rollout's record (its job
ids)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from posttrain_common.contracts.episode_calls import EpisodeStatus, JobsPage
from posttrain_env.limits import MAX_JOBS_PAGE
from workflows.episode.workflow import EpisodeWorkflow


async def status_with_every_job(handle: Any, rpc_timeout: timedelta | None = None) -> EpisodeStatus:
    """The episode's `status` with every job, oldest first: its pages followed. A worker older
    than the pages answers every job at once and no cursor, and is asked once."""
    # The first page asked without an argument: a worker older than the pages takes none.
    status: EpisodeStatus = await handle.query(EpisodeWorkflow.status, rpc_timeout=rpc_timeout)
    jobs = list(status.jobs)
    cursor = status.jobs_next_cursor
    while cursor is not None:
        page: EpisodeStatus = await handle.query(
            EpisodeWorkflow.status,
            JobsPage(cursor=cursor, limit=MAX_JOBS_PAGE),
            rpc_timeout=rpc_timeout,
        )
        jobs += page.jobs
        cursor = page.jobs_next_cursor
    return status.model_copy(update={"jobs": jobs, "jobs_next_cursor": None})
