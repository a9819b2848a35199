"""A worker's full garbage collections come on its own schedule (posttrain_server/
full_collections.py): never from Python's count of objects while the schedule is on, once per
period, and Python's thresholds back afterwards. The period is a setting with bounds."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
import weakref
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from posttrain_common.settings import Settings
from posttrain_server.full_collections import full_collections_every
from tests.waiting import eventually

PYTHON_DEFAULT = (700, 10, 10)


@pytest.fixture
def full_collections() -> Iterator[list[float]]:
    """Python's default thresholds for the test, and when each full collection seen during it
    began (a generation-2 collection, whoever asked for it)."""
    seen: list[float] = []

    def on_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(time.monotonic())

    before = gc.get_threshold()
    gc.set_threshold(*PYTHON_DEFAULT)
    gc.callbacks.append(on_collection)
    try:
        yield seen
    finally:
        gc.callbacks.remove(on_collection)
        gc.set_threshold(*before)


class Node:
    """Something a cycle can be made of (a dict cannot be weakly referenced)."""

    me: Node | None = None


def fresh_cycle() -> weakref.ref[Node]:
    """A cycle no one refers to, just made: only the garbage collector frees it."""
    node = Node()
    node.me = node
    return weakref.ref(node)


async def long_lived_churn() -> None:
    """What a worker does as workflows arrive: objects that live long enough to reach the
    oldest generation (half a million, kept a while and then dropped), in steps that let the
    event loop run."""
    kept: list[list[dict[str, object]]] = []
    for _ in range(50):
        batch: list[dict[str, object]] = [{"n": n} for n in range(10_000)]
        for item in batch:
            item["self"] = item  # a cycle, as a workflow's objects have
        kept.append(batch)
        if len(kept) > 20:
            kept.pop(0)
        await asyncio.sleep(0)


async def test_python_collects_the_oldest_generation_by_itself_under_such_churn(
    full_collections: list[float],
) -> None:
    """The control: without the schedule, the churn below makes Python collect everything at
    least once (so the next test's zero means something)."""
    await long_lived_churn()
    assert len(full_collections) >= 1


async def test_with_the_schedule_on_no_full_collection_comes_from_pythons_count(
    full_collections: list[float],
) -> None:
    async with full_collections_every(3600):
        assert gc.get_threshold()[:2] == PYTHON_DEFAULT[:2]  # the young ones as before
        await long_lived_churn()
        assert full_collections == []
        # The younger generations are still collected by Python: a fresh cycle does not wait
        # for the next full collection.
        ref = fresh_cycle()
        kept = [[] for _ in range(5_000)]  # allocations enough for several young collections
        assert ref() is None and len(kept) == 5_000
    assert gc.get_threshold() == PYTHON_DEFAULT


async def test_the_schedule_collects_everything_once_per_period(
    full_collections: list[float],
) -> None:
    entered = time.monotonic()
    async with full_collections_every(0.2):
        # A loaded machine runs the loop late, never early.
        await eventually(lambda: len(full_collections) >= 3, 30, "three full collections")
    starts = [entered, *full_collections[:3]]
    assert all(later - earlier >= 0.2 for earlier, later in itertools.pairwise(starts))
    assert gc.get_threshold() == PYTHON_DEFAULT
    # Once out, nothing more is scheduled.
    left = len(full_collections)
    await asyncio.sleep(0.5)
    assert len(full_collections) == left


async def test_a_period_of_zero_leaves_pythons_schedule_alone(
    full_collections: list[float],
) -> None:
    async with full_collections_every(0):
        assert gc.get_threshold() == PYTHON_DEFAULT
        await long_lived_churn()
    assert len(full_collections) >= 1


async def test_a_negative_period_is_refused(full_collections: list[float]) -> None:
    with pytest.raises(ValueError, match="0 s or more, not -1"):
        async with full_collections_every(-1):
            pass
    assert gc.get_threshold() == PYTHON_DEFAULT


def test_the_period_is_a_setting_with_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().worker_full_collection_every_s == 600
    monkeypatch.setenv("POSTTRAIN_WORKER_FULL_COLLECTION_EVERY_S", "120")
    assert Settings().worker_full_collection_every_s == 120
    monkeypatch.setenv("POSTTRAIN_WORKER_FULL_COLLECTION_EVERY_S", "0")
    assert Settings().worker_full_collection_every_s == 0
    monkeypatch.delenv("POSTTRAIN_WORKER_FULL_COLLECTION_EVERY_S")
    for bad in (-1, 86_401, "soon"):
        with pytest.raises(ValidationError, match="worker_full_collection_every_s"):
            Settings(worker_full_collection_every_s=bad)  # type: ignore[arg-type]
