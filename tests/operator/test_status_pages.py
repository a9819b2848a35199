"""`posttrain-env episodes show` reads every job of an episode through the pages of its `status`
query (issue 27), from a worker that pages and from one older than the pages. The query is
answered by the episode's own `episode_status` over the fullest episode."""

from __future__ import annotations

from typing import Any

from posttrain_common.contracts.episode_calls import EpisodeStatus, JobsPage
from posttrain_env.limits import DEFAULT_JOBS_PAGE, MAX_JOBS_PAGE, MAX_JOBS_PER_EPISODE
from posttrain_server.episode_pages import status_with_every_job
from tests.workflows.largest import NOW, largest_episode
from workflows.episode.rules import episode_status, job_view


class Handle:
    """Answers the `status` query as a worker would: paged, or (`paged=False`) every job at
    once without a cursor, as workers before the pages did (they take no argument)."""

    def __init__(self, paged: bool = True) -> None:
        self.setup, self.carry = largest_episode()
        self.paged = paged
        self.pages: list[JobsPage | None] = []

    async def query(self, _query: Any, *args: Any, rpc_timeout: Any = None) -> EpisodeStatus:
        page = args[0] if args else None
        self.pages.append(page)
        if not self.paged:
            assert page is None, "a worker before the pages takes no argument"
            first = episode_status(self.setup, self.carry, NOW)
            jobs = [
                job_view(self.setup.episode_id, r, NOW).model_dump(mode="json")
                for r in self.carry.jobs.values()
            ]
            return first.model_copy(
                update={"jobs": jobs, "jobs_total": None, "jobs_next_cursor": None}
            )
        return episode_status(self.setup, self.carry, NOW, page)


async def test_show_follows_the_pages_to_every_job_in_order() -> None:
    handle = Handle()
    status = await status_with_every_job(handle)
    assert [job["job_id"] for job in status.jobs] == list(handle.carry.jobs)
    assert status.jobs_total == MAX_JOBS_PER_EPISODE and status.jobs_next_cursor is None
    assert handle.pages[0] is None  # the first page asked as an old worker understands it
    later = MAX_JOBS_PER_EPISODE - DEFAULT_JOBS_PAGE
    assert len(handle.pages) == 1 + -(-later // MAX_JOBS_PAGE)


async def test_show_reads_a_worker_older_than_the_pages_with_one_query() -> None:
    handle = Handle(paged=False)
    status = await status_with_every_job(handle)
    assert len(status.jobs) == MAX_JOBS_PER_EPISODE and handle.pages == [None]
