"""A campaign's workflow cancelled or terminated through the Temporal CLI, as an operator would:
it stops admitting, its rollouts in flight are cancelled (their episodes end, their jobs are
cancelled and settled), and it ends `cancelled` with its counts kept. Real dev server, fake
backend, the agent worker's scripted agents."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowExecutionStatus

from posttrain_common.campaigns.records import Outcome
from tests.conftest import binary
from tests.replay.record_campaign_histories import LIVE, LONG, Stack, campaign_stack, scenario
from tests.replay.record_campaign_histories import scripted as scripted_agent
from tests.replay.record_histories import dev_server
from tests.waiting import PROGRESS_S, eventually
from workflows.campaign.contract import CampaignPhase, CampaignStatus
from workflows.campaign.workflow import CampaignWorkflow
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import campaign_workflow_id, episode_workflow_id

SPEC = {
    "name": "outside",
    "tasks": ["t_test"],
    "agents": [scripted_agent("slow", LONG)],
    "epochs": 3,
    "concurrency": 2,
    "budget_usd": 20.0,
}


async def temporal(stack: Stack, *args: str) -> None:
    address = stack.client.service_client.config.target_host
    proc = await asyncio.create_subprocess_exec(
        binary("temporal"),
        *args,
        "--address",
        address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()


async def two_jobs_running(stack: Stack) -> None:
    async def both() -> bool:
        views = stack.backend.views(datetime.datetime.now(datetime.UTC))
        return sum(v.state.value == "running" for v in views) == 2

    await eventually(both, 300, "two jobs running", every_s=0.2)


async def final_status(stack: Stack, campaign_id: str) -> CampaignStatus:
    """The campaign's status once its latest run completed."""
    handle = stack.client.get_workflow_handle_for(
        CampaignWorkflow.run, campaign_workflow_id(campaign_id)
    )

    async def completed() -> bool:
        return (await handle.describe()).status is WorkflowExecutionStatus.COMPLETED

    await eventually(completed, 120, "the campaign's workflow completes", every_s=0.5)
    return await handle.query(CampaignWorkflow.status)


async def nothing_left(stack: Stack) -> None:
    """No job live on the backend, and no money reserved by any of the campaign's episodes."""
    now = datetime.datetime.now(datetime.UTC)
    views = stack.backend.views(now)
    assert views and not [v for v in views if v.state.value in LIVE]
    for episode_id in {request.episode_id for request in stack.backend.requests()}:
        handle = stack.client.get_workflow_handle_for(
            EpisodeWorkflow.run, episode_workflow_id(episode_id)
        )

        async def closed(handle: Any = handle) -> bool:
            return (await handle.describe()).status is WorkflowExecutionStatus.COMPLETED

        await eventually(closed, PROGRESS_S, f"episode {episode_id} closes", every_s=0.5)
        spend = (await handle.query(EpisodeWorkflow.status)).service_spend
        assert spend.reserved.usd == 0 and spend.final


async def test_a_campaign_cancelled_through_temporal_cancels_its_rollouts(tmp_path: Path) -> None:
    env = await dev_server()
    async with env, campaign_stack(env, tmp_path, scenario(long=True)) as stack:
        await stack.start("cli-cancel", SPEC)
        await two_jobs_running(stack)
        await temporal(
            stack, "workflow", "cancel", "--workflow-id", campaign_workflow_id("cli-cancel")
        )
        status = await final_status(stack, "cli-cancel")
        assert status.phase is CampaignPhase.cancelled
        assert status.counts[Outcome.cancelled] == 2 and status.not_run == 1
        assert status.in_flight == 0 and status.reserved_usd == 0
        assert len(stack.backend.requests()) == 2  # nothing started after the cancel
        await nothing_left(stack)


async def test_a_terminated_campaign_is_wound_down_by_the_reconciler(tmp_path: Path) -> None:
    env = await dev_server()
    async with env, campaign_stack(env, tmp_path, scenario(long=True), reaper_every_s=3) as stack:
        await stack.start("cli-terminate", SPEC)
        await two_jobs_running(stack)
        await temporal(
            stack,
            "workflow",
            "terminate",
            "--workflow-id",
            campaign_workflow_id("cli-terminate"),
            "--reason",
            "operator test",
        )
        status = await final_status(stack, "cli-terminate")
        assert status.phase is CampaignPhase.cancelled
        assert status.counts[Outcome.cancelled] == 2 and status.in_flight == 0
        assert len(stack.backend.requests()) == 2
        await nothing_left(stack)


async def test_a_terminated_rollout_is_wound_down_and_the_campaign_goes_on(tmp_path: Path) -> None:
    env = await dev_server()
    async with env, campaign_stack(env, tmp_path, scenario(long=True), reaper_every_s=3) as stack:
        await stack.start("cli-rollout", SPEC)
        await two_jobs_running(stack)
        query = "WorkflowType = 'RolloutWorkflow' AND ExecutionStatus = 'Running'"
        rollout = sorted([e.id async for e in stack.client.list_workflows(query)])[0]
        await temporal(
            stack, "workflow", "terminate", "--workflow-id", rollout, "--reason", "operator test"
        )
        campaign = stack.client.get_workflow_handle_for(
            CampaignWorkflow.run, campaign_workflow_id("cli-rollout")
        )

        async def recorded_cancelled() -> bool:
            status = await campaign.query(CampaignWorkflow.status)
            return status.counts[Outcome.cancelled] == 1

        await eventually(recorded_cancelled, 120, "the rollout is recorded cancelled", every_s=0.5)
        # The campaign goes on: the next rollout starts in its place.
        await eventually(
            lambda: len(stack.backend.requests()) == 3, 120, "a third rollout's job", every_s=0.5
        )
        await temporal(
            stack, "workflow", "cancel", "--workflow-id", campaign_workflow_id("cli-rollout")
        )
        status = await final_status(stack, "cli-rollout")
        assert status.phase is CampaignPhase.cancelled
        assert status.counts[Outcome.cancelled] == 3 and status.in_flight == 0
        await nothing_left(stack)
