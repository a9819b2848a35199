"""The heartbeat of activities that wait on something else (activities/heartbeat.py), run in
the SDK's own activity environment, which records each heartbeat an activity sends."""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.testing import ActivityEnvironment

from activities.heartbeat import heartbeating
from activities.jobs.activities import SUBMIT_BEAT_S
from workflows.policies import SUBMIT_HEARTBEAT, SUBMIT_TIMEOUT


def beats_of(block_s: float, every_s: float, first_after_s: float) -> int:
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)

    @activity.defn
    async def waiting() -> None:
        async with heartbeating(every_s, first_after_s=first_after_s):
            await asyncio.sleep(block_s)

    asyncio.run(env.run(waiting))
    return len(beats)


def test_a_block_shorter_than_the_first_beat_sends_none_and_a_longer_one_beats_on() -> None:
    assert beats_of(0.05, every_s=0.1, first_after_s=0.3) == 0
    assert beats_of(0.65, every_s=0.1, first_after_s=0.3) >= 2


def test_outside_an_activity_the_block_just_runs() -> None:
    async def plain() -> str:
        async with heartbeating(0.01):
            await asyncio.sleep(0.03)
        return "done"

    assert asyncio.run(plain()) == "done"


def test_the_submit_beats_several_times_per_heartbeat_timeout_within_its_start_to_close() -> None:
    assert SUBMIT_HEARTBEAT.total_seconds() >= 3 * SUBMIT_BEAT_S
    assert SUBMIT_HEARTBEAT <= SUBMIT_TIMEOUT / 3
