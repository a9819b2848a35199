"""Activities of the orphan reaper (`workflows/operations/reaper.py`), for every backend that
can list its live jobs (`Capabilities.reaps_orphans`); its Schedule is created by the worker's
wiring (`posttrain_server/wiring.py`).

The backend lists only this deployment's jobs (on Hugging Face: those carrying its label, in the
namespaces it has had jobs in lately), so two deployments sharing one namespace never reap each
other's jobs. An episode counts as closed when its workflow is not running: completed, failed,
terminated, timed out, or not found at all. A live job of a running episode is a stray when its
episode's record of that job is over and names another backend job (or none): a create that
landed after its submit gave up, or beside the job its retry adopted, which has ended.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import activity

from activities.backends.interface import LiveJob, OrphanSource
from activities.ports import EpisodeLiveness
from posttrain_common.contracts.activities import ReaperApi
from posttrain_common.contracts.jobs import BackendJob, OrphanJob, OrphanSearch
from posttrain_common.failures import agent_errors


class ReaperActivities(ReaperApi):
    def __init__(self, backend: OrphanSource, episodes: EpisodeLiveness) -> None:
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
        orphans = [_orphan(job) for job in live if closed[job.episode_id]]
        # Jobs of running episodes that no job workflow follows: a create that landed after
        # every submit attempt gave up, or beside a job that has ended. Found here, within one
        # reaper period, rather than when the episode closes; its episode settles it.
        strays = [
            _orphan(job)
            for job in live
            if not closed[job.episode_id]
            and job.job_id
            and await self._episodes.left_behind(job.episode_id, job.job_id, job.ref)
        ]
        for stray in strays:
            activity.logger.warning(
                "stray job %s of %s in running episode %s (%s): nothing follows it",
                stray.ref,
                stray.job_id,
                stray.episode_id,
                stray.stage,
            )
        for orphan in orphans:
            activity.logger.warning(
                "orphan job %s of closed episode %s (%s)",
                orphan.ref,
                orphan.episode_id,
                orphan.stage,
            )
        return OrphanSearch(checked=len(live), orphans=orphans, strays=strays)

    @activity.defn
    @agent_errors
    async def cancel_orphan_job(self, orphan: OrphanJob) -> BackendJob:
        return await self._backend.cancel(orphan.ref, datetime.now(UTC))


def _orphan(job: LiveJob) -> OrphanJob:
    return OrphanJob(
        ref=job.ref, episode_id=job.episode_id, job_id=job.job_id, role=job.role, stage=job.stage
    )
