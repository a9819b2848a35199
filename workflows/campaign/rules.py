"""A campaign's order, admission and bookkeeping, pure (tested without Temporal).

Rollouts have a fixed order: epoch by epoch, then task by task, then agent by agent, so a budget
that stops the campaign early leaves every task and agent measured about equally. Admission
reserves a rollout's worst case (its task's budget plus its agent's `llm_cap_usd`) against the
campaign's budget; when the next rollout does not fit, scheduling waits for the rollouts in
flight to settle (they usually cost less than their worst case), and stops for good only when it
still does not fit with none in flight: at exactly the first rollout that would exceed it.

Retries asked for by `campaign retry` (workflows/campaign/retries.py) are admitted the same way, and
may start after a budget stop if they fit (the stop ends new rollouts, not the retries asked
for). The rollout keeps its old outcome in the counts until its new attempt starts; a retry that
cannot fit is dropped, and the rollout keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from posttrain_common.campaigns.records import AVERAGED, Outcome
from posttrain_common.campaigns.spec import AgentSpec, CampaignSpec
from posttrain_common.contracts.campaigns import CampaignPlan
from posttrain_env.limits import MAX_MESSAGE_CHARS, MAX_STATUS_ROLLOUTS_LISTED, cut_text
from posttrain_env.models import usd
from workflows.campaign.contract import (
    BudgetStop,
    CampaignCarry,
    CampaignInput,
    CampaignPhase,
    CampaignStatus,
    InFlight,
    Retry,
)
from workflows.campaign.rollout_contract import RolloutInput, RolloutResult
from workflows.ids import campaign_workflow_id, rollout_workflow_id


@dataclass(frozen=True)
class Slot:
    index: int
    epoch: int
    task_id: str
    agent: AgentSpec

    def rollout_id(self, campaign_id: str) -> str:
        return f"{campaign_id}/{self.task_id}/{self.agent.name}/{self.epoch}"

    @property
    def cell(self) -> str:
        return f"{self.task_id}/{self.agent.name}"


def slot(spec: CampaignSpec, index: int) -> Slot:
    per_epoch = len(spec.tasks) * len(spec.agents)
    epoch, rest = divmod(index, per_epoch)
    task, agent = divmod(rest, len(spec.agents))
    return Slot(index, epoch + 1, spec.tasks[task], spec.agents[agent])


def worst_case(plan: CampaignPlan, candidate: Slot) -> int:
    """Micro-USD one rollout of `candidate`'s task and agent may cost at most: the task's
    budget and the agent's LLM cap. Plans made before issue 27 list it by cell; newer ones do
    not (tasks x agents entries made the carry grow)."""
    listed = plan.worst_case_micro_usd.get(candidate.cell)
    if listed is not None:
        return listed
    return plan.tasks[candidate.task_id].budget_micro_usd + candidate.agent.llm_cap_micro_usd


def max_worst_case(spec: CampaignSpec, plan: CampaignPlan) -> int:
    """The costliest rollout's worst case."""
    if plan.worst_case_micro_usd:
        return max(plan.worst_case_micro_usd.values())
    budgets = [task.budget_micro_usd for task in plan.tasks.values()]
    caps = [agent.llm_cap_micro_usd for agent in spec.agents]
    return max(budgets, default=0) + max(caps, default=0)


def committed_micro_usd(s: CampaignCarry) -> int:
    """Settled spend of every attempt, plus the worst cases of the attempts in flight."""
    reserved = sum(f.reserved_micro_usd for f in s.in_flight.values())
    return s.env_micro_usd + s.llm_micro_usd + reserved


@dataclass(frozen=True)
class Start:
    slot: Slot
    attempt: int
    reserved_micro_usd: int
    replaces: Outcome | None = None


