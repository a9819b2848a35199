"""A campaign on the fake backend under time skipping: outcome classes, no attempt run twice,
the budget cap, errors retried as new attempts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.campaigns.records import Outcome, summarize
from posttrain_common.contracts.jobs import JobRole
from tests.campaigns.harness import running_campaigns
from workflows.campaign.contract import CampaignPhase

SOLVES = "print('SOLVES')\n"
CRASHES = "raise SystemExit('CRASHES')\n"
GRADER_FAILS = "print('GRADER_FAILS')\n"
SCENARIO = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.agent, script_contains="CRASHES", outcome="failed", run_s=20),
        FakeJobScript(
            role=JobRole.grader, evaluated_script_contains="GRADER_FAILS", outcome="failed"
        ),
        FakeJobScript(role=JobRole.grader, score=0.75, run_s=30),
    ]
)


def scripted(name: str, script: str, **extra: Any) -> dict[str, Any]:
    calls = [
        {
            "tool": "jobs_submit",
            "arguments": {"script": script, "flavor": "cpu-basic", "timeout_minutes": 5},
        },
        {"wait": True},
        {"tool": "submit", "arguments": {"job_id": "$job"}},
    ]
    return {"name": name, "agent": "scripted", "args": {"calls": calls}, **extra}


@pytest.mark.slow  # minutes of real turns, jobs or recordings: the slow set
@pytest.mark.timeout(600)
async def test_two_tasks_three_agents_three_epochs_count_every_outcome_exactly_once(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    spec = {
        "name": "flow",
        "tasks": ["t_a", "t_b"],
        "agents": [
            scripted("solver", SOLVES),
            scripted("crasher", CRASHES),
            scripted("graderfail", GRADER_FAILS),
        ],
        "epochs": 3,
        "concurrency": 6,
        "budget_usd": 100.0,
    }
    async with running_campaigns(time_skipping_env, tmp_path, SCENARIO) as c:
        campaign_id = await c.start(spec)
        status = await c.run_until_final(campaign_id)
        records = c.records(campaign_id)
        requests = c.backend.requests()

    assert status.phase is CampaignPhase.completed, status
    assert status.finished == 18 and status.in_flight == 0 and status.queued == 0
    assert status.counts == {
        Outcome.scored: 6,
        Outcome.unscored: 6,
        Outcome.error: 0,
        Outcome.limit: 6,
        Outcome.cancelled: 0,
        Outcome.replay_miss: 0,
    }
    assert status.attempts == 18 and status.retried == 0
    assert status.mean_reward == (6 * 0.75) / 12 and status.averaged == 12

    # Every rollout once, with one attempt; the records agree with the status.
    assert len(records) == 18
    assert len({r.key for r in records}) == 18 and {r.attempt for r in records} == {1}
    by_agent = {
        name: [r for r in records if r.agent.name == name]
        for name in ("solver", "crasher", "graderfail")
    }
    assert {(r.outcome, r.end_reason, r.reward) for r in by_agent["solver"]} == {
        (Outcome.scored, "submitted", 0.75)
    }
    # The crashing agent's job failed; its submit was refused; its script ended: abandoned.
    assert {(r.outcome, r.end_reason, r.reward) for r in by_agent["crasher"]} == {
        (Outcome.limit, "abandoned", 0.0)
    }
    # The grader failed: unscored, reward null, never 0.
    assert {(r.outcome, r.end_reason, r.reward) for r in by_agent["graderfail"]} == {
        (Outcome.unscored, "score_failed", None)
    }
    assert Counter((r.task_id, r.epoch) for r in records) == {
        (task, epoch): 3 for task in ("t_a", "t_b") for epoch in (1, 2, 3)
    }
    summary = summarize(records)
    assert summary.mean_reward == status.mean_reward
    assert summary.counts == status.counts

    # No job ran twice: one agent job per rollout, one grader per submitted succeeded job.
    roles = Counter(r.role for r in requests)
    assert roles == {JobRole.agent: 18, JobRole.grader: 12}
    assert len({r.key for r in requests}) == 30
    for record in records:
        # Each turn made one call, one step; the crashing agent's last turn was its stop.
        stopped = 1 if record.agent.name == "crasher" else 0
        assert record.steps_used == record.turns - stopped >= 3
        assert len(record.job_ids) >= 1
        assert record.service_spend.final
        assert record.base_model is not None and len(record.base_model.revision) == 40
        assert record.total_usd == record.service_spend.settled.usd
    # Every rollout of a task ran at the commit the campaign pinned.
    assert {r.base_model.revision for r in records if r.task_id == "t_a" and r.base_model} == {
        status.base_models["t_a"]
    }
    assert {r.base_model.revision for r in requests if r.task_id == "t_a"} == {
        status.base_models["t_a"]
    }


T4_JOB = {"script": SOLVES, "flavor": "t4-small", "timeout_minutes": 60}


@pytest.mark.slow  # minutes of real turns, jobs or recordings: the slow set
@pytest.mark.timeout(600)
async def test_the_budget_stops_scheduling_at_exactly_the_rollout_that_would_exceed_it(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    # Each rollout: worst case $1.00 (the task's budget); it spends 30 minutes of t4-small,
    # 30 x 6,667 micro-USD = $0.20001. With $2.50: rollout k starts only while
    # 0.20001 x (k - 1) + 1.00 <= 2.50, so rollouts 1..8 run and the 9th would exceed it.
    scenario = FakeScenario(
        jobs=[
            FakeJobScript(role=JobRole.agent, run_s=1800),
            FakeJobScript(role=JobRole.grader, score=0.5, run_s=30),
        ]
    )
    calls = [
        {"tool": "jobs_submit", "arguments": T4_JOB},
        {"wait": True},
        {"tool": "submit", "arguments": {"job_id": "$job"}},
    ]
    spec = {
        "name": "capped",
        "tasks": ["t_a"],
        "agents": [{"name": "solver", "agent": "scripted", "args": {"calls": calls}}],
        "epochs": 12,
        "concurrency": 3,
        "budget_usd": 2.5,
    }
    async with running_campaigns(time_skipping_env, tmp_path, scenario, tasks={"t_a": {}}) as c:
        campaign_id = await c.start(spec)
        status = await c.run_until_final(campaign_id)
        records = c.records(campaign_id)

    assert status.phase is CampaignPhase.budget_stopped, status
    assert status.finished == 8 and status.not_run == 4 and status.queued == 0
    assert status.budget_stop is not None
    assert status.budget_stop.rollout_id == f"{campaign_id}/t_a/solver/9"
    assert status.budget_stop.needed_usd == 1.0
    assert status.spent_usd == round(8 * 0.200010, 6)
    assert status.budget_stop.left_usd == round(2.5 - 8 * 0.200010, 6)
    assert sorted(r.epoch for r in records) == list(range(1, 9))
    assert status.spent_usd <= status.budget_usd


async def test_a_failing_agent_is_retried_as_new_attempts_each_recorded_then_counted_as_error(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    calls = [
        {
            "tool": "jobs_submit",
            "arguments": {"script": SOLVES, "flavor": "cpu-basic", "timeout_minutes": 5},
        },
        {"fail": "the agent's code crashed"},
    ]
    spec = {
        "name": "errors",
        "tasks": ["t_a"],
        "agents": [{"name": "broken", "agent": "scripted", "args": {"calls": calls}}],
        "epochs": 1,
        "concurrency": 1,
        "budget_usd": 10.0,
        "retry": {"max_attempts": 3, "backoff_s": 5},
    }
    async with running_campaigns(
        time_skipping_env, tmp_path, FakeScenario(), tasks={"t_a": {}}
    ) as c:
        campaign_id = await c.start(spec)
        status = await c.run_until_final(campaign_id)
        records = c.records(campaign_id)
        requests = c.backend.requests()

    assert status.phase is CampaignPhase.completed
    assert status.counts[Outcome.error] == 1 and status.finished == 1
    assert status.attempts == 3 and status.retried == 2
    assert [r.attempt for r in records] == [1, 2, 3]
    assert {r.outcome for r in records} == {Outcome.error}
    assert {r.error.type for r in records if r.error} == {"agent_failed"}
    assert all("crashed" in r.error.message for r in records if r.error)
    # Each attempt ran its own episode and paid for its own (cancelled) job, recorded.
    assert len({r.episode_id for r in records}) == 3
    assert len([r for r in requests if r.role is JobRole.agent]) == 3
    assert all(r.end_reason == "cancelled" and r.reward is None for r in records)
    assert status.spent_usd == round(sum(r.service_spend.settled.usd for r in records), 6)
    assert status.mean_reward is None and status.averaged == 0
