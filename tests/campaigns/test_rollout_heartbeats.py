"""A rollout's activities heartbeat while they wait on the episode or the agent, so a worker
killed mid-call is noticed within the rollout's heartbeat timeout (seconds), not at the call's
start-to-close timeout (a minute); and an activity that ends at once sends no beat (each is a
write on the Temporal server, three per job of a campaign before). They run here in Temporal's
ActivityEnvironment, which records each heartbeat, against an episode that answers only once
it has seen them beat, or at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.testing import ActivityEnvironment

import activities.campaigns.activities as campaigns
import activities.campaigns.agent_turns as agent_turns
from activities.backends.interface import JobsBackend
from activities.campaigns.activities import CampaignActivities, CampaignConfig
from activities.campaigns.agent_turns import HEARTBEAT_S as TURN_BEAT_S
from activities.campaigns.agent_turns import AgentTurnActivities
from activities.campaigns.store import CampaignStore, StoredTurn
from posttrain_common.campaigns.spec import AgentSpec
from posttrain_common.contracts.campaigns import AgentTurn, CallRef, CallState
from posttrain_common.contracts.episode_calls import EpisodeStatus, ToolCall, ToolResult
from posttrain_env.agents.conversation import Turn
from tests.campaigns.harness import agent_env
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


class QuickEpisode:
    """Accepts the call at once; its answer is not there yet (it comes by signal)."""

    def __init__(self) -> None:
        self.beats = 0
        self.described = 0

    def heartbeat(self, *details: Any) -> None:
        self.beats += 1

    async def send(self, episode_id: str, call: ToolCall) -> bool:
        return True

    async def result_of(self, episode_id: str, request_id: str) -> ToolResult | None:
        return None

    async def is_running(self, episode_id: str) -> bool:
        self.described += 1
        return True

    async def status(self, episode_id: str) -> EpisodeStatus:
        raise AssertionError("a call still running never asks for the episode's status")


def call_activities(
    tmp_path: Path, episode: SlowEpisode | QuickEpisode
) -> tuple[Any, CallRef, ActivityEnvironment]:
    """The call activities against `episode`, a stored call, and an activity environment that
    hands each heartbeat to the episode."""
    store = CampaignStore(tmp_path / "campaigns")
    head = store.start_conversation("c1", BRIEF)
    attempt = "c1/t_a/x/1/a1"
    store.save_turn(
        "c1", attempt, 1, StoredTurn(turn=Turn.call("task_info", {}, "call-1"), conversation=head)
    )
    acts = CampaignActivities(
        cast(JobsBackend, None), store, episode, CampaignConfig(tasks_dir=tmp_path / "tasks")
    )
    ref = CallRef(
        campaign_id="c1",
        attempt_key=attempt,
        number=1,
        index=0,
        episode_id="ep-1",
        reply_to="rollout/c1/t_a/x/1/a1",
        conversation=head,
    )
    env = ActivityEnvironment()
    env.on_heartbeat = episode.heartbeat
    return acts, ref, env


@pytest.mark.parametrize("method", ["send_call", "collect_answer"])
async def test_a_call_activity_heartbeats_while_the_episode_takes_its_time(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(campaigns, "HEARTBEAT_S", 0.01)
    episode = SlowEpisode()
    acts, ref, env = call_activities(tmp_path, episode)

    state: CallState = await env.run(getattr(acts, method), ref)

    assert state.answered is False and episode.beats >= BEATS


async def test_a_call_the_episode_takes_at_once_costs_no_beat_and_no_describe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A first period no loaded machine outlasts: no beat is due within it.
    monkeypatch.setattr(campaigns, "HEARTBEAT_S", 600.0)
    episode = QuickEpisode()
    acts, ref, env = call_activities(tmp_path, episode)

    sent: CallState = await env.run(acts.send_call, ref)
    # Just accepted, so running: the answer comes by signal, no describe to ask.
    assert sent.answered is False and episode.described == 0 and episode.beats == 0

    collected: CallState = await env.run(acts.collect_answer, ref)
    # Later, no answer kept: whether the episode still runs is asked (its end is found).
    assert collected.answered is False and episode.described == 1 and episode.beats == 0


async def run_turn(tmp_path: Path, agent: AgentSpec) -> int:
    """The turn's heartbeats, the turn run as its activity."""
    store = CampaignStore(tmp_path / "campaigns")
    head = store.start_conversation("c1", BRIEF)
    turns = AgentTurnActivities(store, agent_env(POSTTRAIN_STATE_DIR=str(tmp_path)))
    beats: list[object] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    request = AgentTurn(
        campaign_id="c1", attempt_key="c1/t_a/x/1/a1", number=1, agent=agent, conversation=head
    )
    summary = await env.run(turns.agent_turn, request)
    assert summary.kind == "stop"
    return len(beats)


async def test_an_agent_turn_beats_while_the_agent_thinks_and_not_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_turns, "HEARTBEAT_S", 0.05)
    slow = AgentSpec(name="slow", agent="tests.campaigns.agents:Slow", args={"seconds": 2.0})
    assert await run_turn(tmp_path / "slow", slow) >= 3
    # A turn that ends within its first period: its process takes longer than 0.05 s to start,
    # so it is given one of 600 s here, and sends no beat.
    monkeypatch.setattr(agent_turns, "HEARTBEAT_S", 600.0)
    quick = AgentSpec(name="quick", agent="tests.campaigns.agents:Slow", args={"seconds": 0.0})
    assert await run_turn(tmp_path / "quick", quick) == 0


def test_the_heartbeat_timeouts_leave_several_beats_in_each() -> None:
    # A beat late under load must not fail a live activity (it would run again beside itself).
    assert TURN_HEARTBEAT.total_seconds() >= 3 * TURN_BEAT_S
    assert CALL_HEARTBEAT.total_seconds() >= 5 * campaigns.HEARTBEAT_S