def next_start(inp: CampaignInput, s: CampaignCarry, now: datetime) -> Start | None:
    """The next attempt to start now, if the window and the budget allow one; sets
    `s.budget_stop` when the budget stops scheduling for good."""
    spec, plan = inp.spec, s.plan
    assert plan is not None
    if s.cancel_requested or len(s.in_flight) >= spec.concurrency:
        return None
    # After a budget stop only the retries asked for may still start (if they fit).
    due = [
        r
        for r in s.retries
        if r.not_before <= now and (s.budget_stop is None or r.replaces is not None)
    ]
    if due:
        candidate, attempt, replaces = slot(spec, due[0].index), due[0].attempt, due[0].replaces
    elif s.budget_stop is None and s.next_index < spec.rollouts:
        candidate, attempt, replaces = slot(spec, s.next_index), 1, None
    else:
        return None
    worst = worst_case(plan, candidate)
    committed = committed_micro_usd(s)
    if committed + worst > spec.budget_micro_usd:
        if not s.in_flight:
            if s.budget_stop is None:
                s.budget_stop = BudgetStop(
                    rollout_id=candidate.rollout_id(inp.campaign_id),
                    needed_usd=usd(worst),
                    left_usd=usd(spec.budget_micro_usd - committed),
                )
            # Spend only grows: the retries asked for will not fit either (they keep their
            # rollouts' old outcomes).
            s.retries = [r for r in s.retries if r.replaces is None]
        return None
    return Start(candidate, attempt, worst, replaces)


def rollout_input(inp: CampaignInput, s: CampaignCarry, start: Start) -> RolloutInput:
    """What the attempt's workflow starts with: pinned to its task's base model as planned."""
    assert s.plan is not None
    return RolloutInput(
        campaign_id=inp.campaign_id,
        campaign_workflow_id=campaign_workflow_id(inp.campaign_id),
        rollout_id=start.slot.rollout_id(inp.campaign_id),
        attempt=start.attempt,
        task_id=start.slot.task_id,
        epoch=start.slot.epoch,
        agent=start.slot.agent,
        base_model=s.plan.tasks[start.slot.task_id].base_model,
        reserved_micro_usd=start.reserved_micro_usd,
        agent_task_queue=inp.agent_task_queue,
        continue_as_new_events=inp.continue_as_new_events,
        answer_poll_s=inp.answer_poll_s,
    )


def next_run(inp: CampaignInput, s: CampaignCarry) -> CampaignInput:
    """The input to continue as new with: the carry, and nothing to do once (`reopen`, `retry`:
    done by the first run)."""
    return inp.model_copy(update={"carry": s, "reopen": None, "retry": None})


def to_cancel(s: CampaignCarry, told: set[str]) -> list[str]:
    """The workflow ids of the attempts in flight not told to cancel yet (and marks them)."""
    ids = []
    for rollout_id, flight in s.in_flight.items():
        if rollout_id not in told:
            told.add(rollout_id)
            ids.append(rollout_workflow_id(rollout_id, flight.attempt))
    return ids


def invalid(s: CampaignCarry, error: str, now: datetime) -> None:
    """The spec cannot run (planning or reopening refused it): the campaign ends, nothing ran."""
    s.error, s.phase, s.finished_at = cut_text(error, MAX_MESSAGE_CHARS), CampaignPhase.invalid, now


def started(inp: CampaignInput, s: CampaignCarry, start: Start) -> None:
    rollout_id = start.slot.rollout_id(inp.campaign_id)
    s.in_flight[rollout_id] = InFlight(
        index=start.slot.index, attempt=start.attempt, reserved_micro_usd=start.reserved_micro_usd
    )
    s.attempts += 1
    if start.attempt == 1:
        s.next_index = max(s.next_index, start.slot.index + 1)
    else:
        s.retries = [r for r in s.retries if r.index != start.slot.index]
        s.retried += 1
        if start.replaces is not None:
            s.counts[start.replaces] -= 1  # undecided again until the new attempt ends


