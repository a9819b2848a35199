"""A finished attempt as a record and as a result for its campaign (pure; tested without
Temporal)."""

from __future__ import annotations

from datetime import datetime

from posttrain_common.campaigns.records import (
    AgentView,
    LlmSpend,
    Outcome,
    RepoRevision,
    RolloutRecord,
    outcome_of,
)
from posttrain_env.models import MICRO, ServiceSpend, usd
from workflows.campaign.rollout_contract import RolloutCarry, RolloutInput, RolloutResult


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def attempt_record(inp: RolloutInput, s: RolloutCarry, now: datetime) -> RolloutRecord:
    """The attempt's record as far as the workflow knows it (the activity that appends it adds
    the steps and job ids from the episode's status)."""
    end = s.closed.end if s.closed is not None else None
    outcome = outcome_of(end.reason if end else None, failed=s.error is not None)
    reward = end.reward if end is not None and outcome in (Outcome.scored, Outcome.limit) else None
    spend = s.closed.service_spend if s.closed is not None else ServiceSpend()
    return RolloutRecord(
        campaign_id=inp.campaign_id,
        rollout_id=inp.rollout_id,
        attempt=inp.attempt,
        task_id=inp.task_id,
        epoch=inp.epoch,
        agent=AgentView(name=inp.agent.name, agent=inp.agent.agent, args=inp.agent.args),
        base_model=RepoRevision(repo_id=inp.base_model.repo_id, revision=inp.base_model.revision),
        outcome=outcome,
        end_reason=end.reason.value if end else None,
        reward=reward,
        service_spend=spend,
        llm=LlmSpend(
            usd=usd(s.llm_micro_usd),
            prompt_tokens=s.usage.prompt_tokens,
            completion_tokens=s.usage.completion_tokens,
            requests=s.usage.requests,
        ),
        reserved_usd=usd(inp.reserved_micro_usd),
        turns=s.turns,
        wall_time_s=round((now - s.started_at).total_seconds(), 3),
        started_at=iso(s.started_at),
        ended_at=iso(now),
        episode_id=s.episode_id,
        error=s.error,
        conversation=s.conversation,
        contamination=end.contamination if end else None,
        replayed=end.replayed if end else None,
    )


def rollout_result(record: RolloutRecord, s: RolloutCarry) -> RolloutResult:
    return RolloutResult(
        rollout_id=record.rollout_id,
        attempt=record.attempt,
        outcome=record.outcome,
        reward=record.reward,
        end_reason=record.end_reason,
        env_micro_usd=round(record.service_spend.settled.usd * MICRO),
        llm_micro_usd=s.llm_micro_usd,
        error=record.error,
    )
