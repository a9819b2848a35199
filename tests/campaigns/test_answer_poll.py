"""A rollout learns that its call was answered from the episode's `tool_answered` signal, and
looks for the answer itself every `answer_poll_s` (default 600 s) only as a safety net. Here
the rollout's worker drops every such signal (a workflow interceptor), and the campaign still
ends with every rollout scored: each answer was collected after a poll's timer fired."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from temporalio import client as temporal_client
from temporalio import worker as temporal_worker
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from posttrain_common.campaigns.records import Outcome
from tests.campaigns.harness import running_campaigns
from tests.campaigns.test_campaign_flow import SCENARIO, SOLVES, scripted
from workflows.campaign.contract import CampaignInput, CampaignPhase
from workflows.campaign.rollout import RolloutWorkflow
from workflows.campaign.rollout_contract import RolloutInput
from workflows.ids import SIGNAL_TOOL_ANSWERED, rollout_workflow_id

POLL_S = 45.0


class DropToolAnswered(temporal_client.Interceptor, temporal_worker.Interceptor):
    """Workflows of the worker never see a `tool_answered` signal (it stays in the history)."""

    def workflow_interceptor_class(
        self, input: temporal_worker.WorkflowInterceptorClassInput
    ) -> type[temporal_worker.WorkflowInboundInterceptor]:
        return _DropToolAnswered


class _DropToolAnswered(temporal_worker.WorkflowInboundInterceptor):
    async def handle_signal(self, input: temporal_worker.HandleSignalInput) -> None:
        if input.signal != SIGNAL_TOOL_ANSWERED:
            await super().handle_signal(input)


def test_the_defaults_make_the_poll_a_safety_net() -> None:
    assert CampaignInput.model_fields["answer_poll_s"].default == 600.0
    assert RolloutInput.model_fields["answer_poll_s"].default == 600.0


async def test_rollouts_whose_answer_signals_are_lost_end_scored_by_polling(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    spec: dict[str, Any] = {
        "name": "polled",
        "tasks": ["t_a"],
        "agents": [scripted("solver", SOLVES)],
        "epochs": 2,
        "concurrency": 2,
        "budget_usd": 10.0,
    }
    async with running_campaigns(
        time_skipping_env, tmp_path, SCENARIO, interceptors=[DropToolAnswered()]
    ) as c:
        campaign_id = await c.start(spec, answer_poll_s=POLL_S)
        status = await c.run_until_final(campaign_id)
        records = c.records(campaign_id)
        histories = [
            await c.client.get_workflow_handle(rollout_workflow_id(r.rollout_id, 1)).fetch_history()
            for r in records
        ]

    assert status.phase is CampaignPhase.completed, status
    assert status.counts[Outcome.scored] == 2 and status.finished == 2
    for history in histories:
        events = history.events
        signalled = [
            e
            for e in events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and e.workflow_execution_signaled_event_attributes.signal_name == SIGNAL_TOOL_ANSWERED
        ]
        collects = [
            e
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == "collect_answer"
        ]
        fired = [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED]
        cut_short = [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_CANCELED]
        # The episode did signal; the rollout, deaf to it, collected each answer after a poll's
        # timer fired (a signal heard would have cut a timer short).
        assert signalled and collects, RolloutWorkflow.__name__
        assert len(fired) >= len(collects) and cut_short == []
