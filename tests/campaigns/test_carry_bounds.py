"""Every continue-as-new carry of a campaign bounded by size (issue 27): the campaign's and the
rollout's, each filled to its caps with its largest fields and measured as the data converter
encodes it (`pydantic_core.to_json`) against CARRY_BUDGET_BYTES; what happens at each cap; and
carries of runs from before these caps still decode and mean what they meant."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pydantic_core
import pytest

from activities.campaigns.activities import worst_cases
from posttrain_common.campaigns.records import Outcome, RecordError
from posttrain_common.campaigns.retry import RetryPick
from posttrain_common.campaigns.spec import CampaignSpec, SpecError, parse_spec
from posttrain_common.contracts.campaigns import CampaignPlan, TaskPlan
from posttrain_common.contracts.episode_calls import EpisodeClosed
from posttrain_common.contracts.jobs import RepoRef
from posttrain_env.agents.conversation import Usage
from posttrain_env.limits import (
    CARRY_BUDGET_BYTES,
    MAX_AGENT_ARGS_BYTES,
    MAX_CAMPAIGN_AGENTS,
    MAX_CAMPAIGN_ROLLOUTS,
    MAX_CAMPAIGN_SPEC_BYTES,
    MAX_CAMPAIGN_TASK_ID_CHARS,
    MAX_CAMPAIGN_TASKS,
    MAX_CONCURRENCY,
    MAX_ERROR_DETAIL_CHARS,
    MAX_JOB_ID_CHARS,
    MAX_JOBS_PER_EPISODE,
    MAX_MESSAGE_CHARS,
    MAX_QUEUED_RETRIES,
    MAX_REPO_ID_CHARS,
    MAX_STATUS_ROLLOUTS_LISTED,
)
from posttrain_env.models import (
    ContaminationSummary,
    EndReason,
    EpisodeEnd,
    ServiceSpend,
)
from tasks.registry import load_task
from tests.campaigns.test_campaign_flow import SOLVES, scripted
from workflows.campaign.contract import (
    BudgetStop,
    CampaignCarry,
    CampaignInput,
    CampaignPhase,
    InFlight,
    Reopen,
    Retry,
    RetryAnswer,
    RetryRequest,
)
from workflows.campaign.retries import queue_retries
from workflows.campaign.rollout_contract import RolloutCarry, RolloutInput, RolloutResult
from workflows.campaign.rules import (
    finished,
    invalid,
    max_worst_case,
    next_start,
    slot,
    started,
    worst_case,
)

NOW = datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
CONTROL = "\x01"  # six bytes as JSON: the costliest character
CAMPAIGN_ID = "c" * 64  # CAMPAIGN_ID allows 64 characters


def encoded(value: Any) -> int:
    return len(pydantic_core.to_json(value))


def largest_spec() -> CampaignSpec:
    """As many tasks and agents as a spec may name, with the longest ids and names, the agents'
    arguments filling what is left of MAX_CAMPAIGN_SPEC_BYTES: accepted by `parse_spec`."""
    tasks = [f"t{n:02d}".ljust(MAX_CAMPAIGN_TASK_ID_CHARS, "x") for n in range(MAX_CAMPAIGN_TASKS)]
    agents = [
        {**scripted(f"a{n:02d}".ljust(40, "x"), SOLVES), "api_key_env": "K" * 100}
        for n in range(MAX_CAMPAIGN_AGENTS)
    ]
    data = {"name": "n" * 40, "tasks": tasks, "agents": agents, "budget_usd": 1e9}
    data["concurrency"] = MAX_CONCURRENCY
    data["epochs"] = MAX_CAMPAIGN_ROLLOUTS // (MAX_CAMPAIGN_TASKS * MAX_CAMPAIGN_AGENTS)
    room = MAX_CAMPAIGN_SPEC_BYTES - len(parse_spec(data).model_dump_json())
    share = room // MAX_CAMPAIGN_AGENTS - len('"pad":"",')
    for agent in agents:
        agent["args"] = {**agent["args"], "pad": "p" * share}
    spec = parse_spec(data)
    assert MAX_CAMPAIGN_SPEC_BYTES - 2 * MAX_CAMPAIGN_AGENTS < encoded(spec)
    assert encoded(spec) <= MAX_CAMPAIGN_SPEC_BYTES
    return spec


def longest_rollout_id(n: int) -> str:
    """A rollout id as long as one may be (the highest epoch has the most digits)."""
    task, agent = "t".ljust(MAX_CAMPAIGN_TASK_ID_CHARS, "x"), "a".ljust(40, "x")
    return f"{CAMPAIGN_ID}/{task}/{agent}/{MAX_CAMPAIGN_ROLLOUTS - n}"


def largest_campaign() -> CampaignInput:
    """The campaign's continue-as-new input with every part of its carry at its cap."""
    spec = largest_spec()
    plan = CampaignPlan(
        tasks={
            task_id: TaskPlan(
                task_id=task_id,
                budget_micro_usd=10**15,
                base_model=RepoRef(repo_id="o" * MAX_REPO_ID_CHARS, revision="a" * 40),
            )
            for task_id in spec.tasks
        }
    )
    carry = CampaignCarry(
        phase=CampaignPhase.running,
        created_at=NOW,
        plan=plan,
        next_index=MAX_CAMPAIGN_ROLLOUTS,
        counts={o: MAX_CAMPAIGN_ROLLOUTS for o in Outcome},
        attempts=10**9,
        retried=10**9,
        reward_sum=1e300,
        reward_n=10**9,
        env_micro_usd=10**18,
        llm_micro_usd=10**18,
        budget_stop=BudgetStop(rollout_id=longest_rollout_id(0), needed_usd=1e300, left_usd=1e300),
        cancel_requested=True,
        finished_at=NOW,
        last_retry=RetryAnswer(
            only="unscored",
            queued=10**9,
            rollout_ids=[longest_rollout_id(n) for n in range(MAX_STATUS_ROLLOUTS_LISTED)],
            more=True,
        ),
    )
    invalid(carry, CONTROL * 1_000_000, NOW)  # the error text, cut where it is set
    for n in range(MAX_CONCURRENCY):  # the in-flight set: at most `concurrency` attempts
        carry.in_flight[longest_rollout_id(n)] = InFlight(
            index=MAX_CAMPAIGN_ROLLOUTS - 1 - n, attempt=10, reserved_micro_usd=10**15
        )
    carry.retries = [
        Retry(
            index=MAX_CAMPAIGN_ROLLOUTS - 1 - n,
            attempt=10,
            not_before=NOW,
            replaces=Outcome.unscored,
        )
        for n in range(MAX_QUEUED_RETRIES)
    ]
    return CampaignInput(
        campaign_id=CAMPAIGN_ID,
        spec=spec,
        agent_task_queue="q" * 200,
        continue_as_new_events=10**9,
        answer_poll_s=1e300,
        carry=carry,
        reopen=Reopen(created_at=NOW, budget_stop=carry.budget_stop),
        retry=RetryRequest(only="unscored"),
    )


