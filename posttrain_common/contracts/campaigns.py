"""What the campaign and rollout workflows say to their activities (pure; no key in here).

Conversations and turns stay in the campaign's folder (activities/campaigns/store.py); what
crosses workflow history is their content hash and small summaries.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from posttrain_common.campaigns.records import RolloutRecord
from posttrain_common.campaigns.retry import Rebuilt, RetryOnly
from posttrain_common.campaigns.spec import AgentSpec, CampaignSpec
from posttrain_common.contracts.jobs import RepoRef
from posttrain_env.agents.conversation import TaskBrief, Usage


class TaskPlan(BaseModel):
    task_id: str
    budget_micro_usd: int
    base_model: RepoRef  # the backend's repo at the commit the campaign pins


class PlanCampaign(BaseModel):
    campaign_id: str
    spec: CampaignSpec
    created_at: datetime


class CampaignPlan(BaseModel):
    tasks: dict[str, TaskPlan]
    # Worst case of one rollout, by "<task>/<agent>": the task's budget + the agent's LLM cap.
    # Plans made before issue 27 only: tasks x agents entries (4,096 at the limits) made the
    # campaign's carry grow, and the rules derive it from `tasks` and the spec now.
    worst_case_micro_usd: dict[str, int] = Field(default_factory=dict)


class CheckAgents(BaseModel):
    agents: list[AgentSpec]


class OpenConversation(BaseModel):
    campaign_id: str
    brief: TaskBrief


class AgentTurn(BaseModel):
    campaign_id: str
    attempt_key: str  # `<rollout id>/a<attempt>`
    number: int  # 1, 2, ...
    agent: AgentSpec
    conversation: str  # the head before the turn


class TurnSummary(BaseModel):
    kind: Literal["calls", "stop"]
    calls: int = 0
    tools: list[str] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    conversation: str  # the head with the turn's messages added


class CallRef(BaseModel):
    """Call `index` of turn `number` of an attempt, to the episode `episode_id`."""

    campaign_id: str
    attempt_key: str
    number: int
    index: int
    episode_id: str
    reply_to: str  # the rollout's workflow id, signalled when the episode answered
    conversation: str  # the head to add the answer to

    @property
    def request_id(self) -> str:
        return f"t{self.number}c{self.index}"


class CallState(BaseModel):
    """Where a call stands: answered (and added to the conversation) or still running."""

    answered: bool
    conversation: str
    done: bool = False  # the episode is over
    # Answered without reaching the episode (a malformed call): no step was used.
    local: bool = False


class FinishAttempt(BaseModel):
    """The facts of a finished attempt that the workflow knows; the activity adds what the
    episode's status says (steps, jobs) and appends the record."""

    record: RolloutRecord
    episode_id: str | None = None


class PickRetries(BaseModel):
    """Which rollouts of the campaign to run again (`campaigns.retry.pick_retries`); `skip`:
    the places of rollouts in flight or already waiting for a new attempt."""

    campaign_id: str
    spec: CampaignSpec
    only: RetryOnly
    skip: list[int] = Field(default_factory=list)


class ReopenCampaign(BaseModel):
    campaign_id: str
    spec: CampaignSpec


class Reopened(BaseModel):
    """A finished campaign taken up again: its plan as it was pinned (`campaign.json`) and its
    counters rebuilt from its records."""

    plan: CampaignPlan
    rebuilt: Rebuilt
