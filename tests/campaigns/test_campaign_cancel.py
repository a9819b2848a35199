"""Cancelling a campaign cancels every rollout in flight and, through their episodes, every job:
none is left live, and nothing more starts."""

from __future__ import annotations

from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.campaigns.records import Outcome
from posttrain_common.contracts.jobs import JobRole, JobState
from tests.campaigns.harness import running_campaigns
from workflows.campaign.contract import CampaignPhase
from workflows.campaign.workflow import CampaignWorkflow

LONG = "print('LONG')\n"  # runs for 50 minutes unless cancelled


async def test_campaign_cancel_leaves_no_live_job_and_starts_nothing_more(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    scenario = FakeScenario(jobs=[FakeJobScript(role=JobRole.agent, run_s=3000)])
    calls = [
        {
            "tool": "jobs_submit",
            "arguments": {"script": LONG, "flavor": "cpu-basic", "timeout_minutes": 60},
        },
        {"wait": True},
        {"tool": "submit", "arguments": {"job_id": "$job"}},
    ]
    spec = {
        "name": "cancelme",
        "tasks": ["t_a"],
        "agents": [{"name": "slow", "agent": "scripted", "args": {"calls": calls}}],
        "epochs": 5,
        "concurrency": 2,
        "budget_usd": 100.0,
    }
    async with running_campaigns(time_skipping_env, tmp_path, scenario, tasks={"t_a": {}}) as c:
        campaign_id = await c.start(spec)
        # Both rollouts in flight have a job running.
        await c.skip_until(campaign_id, lambda s: s.in_flight == 2)
        # ... and has run a while (a job cancelled while queued would cost nothing).
        for _ in range(200):
            now = await time_skipping_env.get_current_time()
            running = [j for j in c.backend.views(now) if j.state is JobState.running]
            if len(c.backend.requests()) == 2 and len(running) == 2:
                break
            await c.sleep()
        assert len(c.backend.requests()) == 2 and len(running) == 2
        await c.sleep()

        answer = await c.handle(campaign_id).execute_update(CampaignWorkflow.cancel)
        assert answer.phase in (CampaignPhase.running, CampaignPhase.cancelling)
        status = await c.run_until_final(campaign_id)
        records = c.records(campaign_id)
        requests = c.backend.requests()
        now = await time_skipping_env.get_current_time()
        jobs = c.backend.views(now)

    assert status.phase is CampaignPhase.cancelled, status
    assert status.in_flight == 0 and status.not_run == 3 and status.finished == 2
    assert status.counts[Outcome.cancelled] == 2
    assert status.mean_reward is None and status.averaged == 0
    # Nothing started after the cancel: two episodes, two jobs, both cancelled and final.
    assert len(requests) == 2
    assert len(jobs) == 2 and {job.state for job in jobs} == {JobState.cancelled}
    assert len(records) == 2
    for record in records:
        assert record.outcome is Outcome.cancelled and record.reward is None
        assert record.end_reason == "cancelled"
        assert record.service_spend.final and record.service_spend.reserved.usd == 0
        assert record.service_spend.settled.usd > 0  # the job ran a while: paid, and recorded
    assert status.spent_usd == round(sum(r.service_spend.settled.usd for r in records), 6)