def test_the_campaigns_carry_at_its_caps_stays_within_the_budget() -> None:
    inp = largest_campaign()
    assert inp.carry is not None and inp.carry.error is not None
    assert len(inp.carry.error) == MAX_MESSAGE_CHARS
    size = encoded(inp)
    parts = {
        "spec": encoded(inp.spec),
        "in_flight": encoded(inp.carry.in_flight),
        "retries": encoded(inp.carry.retries),
        "plan": encoded(inp.carry.plan),
    }
    print(f"campaign continue-as-new input at its caps: {size} bytes; {parts}")
    assert size <= CARRY_BUDGET_BYTES


def test_the_rollouts_carry_at_its_caps_stays_within_the_budget() -> None:
    spec = largest_spec()
    agent = spec.agents[0].model_copy(
        update={"args": {"pad": CONTROL * (MAX_AGENT_ARGS_BYTES // 6 - 10)}}
    )
    assert len(pydantic_core.to_json(agent.args)) <= MAX_AGENT_ARGS_BYTES
    carry = RolloutCarry(
        started_at=NOW,
        episode_id="ep-" + "0" * 16,
        conversation="f" * 64,  # a sha256 digest: the stored conversation's head
        turns=10**9,
        usage=Usage(prompt_tokens=10**18, completion_tokens=10**18, requests=10**18),
        llm_micro_usd=10**18,
        play_end="cancelled",
        error=RecordError(type=CONTROL * 1_000_000, message=CONTROL * 1_000_000),
        cancel_requested=True,
        waiting=CONTROL * 1_000_000,
        closed=EpisodeClosed(
            episode_id="ep-" + "0" * 16,
            end=EpisodeEnd(
                reason=EndReason.cancelled_by_operator,
                reward=1.0,
                invalid_score=CONTROL * 1_000_000,
                contamination=ContaminationSummary(
                    checked=True, flagged=True, matched_items=10**9, skipped=CONTROL * 300
                ),
            ),
            service_spend=ServiceSpend(),
            # At most every job of the episode is still unconfirmed.
            unconfirmed=["j" * MAX_JOB_ID_CHARS] * MAX_JOBS_PER_EPISODE,
        ),
    )
    assert carry.error is not None and len(carry.error.message) == MAX_MESSAGE_CHARS
    assert len(carry.error.type) == MAX_ERROR_DETAIL_CHARS
    assert carry.waiting is not None and len(carry.waiting) == MAX_MESSAGE_CHARS
    inp = RolloutInput(
        campaign_id=CAMPAIGN_ID,
        campaign_workflow_id="campaign-" + CAMPAIGN_ID,
        rollout_id=longest_rollout_id(0),
        attempt=10**9,
        task_id="t" * MAX_CAMPAIGN_TASK_ID_CHARS,
        epoch=MAX_CAMPAIGN_ROLLOUTS,
        agent=agent,
        base_model=RepoRef(repo_id="o" * MAX_REPO_ID_CHARS, revision="a" * 40),
        reserved_micro_usd=10**18,
        agent_task_queue="q" * 200,
        continue_as_new_events=10**9,
        answer_poll_s=1e300,
        carry=carry,
    )
    size = encoded(inp)
    print(f"rollout continue-as-new input at its caps: {size} bytes")
    assert size <= CARRY_BUDGET_BYTES
    result = RolloutResult(
        rollout_id=inp.rollout_id, attempt=1, outcome=Outcome.error, error=carry.error
    )
    # What it reports to its campaign: the cut error (six bytes a character at worst) and ids.
    assert encoded(result) < 6 * (MAX_MESSAGE_CHARS + MAX_ERROR_DETAIL_CHARS) + 1024


# -- at the caps ---------------------------------------------------------------------------------


def small_campaign(retry_backoff_s: float = 3600.0) -> tuple[CampaignInput, CampaignCarry]:
    spec = parse_spec(
        {
            "name": "caps",
            "tasks": ["t_a"],
            "agents": [scripted("solver", SOLVES)],
            "epochs": 3 * MAX_QUEUED_RETRIES,
            "concurrency": MAX_CONCURRENCY,
            "budget_usd": 1e9,
            "retry": {"backoff_s": retry_backoff_s},
        }
    )
    plan = CampaignPlan(
        tasks={
            "t_a": TaskPlan(
                task_id="t_a",
                budget_micro_usd=1,
                base_model=RepoRef(repo_id="o/m", revision="a" * 40),
            )
        }
    )
    inp = CampaignInput(campaign_id="c1", spec=spec)
    return inp, CampaignCarry(created_at=NOW, plan=plan, phase=CampaignPhase.running)


def test_an_error_at_the_retry_queues_cap_is_counted_not_retried() -> None:
    inp, s = small_campaign()
    for _ in range(MAX_QUEUED_RETRIES + 5):
        start = next_start(inp, s, NOW)
        assert start is not None
        started(inp, s, start)
        rollout_id = start.slot.rollout_id(inp.campaign_id)
        error = RolloutResult(rollout_id=rollout_id, attempt=1, outcome=Outcome.error)
        assert finished(inp, s, error, NOW, MAX_QUEUED_RETRIES)
    assert len(s.retries) == MAX_QUEUED_RETRIES
    assert s.counts[Outcome.error] == 5  # past the cap: decided as errors, retried on request
    # Runs recorded before the cap (no cap passed) retried every one, and replay so.
    old_inp, old = small_campaign()
    for _ in range(MAX_QUEUED_RETRIES + 5):
        start = next_start(old_inp, old, NOW)
        assert start is not None
        started(old_inp, old, start)
        rollout_id = start.slot.rollout_id(old_inp.campaign_id)
        finished(
            old_inp,
            old,
            RolloutResult(rollout_id=rollout_id, attempt=1, outcome=Outcome.error),
            NOW,
        )
    assert len(old.retries) == MAX_QUEUED_RETRIES + 5


def test_campaign_retry_queues_up_to_the_cap_and_says_there_is_more() -> None:
    inp, s = small_campaign()
    s.next_index = inp.spec.rollouts
    picks = [
        RetryPick(index=n, attempt=2, replaces=Outcome.unscored)
        for n in range(MAX_QUEUED_RETRIES + 50)
    ]
    s.retries = [Retry(index=inp.spec.rollouts - 1, attempt=2, not_before=NOW)]
    answer = queue_retries(
        inp, s, RetryRequest(only="unscored"), picks, NOW, more=False, queue_cap=MAX_QUEUED_RETRIES
    )
    assert len(s.retries) == MAX_QUEUED_RETRIES and answer.queued == MAX_QUEUED_RETRIES - 1
    assert answer.more is True
    again = queue_retries(
        inp, s, RetryRequest(only="unscored"), picks, NOW, more=False, queue_cap=MAX_QUEUED_RETRIES
    )
    assert again.queued == 0 and again.more is True and len(s.retries) == MAX_QUEUED_RETRIES


def test_a_spec_that_would_make_the_carry_grow_is_refused_where_it_is_read() -> None:
    base = {"tasks": ["t_a"], "agents": [scripted("solver", SOLVES)], "budget_usd": 1.0}
    with pytest.raises(SpecError, match=f"longer than {MAX_CAMPAIGN_TASK_ID_CHARS}"):
        parse_spec({**base, "tasks": ["t" * (MAX_CAMPAIGN_TASK_ID_CHARS + 1)]})
    agents = [
        {**scripted(f"a{n}", SOLVES), "args": {"pad": "p" * (MAX_AGENT_ARGS_BYTES - 100)}}
        for n in range(MAX_CAMPAIGN_SPEC_BYTES // MAX_AGENT_ARGS_BYTES + 1)
    ]
    with pytest.raises(SpecError, match=f"at most {MAX_CAMPAIGN_SPEC_BYTES}"):
        parse_spec({**base, "agents": agents})
    # The model alone still takes them: carries of campaigns started before the limits decode.
    CampaignSpec.model_validate({**base, "agents": agents})


# -- carries from before the caps ----------------------------------------------------------------


def test_a_plan_listing_worst_cases_by_cell_decodes_and_is_used_as_it_was() -> None:
    inp, s = small_campaign()
    assert s.plan is not None
    recorded = {**s.plan.model_dump(mode="json"), "worst_case_micro_usd": {"t_a/solver": 77}}
    old = CampaignPlan.model_validate(recorded)
    first = slot(inp.spec, 0)
    assert worst_case(old, first) == 77 and max_worst_case(inp.spec, old) == 77


def test_a_derived_worst_case_is_what_planning_listed() -> None:
    spec = parse_spec(
        {
            "tasks": ["t0_artifact"],
            "agents": [
                {**scripted("cheap", SOLVES), "llm_cap_usd": 0.0},
                {**scripted("dear", SOLVES), "llm_cap_usd": 2.5},
            ],
            "budget_usd": 100.0,
        }
    )
    task = load_task("t0_artifact")
    listed = worst_cases(spec, {task.id: task})
    plan = CampaignPlan(
        tasks={
            task.id: TaskPlan(
                task_id=task.id,
                budget_micro_usd=task.budget_micro_usd,
                base_model=RepoRef(repo_id="o/m", revision="a" * 40),
            )
        }
    )
    for index in range(spec.rollouts):
        cell = slot(spec, index)
        assert worst_case(plan, cell) == listed[cell.cell]
    assert max_worst_case(spec, plan) == max(listed.values())


def test_a_rollout_carry_of_an_earlier_run_decodes_with_its_texts_cut() -> None:
    recorded = {
        "started_at": NOW.isoformat(),
        "error": {"type": "x" * 5000, "message": "m" * 50_000},
        "waiting": "w" * 50_000,
    }
    carry = RolloutCarry.model_validate(recorded)
    assert carry.error is not None and len(carry.error.message) == MAX_MESSAGE_CHARS
    assert carry.waiting is not None and len(carry.waiting) == MAX_MESSAGE_CHARS
    assert carry.started_at == NOW
