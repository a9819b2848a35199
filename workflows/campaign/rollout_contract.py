"""What a campaign starts a rollout with, what the rollout carries through continue-as-new, and
what it reports back (pure; no key and nothing large: conversations are stored by reference)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from posttrain_common.campaigns.records import Outcome, RecordError
from posttrain_common.campaigns.spec import AgentSpec
from posttrain_common.contracts.episode_calls import EpisodeClosed
from posttrain_common.contracts.jobs import RepoRef
from posttrain_env.agents.conversation import Usage
from posttrain_env.models import BoundedText
from workflows.ids import AGENT_TASK_QUEUE

# Why the agent's play ended (the episode's own end reason says how the episode ended).
PlayEnd = Literal["done", "stop", "max_turns", "llm_cap", "cancelled", "error"]


class RolloutInput(BaseModel):
    campaign_id: str
    campaign_workflow_id: str
    rollout_id: str  # `<campaign>/<task>/<agent>/<epoch>`
    attempt: int = Field(ge=1)
    task_id: str
    epoch: int
    agent: AgentSpec
    base_model: RepoRef  # pinned by the campaign
    reserved_micro_usd: int = 0  # the worst case the campaign reserved for this attempt
    agent_task_queue: str = AGENT_TASK_QUEUE
    # None: continue as new when Temporal suggests it; else past this many history events.
    continue_as_new_events: int | None = None
    # How often a call still unanswered is looked at, should the episode's signal not come:
    # a safety net (the signal is durable), rare because each look costs the server a timer,
    # an activity with a query and two workflow tasks (at 60 s, half of a rollout's tasks at
    # 1000x10). In the input, so a rollout keeps the value it started with.
    answer_poll_s: float = 600.0
    carry: RolloutCarry | None = None

    @property
    def attempt_key(self) -> str:
        return f"{self.rollout_id}/a{self.attempt}"


class RolloutCarry(BaseModel):
    started_at: datetime
    episode_id: str | None = None
    conversation: str | None = None  # the stored conversation's head
    turns: int = 0
    usage: Usage = Field(default_factory=Usage)
    llm_micro_usd: int = 0
    play_end: PlayEnd | None = None
    error: RecordError | None = None
    cancel_requested: bool = False
    # Waiting for server capacity (the server-wide caps refused the episode), with the reason.
    waiting: BoundedText | None = None
    closed: EpisodeClosed | None = None


class RolloutResult(BaseModel):
    """What a finished attempt reports to its campaign (by signal) and returns."""

    rollout_id: str
    attempt: int
    outcome: Outcome
    reward: float | None = None
    end_reason: str | None = None
    env_micro_usd: int = 0
    llm_micro_usd: int = 0
    error: RecordError | None = None


class RolloutStatus(BaseModel):
    rollout_id: str
    attempt: int
    episode_id: str | None
    turns: int
    llm_micro_usd: int
    play_end: PlayEnd | None
    waiting: str | None
    cancel_requested: bool
    closed: bool
