"""What a campaign is started with, carries through continue-as-new (counters, the in-flight set
and the retries waiting: never a list of every rollout), and answers about itself (pure)."""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import BaseModel, Field

from posttrain_common.campaigns.records import Outcome, OutcomeCounts, every_outcome
from posttrain_common.campaigns.retry import RetryOnly
from posttrain_common.campaigns.spec import CampaignSpec
from posttrain_common.contracts.campaigns import CampaignPlan
from workflows.ids import AGENT_TASK_QUEUE


class CampaignPhase(enum.StrEnum):
    planning = "planning"  # checking the spec, pinning base models
    running = "running"
    cancelling = "cancelling"  # cancelled: waiting for in-flight rollouts to end their episodes
    completed = "completed"  # every rollout ran
    budget_stopped = "budget_stopped"  # scheduling stopped at the budget; the rest never ran
    cancelled = "cancelled"
    invalid = "invalid"  # the spec could not run; nothing started

    @property
    def final(self) -> bool:
        return self in (
            CampaignPhase.completed,
            CampaignPhase.budget_stopped,
            CampaignPhase.cancelled,
            CampaignPhase.invalid,
        )


class InFlight(BaseModel):
    index: int
    attempt: int
    reserved_micro_usd: int


class Retry(BaseModel):
    """A new attempt of a rollout, due at `not_before`: after an `error` (the rollout is not
    counted yet), or asked for by `campaign retry` (`replaces`: the outcome the rollout is
    counted with until the new attempt starts)."""

    index: int
    attempt: int
    not_before: datetime
    replaces: Outcome | None = None


class RetryRequest(BaseModel):
    """`campaign retry --only unscored|errors`: run those rollouts again, as new attempts."""

    only: RetryOnly


class RetryAnswer(BaseModel):
    only: RetryOnly
    queued: int  # rollouts given a new attempt
    rollout_ids: list[str] = Field(default_factory=list)  # at most MAX_STATUS_ROLLOUTS_LISTED
    more: bool = False  # more were selected than one request queues: `retry` again


class BudgetStop(BaseModel):
    """Where scheduling stopped: the next rollout's worst case did not fit what was left."""

    rollout_id: str
    needed_usd: float
    left_usd: float


class Reopen(BaseModel):
    """A finished campaign started again (same id) to run retries: what its last run ended
    with that its records do not say."""

    created_at: datetime
    budget_stop: BudgetStop | None = None


class CampaignCarry(BaseModel):
    phase: CampaignPhase = CampaignPhase.planning
    created_at: datetime
    plan: CampaignPlan | None = None
    error: str | None = None
    next_index: int = 0  # the next rollout never started, in the campaign's fixed order
    in_flight: dict[str, InFlight] = Field(default_factory=dict)  # by rollout id
    retries: list[Retry] = Field(default_factory=list)
    counts: OutcomeCounts = Field(default_factory=lambda: every_outcome({}))
    attempts: int = 0  # attempts started
    retried: int = 0  # of them, new attempts after an error
    reward_sum: float = 0.0
    reward_n: int = 0
    env_micro_usd: int = 0  # settled, every attempt
    llm_micro_usd: int = 0
    budget_stop: BudgetStop | None = None
    cancel_requested: bool = False
    finished_at: datetime | None = None
    last_retry: RetryAnswer | None = None


class CampaignInput(BaseModel):
    campaign_id: str
    spec: CampaignSpec
    agent_task_queue: str = AGENT_TASK_QUEUE
    # None: continue as new when Temporal suggests it; else past this many history events
    # (the campaign's own and, the same number, each rollout's). Lower it to exercise the path.
    continue_as_new_events: int | None = None
    answer_poll_s: float = 600.0  # each rollout's (RolloutInput.answer_poll_s)
    carry: CampaignCarry | None = None
    # A finished campaign started again by `campaign retry`: its state is rebuilt from its
    # folder instead of planned, and `retry` is queued first (both dropped on continue-as-new).
    reopen: Reopen | None = None
    retry: RetryRequest | None = None


class CampaignStatus(BaseModel):
    """A campaign at a glance (the `status` query; `posttrain-env campaign status`). Counts are
    of rollouts, each once by its deciding attempt; money is of every attempt, in USD."""

    campaign_id: str
    name: str
    phase: CampaignPhase
    error: str | None = None
    rollouts: int  # planned: tasks x agents x epochs
    finished: int  # decided (any outcome)
    in_flight: int
    queued: int  # still to start (retries included)
    not_run: int  # never to run: the budget stopped scheduling, or the campaign was cancelled
    counts: OutcomeCounts
    attempts: int
    retried: int
    mean_reward: float | None  # over scored and limit rollouts
    averaged: int  # how many rollouts the mean is over
    budget_usd: float
    spent_usd: float  # settled: environment + LLM, every attempt
    env_usd: float
    llm_usd: float
    reserved_usd: float  # the worst cases of the attempts in flight
    left_usd: float  # budget - spent - reserved
    worst_case_usd: float  # of the costliest rollout
    budget_stop: BudgetStop | None = None
    base_models: dict[str, str] = Field(default_factory=dict)  # task id -> pinned commit
    in_flight_ids: list[str] = Field(default_factory=list)  # at most MAX_STATUS_ROLLOUTS_LISTED
    created_at: datetime
    finished_at: datetime | None = None
    last_retry: RetryAnswer | None = None  # what the last `campaign retry` queued
