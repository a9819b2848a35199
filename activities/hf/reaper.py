"""Activities of the orphan reaper (`workflows/reaper.py`); its Schedule is created by the
worker's wiring (`posttrain_env/entrypoints/wiring.py`).

Only jobs carrying this deployment's label are ever looked at, so two deployments sharing one
Hugging Face namespace never reap each other's jobs. It looks in the current namespace and in
those the deployment has had jobs in lately (`activities/hf/namespaces.py`). An episode counts
as closed when its workflow is not running: completed, failed, terminated, timed out, or not
found at all.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import activity

from activities.hf.backend import HfBackend
from activities.ports import EpisodeLiveness
from posttrain_env.contracts.activities import ReaperApi
from posttrain_env.contracts.jobs import BackendJob, OrphanJob, OrphanSearch
from posttrain_env.errors import agent_errors


class ReaperActivities(ReaperApi):
    def __init__(self, backend: HfBackend, episodes: EpisodeLiveness) -> None:
        self._backend = backend
        self._episodes = episodes

    @activity.defn
    async def find_orphan_jobs(self) -> OrphanSearch:
        """This deployment's live jobs whose episode is closed."""
        live = await self._backend.live_jobs()
        closed: dict[str, bool] = {}
        for job in live:
            if job.episode_id not in closed:
                # A label of ours without an episode: nothing can ever cancel that job.
                running = bool(job.episode_id) and await self._episodes.is_running(job.episode_id)
                closed[job.episode_id] = not running
        orphans = [
            OrphanJob(
                ref=job.ref,
                episode_id=job.episode_id,
                job_id=job.job_id,
                role=job.role,
                stage=job.stage,
            )
            for job in live
            if closed[job.episode_id]
        ]
        for orphan in orphans:
            activity.logger.warning(
                "orphan job %s of closed episode %s (%s)",
                orphan.ref,
                orphan.episode_id,
                orphan.stage,
            )
        return OrphanSearch(checked=len(live), orphans=orphans)

    @activity.defn
    @agent_errors
    async def cancel_orphan_job(self, orphan: OrphanJob) -> BackendJob:
        return await self._backend.cancel(orphan.ref, datetime.now(UTC))
