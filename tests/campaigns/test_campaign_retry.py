"""`campaign retry --only unscored|errors`: only the selected rollouts run again, as new attempts
(never a finished one twice), admitted against the budget; the report counts each rollout once
with every attempt visible. The picking and bookkeeping pure; the rest on the time-skipping
server, for a finished campaign (started again) and a running one (the update)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.campaigns.records import AgentView, Outcome, RolloutRecord
from posttrain_common.campaigns.retry import pick_retries, rebuild, slot_index
from posttrain_common.campaigns.spec import parse_spec
from posttrain_common.contracts.campaigns import CampaignPlan
from posttrain_common.contracts.jobs import JobRole
from posttrain_server.campaigns.report import build_report
from posttrain_server.commands.campaign_retry import retry_campaign
from tests.campaigns.harness import Campaigns, running_campaigns
from tests.campaigns.test_campaign_flow import GRADER_FAILS, SOLVES, scripted
from workflows.campaign.contract import (
    BudgetStop,
    CampaignCarry,
    CampaignInput,
    CampaignPhase,
    RetryRequest,
)
from workflows.campaign.retries import queue_retries
from workflows.campaign.rules import next_start, nothing_left, slot, started, status

SPEC = parse_spec(
    {
        "name": "r",
        "tasks": ["t_a", "t_b"],
        "agents": [scripted("solver", SOLVES), scripted("graderfail", GRADER_FAILS)],
        "epochs": 2,
        "concurrency": 4,
        "budget_usd": 100.0,
    }
)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def rec(task: str, agent: str, epoch: int, outcome: Outcome, attempt: int = 1) -> RolloutRecord:
    return RolloutRecord(
        campaign_id="r",
        rollout_id=f"r/{task}/{agent}/{epoch}",
        attempt=attempt,
        task_id=task,
        epoch=epoch,
        agent=AgentView(name=agent, agent="scripted"),
        outcome=outcome,
        reward=0.5 if outcome is Outcome.scored else None,
    )


def test_slot_index_is_the_inverse_of_the_campaigns_order() -> None:
    for index in range(SPEC.rollouts):
        s = slot(SPEC, index)
        assert slot_index(SPEC, s.task_id, s.agent.name, s.epoch) == index
    assert slot_index(SPEC, "t_z", "solver", 1) is None


def test_only_rollouts_whose_latest_attempt_ended_so_are_picked_with_the_next_attempt() -> None:
    records = [
        rec("t_a", "graderfail", 1, Outcome.unscored),
        rec("t_a", "graderfail", 2, Outcome.unscored),
        rec("t_a", "graderfail", 2, Outcome.unscored, attempt=2),
        rec("t_b", "graderfail", 1, Outcome.unscored),
        rec("t_b", "graderfail", 1, Outcome.scored, attempt=2),  # retried already, scored
        rec("t_a", "solver", 1, Outcome.error),
        rec("t_b", "solver", 1, Outcome.scored),
    ]
    picks = pick_retries(SPEC, records, "unscored")
    assert [(slot(SPEC, p.index).rollout_id("r"), p.attempt) for p in picks] == [
        ("r/t_a/graderfail/1", 2),
        ("r/t_a/graderfail/2", 3),
    ]
    skip = [slot_index(SPEC, "t_a", "graderfail", 1) or 0]
    assert len(pick_retries(SPEC, records, "unscored", skip=skip)) == 1
    (error,) = pick_retries(SPEC, records, "errors")
    assert (error.index, error.attempt, error.replaces) == (0, 2, Outcome.error)

    rebuilt = rebuild(SPEC, records)
    assert rebuilt.counts[Outcome.unscored] == 2 and rebuilt.counts[Outcome.scored] == 2
    assert rebuilt.attempts == 7 and rebuilt.retried == 2 and rebuilt.reward_n == 2


def test_a_retried_rollout_keeps_its_outcome_until_the_new_attempt_starts() -> None:
    inp = CampaignInput(campaign_id="r", spec=SPEC)
    plan = CampaignPlan(
        tasks={}, worst_case_micro_usd={f"{t}/{a.name}": 1 for t in SPEC.tasks for a in SPEC.agents}
    )
    s = CampaignCarry(
        created_at=NOW, plan=plan, next_index=SPEC.rollouts, phase=CampaignPhase.running
    )
    s.counts[Outcome.unscored] = 4
    s.counts[Outcome.scored] = 4
    picks = pick_retries(SPEC, [rec("t_a", "graderfail", 1, Outcome.unscored)], "unscored")
    answer = queue_retries(inp, s, RetryRequest(only="unscored"), picks + picks, NOW, more=False)
    assert answer.queued == 1 and answer.rollout_ids == ["r/t_a/graderfail/1"]
    assert status(inp, s).finished == 8 and status(inp, s).queued == 1
    start = next_start(inp, s, NOW)
    assert start is not None and start.attempt == 2 and start.replaces is Outcome.unscored
    started(inp, s, start)
    current = status(inp, s)
    assert current.finished == 7 and current.in_flight == 1 and current.queued == 0
    assert current.counts[Outcome.unscored] == 3 and s.retried == 1


def test_a_retry_the_budget_cannot_fit_is_dropped_and_its_rollout_keeps_its_outcome() -> None:
    inp = CampaignInput(campaign_id="r", spec=SPEC)
    worst = {f"{t}/{a.name}": 2_000_000 for t in SPEC.tasks for a in SPEC.agents}
    s = CampaignCarry(
        created_at=NOW,
        plan=CampaignPlan(tasks={}, worst_case_micro_usd=worst),
        phase=CampaignPhase.running,
        next_index=3,  # stopped by the budget at the fourth rollout, in an earlier run
        budget_stop=BudgetStop(rollout_id="r/t_b/solver/1", needed_usd=2.0, left_usd=1.0),
        env_micro_usd=SPEC.budget_micro_usd - 1_500_000,
    )
    s.counts[Outcome.unscored] = 3
    picks = pick_retries(SPEC, [rec("t_a", "graderfail", 1, Outcome.unscored)], "unscored")
    queue_retries(inp, s, RetryRequest(only="unscored"), picks, NOW, more=False)
    assert status(inp, s).queued == 1 and not nothing_left(inp, s)

    assert next_start(inp, s, NOW) is None
    assert s.retries == [] and s.counts[Outcome.unscored] == 3 and nothing_left(inp, s)
    assert s.budget_stop.rollout_id == "r/t_b/solver/1"  # the first stop is kept
    assert status(inp, s).queued == 0 and status(inp, s).not_run == 5  # 8 - the 3 decided


GRADER_FIXED = FakeScenario(jobs=[FakeJobScript(role=JobRole.grader, score=0.75, run_s=30)])
GRADER_BROKEN = FakeScenario(
    jobs=[
        FakeJobScript(
            role=JobRole.grader, evaluated_script_contains="GRADER_FAILS", outcome="failed"
        ),
        FakeJobScript(role=JobRole.grader, score=0.75, run_s=30),
    ]
)


async def retry(c: Campaigns, campaign_id: str) -> int:
    answer = await retry_campaign(
        c.client,
        campaign_id,
        "unscored",
        campaign_root=c.root,
        task_queue=c.task_queue,
        agent_task_queue=c.agent_queue,
    )
    return answer.queued


@pytest.mark.slow  # minutes of real turns, jobs or recordings: the slow set
@pytest.mark.timeout(600)
async def test_retry_of_a_finished_campaign_reruns_only_its_unscored_rollouts_counted_once(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_campaigns(time_skipping_env, tmp_path, GRADER_BROKEN) as c:
        campaign_id = await c.start(SPEC)
        first = await c.run_until_final(campaign_id)
        assert first.counts[Outcome.unscored] == 4 and first.counts[Outcome.scored] == 4
        c.backend.scenario = GRADER_FIXED  # the grader was mended
        queued = await retry(c, campaign_id)
        final = await c.run_until_final(campaign_id)
        again = await retry(c, campaign_id)  # nothing unscored is left: nothing starts
        records = c.records(campaign_id)
        requests = c.backend.requests()

    assert queued == 4 and again == 0
    assert final.phase is CampaignPhase.completed, final
    assert final.counts[Outcome.scored] == 8 and final.counts[Outcome.unscored] == 0
    assert final.finished == 8 and final.attempts == 12 and final.retried == 4
    assert final.mean_reward == 0.75 and final.averaged == 8
    # Its money so far still counts: the status's spend is every attempt's.
    assert final.spent_usd == round(sum(r.service_spend.settled.usd for r in records), 6)
    assert final.created_at == first.created_at and final.base_models == first.base_models
    # Only the unscored rollouts ran again, each once, as attempt 2, recorded beside attempt 1.
    attempts = Counter((r.agent.name, r.attempt) for r in records)
    assert attempts == {("solver", 1): 4, ("graderfail", 1): 4, ("graderfail", 2): 4}
    assert len({r.key for r in records}) == 12
    assert len([r for r in requests if r.role is JobRole.agent]) == 12
    assert len({r.key for r in requests}) == len(requests)
    report = build_report(campaign_id, records)
    assert report.rollouts == 8 and report.attempts == 12
    cell = report.cell("t_a", "graderfail")
    assert cell is not None and cell.rollouts == 2 and cell.attempts == 4
    assert cell.mean_reward == 0.75 and cell.unscored_rate == 0.0
    assert sum(row.deciding for row in report.attempt_rows) == 8


async def test_retry_of_a_running_campaign_queues_the_unscored_rollouts_beside_the_others(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    # The solver's job runs into its 5-minute timeout (its rollouts end `limit`): the
    # grader-failing rollouts end long before.
    slow_solver = FakeJobScript(role=JobRole.agent, script_contains="SOLVES", run_s=7200)
    slow = FakeScenario(jobs=[slow_solver, *GRADER_BROKEN.jobs])
    spec = SPEC.model_copy(update={"epochs": 1})
    async with running_campaigns(time_skipping_env, tmp_path, slow) as c:
        campaign_id = await c.start(spec)
        await c.skip_until(campaign_id, lambda s: s.counts[Outcome.unscored] == 2)
        midway = await c.status(campaign_id)
        c.backend.scenario = FakeScenario(jobs=[slow_solver, *GRADER_FIXED.jobs])
        queued = await retry(c, campaign_id)
        final = await c.run_until_final(campaign_id)
        records = c.records(campaign_id)

    assert midway.phase is CampaignPhase.running and midway.in_flight == 2
    assert queued == 2
    assert final.phase is CampaignPhase.completed and final.last_retry is not None
    assert final.counts[Outcome.unscored] == 0 and final.counts[Outcome.scored] == 2
    assert final.finished == 4 and final.attempts == 6 and final.retried == 2
    retried = [r for r in records if r.attempt == 2]
    assert {(r.agent.name, r.outcome, r.reward) for r in retried} == {
        ("graderfail", Outcome.scored, 0.75)
    }
    assert Counter((r.agent.name, r.attempt) for r in records) == {
        ("solver", 1): 2,
        ("graderfail", 1): 2,
        ("graderfail", 2): 2,
    }
