"""Which rollouts `campaign retry --only unscored|errors` runs again, and a finished campaign's
counters rebuilt from its records (pure: the activities and the CLI read the folder).

A retry is a new attempt of a rollout whose deciding attempt (its highest) ended `unscored` or
`error`: attempt number latest + 1, so its workflow id (`…/a<attempt>`) has never been used and
no finished attempt runs again. Its record is appended beside the old ones; the latest attempt
decides the rollout's outcome, so the report still counts the rollout once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, Field

from posttrain_common.campaigns.records import (
    AVERAGED,
    Outcome,
    OutcomeCounts,
    RolloutRecord,
    every_outcome,
    latest_attempts,
)
from posttrain_common.campaigns.spec import CampaignSpec
from posttrain_env.limits import MAX_RETRIES_PER_REQUEST
from posttrain_env.models import MICRO

RetryOnly = Literal["unscored", "errors"]
SELECTED: dict[str, Outcome] = {"unscored": Outcome.unscored, "errors": Outcome.error}


class RetryPick(BaseModel):
    """A rollout to run again: its place in the campaign's order, the new attempt's number and
    the outcome it replaces (counted until the new attempt starts)."""

    index: int
    attempt: int
    replaces: Outcome


class Rebuilt(BaseModel):
    """A finished campaign's counters, as its carry held them, from its records."""

    counts: OutcomeCounts = Field(default_factory=lambda: every_outcome({}))
    attempts: int = 0
    retried: int = 0
    reward_sum: float = 0.0
    reward_n: int = 0
    env_micro_usd: int = 0
    llm_micro_usd: int = 0
    next_index: int = 0


def slot_index(spec: CampaignSpec, task_id: str, agent: str, epoch: int) -> int | None:
    """A rollout's place in the campaign's fixed order (epoch, task, agent); None if the spec
    has no such rollout (`workflows.campaign.rules.slot` is the inverse)."""
    names = [a.name for a in spec.agents]
    if task_id not in spec.tasks or agent not in names or not 1 <= epoch <= spec.epochs:
        return None
    per_epoch = len(spec.tasks) * len(names)
    return (epoch - 1) * per_epoch + spec.tasks.index(task_id) * len(names) + names.index(agent)


def pick_retries(
    spec: CampaignSpec,
    records: Iterable[RolloutRecord],
    only: RetryOnly,
    skip: Iterable[int] = (),
    limit: int = MAX_RETRIES_PER_REQUEST,
) -> list[RetryPick]:
    """The rollouts whose deciding attempt ended as `only` selects, but those at `skip` (in
    flight, or waiting for an attempt already), in the campaign's order, at most `limit`."""
    wanted, busy = SELECTED[only], set(skip)
    picks = []
    for record in latest_attempts(records).values():
        if record.outcome is not wanted:
            continue
        index = slot_index(spec, record.task_id, record.agent.name, record.epoch)
        if index is None or index in busy:
            continue
        picks.append(RetryPick(index=index, attempt=record.attempt + 1, replaces=wanted))
    return sorted(picks, key=lambda p: p.index)[:limit]


def rebuild(spec: CampaignSpec, records: Iterable[RolloutRecord]) -> Rebuilt:
    records = list(records)
    rebuilt = Rebuilt(attempts=len(records), retried=sum(r.attempt > 1 for r in records))
    for record in latest_attempts(records).values():
        rebuilt.counts[record.outcome] += 1
        if record.outcome in AVERAGED:
            rebuilt.reward_sum += record.reward or 0.0
            rebuilt.reward_n += 1
        index = slot_index(spec, record.task_id, record.agent.name, record.epoch)
        if index is not None:
            rebuilt.next_index = max(rebuilt.next_index, index + 1)
    # The ledger's unit: records hold USD, rounded from micro-USD.
    rebuilt.env_micro_usd = sum(round(r.service_spend.settled.usd * MICRO) for r in records)
    rebuilt.llm_micro_usd = sum(round(r.llm.usd * MICRO) for r in records)
    return rebuilt
