"""`campaign retry`'s bookkeeping in the campaign's carry, pure (tested without Temporal): the
picked rollouts queued as new attempts, and a finished campaign's carry rebuilt to run them."""

from __future__ import annotations

from datetime import datetime

from posttrain_common.campaigns.retry import RetryPick
from posttrain_common.contracts.campaigns import Reopened
from posttrain_env.limits import MAX_STATUS_ROLLOUTS_LISTED
from workflows.campaign.contract import (
    CampaignCarry,
    CampaignInput,
    CampaignPhase,
    Reopen,
    Retry,
    RetryAnswer,
    RetryRequest,
)
from workflows.campaign.rules import slot


def busy_indexes(s: CampaignCarry) -> list[int]:
    """Rollouts in flight or waiting for a new attempt: never given another one."""
    return sorted({f.index for f in s.in_flight.values()} | {r.index for r in s.retries})


def queue_retries(
    inp: CampaignInput,
    s: CampaignCarry,
    request: RetryRequest,
    picks: list[RetryPick],
    now: datetime,
    more: bool,
    queue_cap: int | None = None,
) -> RetryAnswer:
    """Queue the picked rollouts' new attempts (but those busy since they were picked), while
    fewer than `queue_cap` wait (MAX_QUEUED_RETRIES); the rest are left for another request
    (`more`)."""
    busy = set(busy_indexes(s))
    queued = []
    for pick in picks:
        if pick.index in busy or not 0 <= pick.index < inp.spec.rollouts:
            continue
        if queue_cap is not None and len(s.retries) >= queue_cap:
            more = True
            break
        busy.add(pick.index)
        s.retries.append(
            Retry(index=pick.index, attempt=pick.attempt, not_before=now, replaces=pick.replaces)
        )
        queued.append(slot(inp.spec, pick.index).rollout_id(inp.campaign_id))
    s.last_retry = RetryAnswer(
        only=request.only,
        queued=len(queued),
        rollout_ids=queued[:MAX_STATUS_ROLLOUTS_LISTED],
        more=more,
    )
    return s.last_retry


def reopen_carry(inp: CampaignInput, s: CampaignCarry, reopen: Reopen, got: Reopened) -> None:
    """Take up a finished campaign: its plan as pinned, its counters from its records."""
    r = got.rebuilt
    s.plan, s.created_at, s.budget_stop = got.plan, reopen.created_at, reopen.budget_stop
    s.counts, s.attempts, s.retried = dict(r.counts), r.attempts, r.retried
    s.reward_sum, s.reward_n = r.reward_sum, r.reward_n
    s.env_micro_usd, s.llm_micro_usd = r.env_micro_usd, r.llm_micro_usd
    # No rollout that never ran starts now, only the retries asked for: a completed campaign
    # ran them all, and after a budget stop `next_start` takes retries only.
    s.next_index = inp.spec.rollouts if reopen.budget_stop is None else r.next_index
    s.phase = CampaignPhase.running
