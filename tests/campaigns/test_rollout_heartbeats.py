"""A rollout's call activities heartbeat while they wait on the episode, so a worker killed
mid-call is noticed within the rollout's heartbeat timeout (seconds), not at the call's
start-to-close timeout (a minute): the activities run here in Temporal's ActivityEnvironment,
against an episode that answers only once it has seen them beat."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.testing import ActivityEnvironment

import activities.campaigns.activities as campaigns
from activities.backends.interface import JobsBackend
from activities.campaigns.activities import CampaignActivities, CampaignConfig
from activities.campaigns.agent_turns import HEARTBEAT_S as TURN_BEAT_S
from activities.campaigns.store import CampaignStore, StoredTurn
from posttrain_common.contracts.campaigns import CallRef, CallState
from posttrain_common.contracts.episode_calls import EpisodeStatus, ToolCall, ToolResult
from posttrain_env.agents.conversation import Turn
from tests.campaigns.test_agent_turns import BRIEF
from workflows.campaign.rollout import CALL_HEARTBEAT, TURN_HEARTBEAT

BEATS = 3
WAIT_S = 30.0  # for the beats: generous on a loaded machine (they come every few ms here)


class SlowEpisode:
    """Accepts the call and looks for its answer only after `BEATS` heartbeats."""

    def __init__(self) -> None:
        self.beats = 0
        self.beaten = asyncio.Event()

    def heartbeat(self, *details: Any) -> None:
        self.beats += 1
        if self.beats >= BEATS:
            self.beaten.set()

    async def send(self, episode_id: str, call: ToolCall) -> bool:
        await asyncio.wait_for(self.beaten.wait(), WAIT_S)
        return True

    async def result_of(self, episode_id: str, request_id: str) -> ToolResult | None:
        await asyncio.wait_for(self.beaten.wait(), WAIT_S)
        return None  # not answered yet

    async def is_running(self, episode_id: str) -> bool:
        return True

    async def status(self, episode_id: str) -> EpisodeStatus:
        raise AssertionError("a call still running never asks for the episode's status")


@pytest.mark.parametrize("method", ["send_call", "collect_answer"])
async def test_a_call_activity_heartbeats_while_the_episode_takes_its_time(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(campaigns, "HEARTBEAT_S", 0.01)
    store = CampaignStore(tmp_path / "campaigns")
    head = store.start_conversation("c1", BRIEF)
    attempt = "c1/t_a/x/1/a1"
    store.save_turn(
        "c1", attempt, 1, StoredTurn(turn=Turn.call("task_info", {}, "call-1"), conversation=head)
    )
    episode = SlowEpisode()
    acts = CampaignActivities(
        cast(JobsBackend, None), store, episode, CampaignConfig(tasks_dir=tmp_path / "tasks")
    )
    env = ActivityEnvironment()
    env.on_heartbeat = episode.heartbeat
    ref = CallRef(
        campaign_id="c1",
        attempt_key=attempt,
        number=1,
        index=0,
        episode_id="ep-1",
        reply_to="rollout/c1/t_a/x/1/a1",
        conversation=head,
    )

    state: CallState = await env.run(getattr(acts, method), ref)

    assert state.answered is False and episode.beats >= BEATS


def test_the_heartbeat_timeouts_leave_several_beats_in_each() -> None:
    # A beat late under load must not fail a live activity (it would run again beside itself).
    assert TURN_HEARTBEAT.total_seconds() >= 3 * TURN_BEAT_S
    assert CALL_HEARTBEAT.total_seconds() >= 5 * campaigns.HEARTBEAT_S
