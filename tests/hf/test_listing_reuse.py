"""Watcher shards that look together share one Hub listing per namespace (listing_reuse.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from activities.backends.hf.listing_reuse import RecentListings
from workflows.job.watcher import aligned_gap


class Info:
    def __init__(self, job_id: str) -> None:
        self.id = job_id


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 4, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


async def test_looks_within_the_reuse_window_share_one_listing_per_namespace() -> None:
    clock, fetched = Clock(), []

    async def fetch(namespace: str) -> list:
        fetched.append(namespace)
        await asyncio.sleep(0.01)  # concurrent looks wait for this one
        return [Info(f"{namespace}-{len(fetched)}")]

    def ids(listing: list) -> list[str]:
        return [info.id for info in listing]

    listings = RecentListings(10.0)
    first = await asyncio.gather(
        *(listings.live("a", lambda: fetch("a"), clock.now) for _ in range(16))
    )
    assert fetched == ["a"] and all(ids(got) == ["a-1"] for got in first)
    assert ids(await listings.live("b", lambda: fetch("b"), clock.now)) == [
        "b-2"
    ]  # namespaces apart
    clock.now += timedelta(seconds=9.9)
    assert ids(await listings.live("a", lambda: fetch("a"), clock.now)) == ["a-1"]
    clock.now += timedelta(seconds=0.2)  # older than the window: listed again
    assert ids(await listings.live("a", lambda: fetch("a"), clock.now)) == ["a-3"]
    assert fetched == ["a", "b", "a"]


async def test_a_reuse_window_of_zero_lists_every_time() -> None:
    clock, calls = Clock(), 0

    async def fetch() -> list:
        nonlocal calls
        calls += 1
        return []

    listings = RecentListings(0.0)
    for _ in range(3):
        await listings.live("a", fetch, clock.now)
    assert calls == 3


def test_shards_look_at_the_intervals_boundaries() -> None:
    at = datetime(2026, 12, 4, 10, 0, 7, tzinfo=UTC)
    assert aligned_gap(at, 30) == 23
    assert aligned_gap(at.replace(second=29, microsecond=500_000), 30) == 30.5  # never < 1 s
    assert aligned_gap(at.replace(second=0), 30) == 30


async def test_a_job_never_listed_is_listed_again_and_one_that_left_is_not() -> None:
    clock, live, fetches = Clock(), ["j1", "j2"], []

    async def fetch() -> list:
        fetches.append(list(live))
        return [Info(i) for i in live]

    listings = RecentListings(10.0)
    await listings.live("a", fetch, clock.now, {"j1"})
    live.append("j3")  # created after that listing
    got = await listings.live("a", fetch, clock.now, {"j1", "j3"})
    assert len(fetches) == 2 and "j3" in {i.id for i in got}  # listed again, not inspected
    live.remove("j2")  # j2 ended: it was listed before, so the listing answers for it
    await listings.live("a", fetch, clock.now, {"j2", "j3"})
    assert len(fetches) == 2
    gone = await listings.live("a", fetch, clock.now, {"j1"})
    assert {i.id for i in gone} == {"j1", "j2", "j3"}  # the reused listing, still recent
