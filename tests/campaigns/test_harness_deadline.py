"""A campaign test that runs past its deadline fails at its own await, with a message that says
so, and its workers shut down: it never waits on forever (see tests/campaigns/harness.py)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from tests.campaigns.harness import running_campaigns
from tests.campaigns.test_campaign_cancel import LONG

DEADLINE = timedelta(seconds=5)


async def test_a_campaign_test_past_its_deadline_fails_and_shuts_its_workers_down(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    # Four long rollouts at once keep the workers busy (turns, jobs) when the deadline comes.
    scenario = FakeScenario(jobs=[FakeJobScript(role=JobRole.agent, run_s=3000)])
    submit = {"script": LONG, "flavor": "cpu-basic", "timeout_minutes": 60}
    calls = [{"tool": "jobs_submit", "arguments": submit}, {"wait": True}]
    spec = {
        "name": "late",
        "tasks": ["t_a"],
        "agents": [{"name": "slow", "agent": "scripted", "args": {"calls": calls}}],
        "epochs": 8,
        "concurrency": 4,
        "budget_usd": 100.0,
    }
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="past its deadline"):
        async with running_campaigns(
            time_skipping_env, tmp_path, scenario, tasks={"t_a": {}}, deadline=DEADLINE
        ) as c:
            campaign_id = await c.start(spec)
            await c.run_until_final(campaign_id, max_steps=100_000)
    # Failed at the deadline and shut down within the test's own (pytest) timeout.
    assert DEADLINE.total_seconds() <= time.monotonic() - began < 120