def finished(
    inp: CampaignInput,
    s: CampaignCarry,
    result: RolloutResult,
    now: datetime,
    queue_cap: int | None = None,
) -> bool:
    """Take a finished attempt's report; False for one that is not in flight (a duplicate).
    An `error` is retried while fewer than `queue_cap` new attempts wait (MAX_QUEUED_RETRIES:
    the carry stays bounded); at the cap it is counted as an error."""
    flight = s.in_flight.get(result.rollout_id)
    if flight is None or flight.attempt != result.attempt:
        return False
    del s.in_flight[result.rollout_id]
    s.env_micro_usd += result.env_micro_usd
    s.llm_micro_usd += result.llm_micro_usd
    retry = inp.spec.retry
    if (
        result.outcome is Outcome.error
        and result.attempt < retry.max_attempts
        and not s.cancel_requested
        and (result.error is None or result.error.type not in retry.non_retryable)
        and (queue_cap is None or len(s.retries) < queue_cap)
    ):
        not_before = now + timedelta(seconds=retry.backoff_s)
        s.retries.append(
            Retry(index=flight.index, attempt=result.attempt + 1, not_before=not_before)
        )
        return True
    s.counts[result.outcome] += 1
    if result.outcome in AVERAGED:
        s.reward_sum += result.reward or 0.0
        s.reward_n += 1
    return True


def nothing_left(inp: CampaignInput, s: CampaignCarry) -> bool:
    """True when no attempt will start any more (the in-flight ones may still run)."""
    if s.cancel_requested:
        return True
    if s.budget_stop is not None:
        return not any(r.replaces is not None for r in s.retries)
    return s.next_index >= inp.spec.rollouts and not s.retries


def seconds_to_next_retry(s: CampaignCarry, now: datetime) -> float | None:
    """How long until the first retry waiting is due (at least a second); None: none waits."""
    due = min((r.not_before for r in s.retries), default=None)
    return None if due is None else max((due - now).total_seconds(), 1.0)


def final_phase(s: CampaignCarry) -> CampaignPhase:
    if s.cancel_requested:
        return CampaignPhase.cancelled
    if s.budget_stop is not None:
        return CampaignPhase.budget_stopped
    return CampaignPhase.completed


def status(inp: CampaignInput, s: CampaignCarry) -> CampaignStatus:
    spec, plan = inp.spec, s.plan
    decided = sum(s.counts.values())
    in_flight = len(s.in_flight)
    remaining = spec.rollouts - decided - in_flight
    stopped = s.cancel_requested or s.budget_stop is not None or s.phase.final
    # Retries asked for: their rollouts are still counted (decided) until they start.
    asked = 0 if s.cancel_requested else sum(r.replaces is not None for r in s.retries)
    reserved = sum(f.reserved_micro_usd for f in s.in_flight.values())
    spent = s.env_micro_usd + s.llm_micro_usd
    worst = max_worst_case(spec, plan) if plan else 0
    return CampaignStatus(
        campaign_id=inp.campaign_id,
        name=spec.name,
        phase=s.phase,
        error=s.error,
        rollouts=spec.rollouts,
        finished=decided,
        in_flight=in_flight,
        queued=asked if stopped else remaining + asked,
        not_run=remaining if stopped else 0,
        counts=dict(s.counts),
        attempts=s.attempts,
        retried=s.retried,
        mean_reward=s.reward_sum / s.reward_n if s.reward_n else None,
        averaged=s.reward_n,
        budget_usd=spec.budget_usd,
        spent_usd=usd(spent),
        env_usd=usd(s.env_micro_usd),
        llm_usd=usd(s.llm_micro_usd),
        reserved_usd=usd(reserved),
        left_usd=usd(spec.budget_micro_usd - spent - reserved),
        worst_case_usd=usd(worst),
        budget_stop=s.budget_stop,
        base_models={t: p.base_model.revision for t, p in plan.tasks.items()} if plan else {},
        in_flight_ids=sorted(s.in_flight)[:MAX_STATUS_ROLLOUTS_LISTED],
        created_at=s.created_at,
        finished_at=s.finished_at,
        last_retry=s.last_retry,
    )
