"""The campaign workflow's pure rules, without Temporal: what a rollout attempt starts with, what
the campaign continues as new with, whom a cancel tells, and when the next retry is due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from posttrain_common.campaigns.records import Outcome
from posttrain_common.campaigns.spec import parse_spec
from posttrain_common.contracts.campaigns import CampaignPlan, TaskPlan
from posttrain_common.contracts.jobs import RepoRef
from tests.campaigns.test_campaign_flow import SOLVES, scripted
from workflows.campaign.contract import (
    CampaignCarry,
    CampaignInput,
    CampaignPhase,
    Reopen,
    Retry,
    RetryRequest,
)
from workflows.campaign.rules import (
    invalid,
    next_run,
    next_start,
    rollout_input,
    seconds_to_next_retry,
    started,
    to_cancel,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = parse_spec(
    {
        "name": "rules",
        "tasks": ["t_a", "t_b"],
        "agents": [scripted("solver", SOLVES), scripted("other", SOLVES)],
        "epochs": 2,
        "concurrency": 3,
        "budget_usd": 100.0,
    }
)
PINNED = {t: RepoRef(repo_id=f"org/{t}", revision=c * 40) for t, c in (("t_a", "a"), ("t_b", "b"))}


def running() -> tuple[CampaignInput, CampaignCarry]:
    inp = CampaignInput(
        campaign_id="c1", spec=SPEC, agent_task_queue="aq", continue_as_new_events=40
    )
    plan = CampaignPlan(
        tasks={
            t: TaskPlan(task_id=t, budget_micro_usd=1_000_000, base_model=r)
            for t, r in PINNED.items()
        },
        worst_case_micro_usd={f"{t}/{a.name}": 1_000_000 for t in SPEC.tasks for a in SPEC.agents},
    )
    return inp, CampaignCarry(created_at=NOW, plan=plan, phase=CampaignPhase.running)


def start_next(inp: CampaignInput, s: CampaignCarry) -> None:
    start = next_start(inp, s, NOW)
    assert start is not None
    started(inp, s, start)


def test_a_rollout_starts_pinned_to_its_tasks_base_model_with_its_worst_case_reserved() -> None:
    inp, s = running()
    s.next_index = 2  # the third rollout in the campaign's order: epoch 1, t_b, solver
    start = next_start(inp, s, NOW)
    assert start is not None
    rollout = rollout_input(inp, s, start)
    assert rollout.rollout_id == "c1/t_b/solver/1" and rollout.attempt == 1
    assert rollout.campaign_workflow_id == "campaign/c1"
    assert (rollout.task_id, rollout.epoch, rollout.agent.name) == ("t_b", 1, "solver")
    assert rollout.base_model == PINNED["t_b"]
    assert rollout.reserved_micro_usd == 1_000_000
    assert rollout.agent_task_queue == "aq" and rollout.continue_as_new_events == 40
    assert rollout.carry is None


def test_the_next_run_carries_the_state_and_drops_what_the_first_run_did_once() -> None:
    inp, s = running()
    start_next(inp, s)
    first = inp.model_copy(
        update={"reopen": Reopen(created_at=NOW), "retry": RetryRequest(only="unscored")}
    )
    after = next_run(first, s)
    assert after.carry == s and list(s.in_flight) == ["c1/t_a/solver/1"]
    assert after.reopen is None and after.retry is None
    assert (after.campaign_id, after.spec, after.continue_as_new_events) == ("c1", SPEC, 40)


def test_a_cancel_tells_each_attempt_in_flight_once() -> None:
    inp, s = running()
    for _ in range(2):
        start_next(inp, s)
    told: set[str] = set()
    assert to_cancel(s, told) == ["rollout/c1/t_a/solver/1/a1", "rollout/c1/t_a/other/1/a1"]
    assert to_cancel(s, told) == []
    s.retries.append(Retry(index=2, attempt=2, not_before=NOW))
    start_next(inp, s)
    assert to_cancel(s, told) == ["rollout/c1/t_b/solver/1/a2"]


def test_the_next_retry_is_due_at_its_time_never_in_under_a_second() -> None:
    _, s = running()
    assert seconds_to_next_retry(s, NOW) is None
    s.retries = [
        Retry(index=1, attempt=2, not_before=NOW + timedelta(seconds=90)),
        Retry(index=0, attempt=3, not_before=NOW + timedelta(seconds=30)),
    ]
    assert seconds_to_next_retry(s, NOW) == 30.0
    assert seconds_to_next_retry(s, NOW + timedelta(seconds=29.5)) == 1.0
    assert seconds_to_next_retry(s, NOW + timedelta(minutes=5)) == 1.0


def test_an_invalid_campaign_ends_with_its_error_and_nothing_counted() -> None:
    _, s = running()
    invalid(s, "tasks: no task t_z", NOW)
    assert s.phase is CampaignPhase.invalid and s.phase.final
    assert s.error == "tasks: no task t_z" and s.finished_at == NOW
    assert sum(s.counts.values()) == 0 and s.counts[Outcome.scored] == 0
