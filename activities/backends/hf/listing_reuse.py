"""One live listing per namespace serves every watcher shard that looks within a few seconds.

Jobs are followed by several watcher shards (posttrain_common/contracts/watching.py), and on
Hugging Face each shard's look is a listing of the deployment's live jobs in a namespace. Shards
look at the same moments (their looks are aligned to the interval), so the listings they would
each make are one listing reused: the Hub sees one listing per namespace per interval and worker
process, however many shards there are, which keeps the rule of at most one status call per job
per 30 s at any number of jobs.

Ages are counted in the looks' own time (the watcher's workflow time, which every shard's aligned
look shares), so a test that skips workflow time never reuses a listing across the skip.
A listing is reused only while it is at most `reuse_s` old and every job the look asks about is
either in it or was in an earlier listing (so its absence means it left the live list: it is
looked at once by itself, to see how it ended). A job never listed yet may have been created
after the listing: it is listed again, never looked at by itself, so a burst of new jobs costs
listings, not a call per job. A job that ended after the listing is seen ended at the next look.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime

from huggingface_hub import JobInfo

# Well under the watcher's 30 s interval, and over the spread of one aligned round of looks.
LISTING_REUSE_S = 10.0
# Job ids remembered as listed once (the latest this many, per process).
MAX_REMEMBERED_IDS = 100_000


class RecentListings:
    def __init__(self, reuse_s: float) -> None:
        self._reuse_s = reuse_s
        self._latest: dict[str, tuple[datetime, list[JobInfo], set[str]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._listed_once: dict[str, None] = {}  # insertion-ordered: the oldest go first

    async def live(
        self,
        namespace: str,
        fetch: Callable[[], Awaitable[list[JobInfo]]],
        now: datetime,
        wanted: set[str] | None = None,
    ) -> list[JobInfo]:
        """The namespace's live listing: the latest one if it is recent enough and can answer
        for every `wanted` job id, else a new one (concurrent looks wait for one listing rather
        than each making their own)."""
        async with self._locks.setdefault(namespace, asyncio.Lock()):
            latest = self._latest.get(namespace)
            if latest is not None:
                taken_at, listing, ids = latest
                age = (now - taken_at).total_seconds()
                unknown = {i for i in wanted or () if i not in ids and i not in self._listed_once}
                if 0 <= age < self._reuse_s and not unknown:
                    return listing
            listing = await fetch()
            ids = {info.id for info in listing}
            self._latest[namespace] = (now, listing, ids)
            self._remember(ids)
            return listing

    def _remember(self, ids: set[str]) -> None:
        for job_id in ids:
            self._listed_once.pop(job_id, None)
            self._listed_once[job_id] = None
        while len(self._listed_once) > MAX_REMEMBERED_IDS:
            del self._listed_once[next(iter(self._listed_once))]
