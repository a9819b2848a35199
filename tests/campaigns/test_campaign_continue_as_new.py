"""A campaign, and its rollouts, continuing as new several times (a history limit lowered to
force it) end exactly as the same campaign without continue-as-new: every rollout started once
and recorded once, the counters and the in-flight set carried from run to run, the records the
same. Also with a `campaign retry` queued (waiting for the window) as the campaign continues.

The limit is computed from the events one step writes (an activity is 6: scheduled, started,
completed and the workflow task they wake; a child start 5; a signal 4):
- a rollout writes 21 events before its first turn (prepare 6, the episode's start 5, the
  conversation 6, its own start 4), then 12 to 23 a turn (the turn 6, `send_call` 6, and when
  the answer is not in yet a timer, the episode's signal and `collect_answer`, 11);
- a campaign writes about 19 before its first start (plan 6, agents 6, its start 4), then about
  13 a rollout (the child's start 5, its signal 4, its completion 4).
The check comes before every turn and after every round of starts, so every run makes progress
whatever the limit. At 30 a rollout's first run plays one turn (21 + 12 is past it) and each
later run two or three (3 + 2 x 12 is not), so a rollout of 6 turns continues as new two or
three times; the campaign's first run continues at its first finished rollout (19 + 3 starts
is about 30) and each later run after two or three, so 6 rollouts make it continue two or three
times.

The time-skipping test server stops skipping time when a child ends after its parent run
continued as new (temporalio/sdk-java#1540: the lock it takes for the parent is never
released). The harness releases those locks as they leak (tests/leaked_locks.py); before it
did, every timer after the first continue-as-new cost real seconds, which is why the jobs, the
watcher and the answer fallback are kept short here.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.campaigns.records import Outcome, RolloutRecord, summarize
from posttrain_common.contracts.jobs import JobRole
from tests.campaigns.harness import Campaigns, running_campaigns, runs_of
from tests.campaigns.test_campaign_flow import GRADER_FAILS, SOLVES
from workflows.campaign.contract import CampaignInput, CampaignPhase, RetryRequest
from workflows.campaign.rollout import TURN_HEARTBEAT
from workflows.campaign.rollout_contract import RolloutInput
from workflows.campaign.workflow import CampaignWorkflow
from workflows.ids import SIGNAL_ROLLOUT_FINISHED, campaign_workflow_id, rollout_workflow_id

LIMIT = 30
RETRY_LIMIT = 12  # a fresh run past it right after the update: it continues with the retry queued
TASK_INFOS = 2  # turns before the job: 2 task_info, jobs_submit, 2 jobs_wait, submit = 6 turns
SHORT = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.agent, queue_s=1, run_s=8),
        FakeJobScript(
            role=JobRole.grader,
            evaluated_script_contains="GRADER_FAILS",
            outcome="failed",
            queue_s=1,
            run_s=3,
        ),
        FakeJobScript(role=JobRole.grader, score=0.75, queue_s=1, run_s=3),
    ]
)
WATCH_S = 2.0  # the watcher looks at jobs this often (seconds)
HOLD_S = 90.0  # the solver's job in the queued-retry test: the window stays full this long
MIDWAY_STEP = timedelta(seconds=7.13)  # well inside HOLD_S, and not aligned with WATCH_S


def talkative(name: str, script: str, timeout_minutes: int = 5) -> dict[str, Any]:
    submit = {"script": script, "flavor": "cpu-basic", "timeout_minutes": timeout_minutes}
    calls: list[dict[str, Any]] = [{"tool": "task_info", "arguments": {}}] * TASK_INFOS
    calls += [
        {"tool": "jobs_submit", "arguments": submit},
        # Returns when the job starts running, then the wait until it ended: always two waits
        # (a lone wait would be one or two, as the job is seen queued or running by then).
        {"tool": "jobs_wait", "arguments": {"job_id": "$job", "timeout_s": 600}},
        {"wait": True},
        {"tool": "submit", "arguments": {"job_id": "$job"}},
    ]
    return {"name": name, "agent": "scripted", "args": {"calls": calls}}


HEARTBEATING = {"open_conversation", "agent_turn", "send_call", "collect_answer", "finish_attempt"}
SPEC = {
    "name": "can",
    "tasks": ["t_a"],
    "agents": [talkative("solver", SOLVES), talkative("graderfail", GRADER_FAILS)],
    "epochs": 3,
    "concurrency": 3,
    "budget_usd": 100.0,
}


async def run_inputs(client: Client, runs: list[WorkflowHistory], kind: type) -> list[Any]:
    """Each run's input, as the workflow got it (the carry of the run before)."""
    inputs = []
    for run in runs:
        payloads = run.events[0].workflow_execution_started_event_attributes.input.payloads
        (value,) = await client.data_converter.decode(payloads, [kind])
        inputs.append(value)
    return inputs


def events(run: WorkflowHistory, kind: int) -> list[Any]:
    return [e for e in run.events if e.event_type == kind]


def signals_received(run: WorkflowHistory) -> int:
    signalled = events(run, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    return sum(
        e.workflow_execution_signaled_event_attributes.signal_name == SIGNAL_ROLLOUT_FINISHED
        for e in signalled
    )


def comparable(record: RolloutRecord) -> tuple[Any, ...]:
    """What a record says about its rollout, without the ids and times of its campaign."""
    return (
        record.attempt,
        record.outcome,
        record.end_reason,
        record.reward,
        record.turns,
        record.steps_used,
        len(record.job_ids),
        record.service_spend.settled.usd,
        record.service_spend.final,
        record.llm,
        record.total_usd,
        record.error,
    )


def by_rollout(records: list[RolloutRecord]) -> dict[tuple[str, str, int], tuple[Any, ...]]:
    return {(r.task_id, r.agent.name, r.epoch): comparable(r) for r in records}


async def rollout_runs(c: Campaigns, records: list[RolloutRecord]) -> dict[str, int]:
    runs = {}
    for record in records:
        workflow_id = rollout_workflow_id(record.rollout_id, record.attempt)
        runs[record.rollout_id] = len(await runs_of(c.client, workflow_id))
    return runs


# Two campaigns: 15 s idle on 2 cores with the leaked locks released (about 3 minutes at load
# 15 before, when the second ran mostly in real time).
@pytest.mark.slow  # two campaigns of real agent turns (processes)
@pytest.mark.timeout(900)
async def test_a_campaign_continuing_as_new_records_every_rollout_once_as_without_it(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_campaigns(
        time_skipping_env,
        tmp_path,
        SHORT,
        tasks={"t_a": {}},
        deadline=timedelta(seconds=870),
        watch_interval_s=WATCH_S,
    ) as c:
        # The same campaign without continue-as-new first (time skipping still works).
        plain_id = await c.start(SPEC)
        plain = await c.run_until_final(plain_id)
        plain_jobs = len(c.backend.requests())
        campaign_id = await c.start(SPEC, continue_as_new_events=LIMIT, answer_poll_s=10.0)
        status = await c.run_until_final(campaign_id)
        records = c.records(campaign_id)
        plain_records = c.records(plain_id)
        campaign_runs = await runs_of(c.client, campaign_workflow_id(campaign_id))
        inputs = await run_inputs(c.client, campaign_runs, CampaignInput)
        per_rollout = await rollout_runs(c, records)
        plain_runs = await runs_of(c.client, campaign_workflow_id(plain_id))
        first = records[0]
        first_runs = await runs_of(c.client, rollout_workflow_id(first.rollout_id, 1))
        first_inputs = await run_inputs(c.client, first_runs, RolloutInput)
        requests = c.backend.requests()[plain_jobs:]

    # It did continue as new, several times, the campaign and every rollout.
    assert len(plain_runs) == 1
    # (How many campaign runs depends on how the rollouts' reports batch into workflow tasks:
    # 2 or 3 were seen for the same campaign; each later run starts from a carried input.)
    assert len(campaign_runs) >= 2, [len(r.events) for r in campaign_runs]
    assert min(per_rollout.values()) >= 2 and max(per_rollout.values()) >= 3, per_rollout

    # The same end as without it.
    assert status.phase is CampaignPhase.completed, status
    assert status.counts == plain.counts
    assert status.counts[Outcome.scored] == 3 and status.counts[Outcome.unscored] == 3
    assert status.finished == 6 and status.attempts == 6 and status.retried == 0
    assert status.in_flight == 0 and status.queued == 0 and status.not_run == 0
    assert status.mean_reward == plain.mean_reward == 0.75
    assert status.spent_usd == plain.spent_usd > 0
    assert status.base_models == plain.base_models
    # Every rollout recorded once, and its record the same as without continue-as-new.
    assert len(records) == 6 and len({r.key for r in records}) == 6
    assert by_rollout(records) == by_rollout(plain_records)
    assert summarize(records).counts == status.counts
    assert {r.turns for r in records} == {TASK_INFOS + 4}

    # No rollout started twice: one start per rollout over all the campaign's runs, none
    # refused as already started, and one agent job and one grading per rollout.
    started = [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for run in campaign_runs
        for e in events(run, EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED)
    ]
    assert Counter(started) == {rollout_workflow_id(r.rollout_id, 1): 1 for r in records}
    for run in campaign_runs:
        assert not events(run, EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED)
    for record in records:
        jobs = [r for r in requests if r.key.startswith(f"episode-{record.episode_id}/")]
        assert Counter(r.role for r in jobs) == {JobRole.agent: 1, JobRole.grader: 1}
    assert len(requests) == 12 and len({r.key for r in requests}) == 12

    # The counters and the in-flight set carried: each run starts with every report the runs
    # before it received counted once, and the rollouts in flight still in flight.
    assert inputs[0].carry is None
    reported = 0
    carried_in_flight: set[str] = set()
    for before, carried in zip(campaign_runs, inputs[1:], strict=False):
        reported += signals_received(before)
        s = carried.carry
        assert s is not None and s.phase is CampaignPhase.running and s.plan is not None
        assert sum(s.counts.values()) == reported
        assert s.attempts == s.next_index == reported + len(s.in_flight)
        carried_in_flight |= set(s.in_flight)
    assert carried_in_flight, "no run continued with a rollout in flight"
    assert carried_in_flight <= {r.rollout_id for r in records}
    assert reported + signals_received(campaign_runs[-1]) == 6

    # A rollout's runs carry its conversation and its turns: each run goes on from the last.
    assert first_inputs[0].carry is None
    turns = [i.carry.turns for i in first_inputs[1:]]
    assert turns == sorted(turns) and 0 < turns[0] and turns[-1] < first.turns
    assert len({i.carry.episode_id for i in first_inputs[1:]}) == 1

    # Every activity of the rollout but the episode's preparation heartbeats, so a worker killed
    # mid-activity is noticed within seconds (tests/campaigns/test_rollout_heartbeats.py).
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for run in first_runs
        for e in events(run, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    ]
    beating = {a.activity_type.name: a.heartbeat_timeout.ToTimedelta() for a in scheduled}
    assert set(beating) == {*HEARTBEATING, "prepare_episode"}, beating
    assert all(timedelta(0) < beating[name] <= TURN_HEARTBEAT for name in HEARTBEATING)


@pytest.mark.slow  # a campaign of real agent turns (processes)
@pytest.mark.timeout(600)
async def test_a_retry_queued_behind_a_full_window_survives_the_campaign_continuing_as_new(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    # One rollout at a time: the grader-failing one ends unscored, the solver's starts, and
    # the retry asked for then waits for the window in the campaign's queue while the campaign
    # continues as new (past RETRY_LIMIT at once); it starts in a later run, once.
    # The solver's job runs HOLD_S, and time is skipped in steps of MIDWAY_STEP until the
    # retry is asked for: with the short jobs and 31 s steps the whole solver rollout could
    # end inside one step, the state the retry needs stepped over, and the test spin until its
    # deadline (as it did once under load).
    held = FakeJobScript(role=JobRole.agent, script_contains="SOLVES", queue_s=1, run_s=HOLD_S)
    spec = SPEC | {
        "agents": [talkative("graderfail", GRADER_FAILS), talkative("solver", SOLVES)],
        "epochs": 1,
        "concurrency": 1,
    }
    async with running_campaigns(
        time_skipping_env,
        tmp_path,
        FakeScenario(jobs=[held, *SHORT.jobs]),
        tasks={"t_a": {}},
        deadline=timedelta(seconds=570),
        watch_interval_s=WATCH_S,
    ) as c:
        campaign_id = await c.start(spec, continue_as_new_events=RETRY_LIMIT, answer_poll_s=10.0)
        midway = await c.skip_until(
            campaign_id,
            lambda s: s.counts[Outcome.unscored] == 1 and s.in_flight == 1,
            step=MIDWAY_STEP,
        )
        c.backend.scenario = FakeScenario(jobs=[held, SHORT.jobs[0], SHORT.jobs[2]])  # mended
        answer = await c.handle(campaign_id).execute_update(
            CampaignWorkflow.retry, RetryRequest(only="unscored")
        )
        status = await c.run_until_final(campaign_id)
        records = c.records(campaign_id)
        campaign_runs = await runs_of(c.client, campaign_workflow_id(campaign_id))
        inputs = await run_inputs(c.client, campaign_runs, CampaignInput)

    solver, retried = f"{campaign_id}/t_a/solver/1", f"{campaign_id}/t_a/graderfail/1"
    assert midway.in_flight_ids == [solver], midway
    assert answer.queued == 1 and answer.rollout_ids == [retried]
    # The retry was carried: a run started with it waiting, and the solver still in flight.
    waiting = [i.carry for i in inputs[1:] if i.carry.retries]
    assert waiting, [len(r.events) for r in campaign_runs]
    for carry in waiting:
        assert [(r.index, r.attempt, r.replaces) for r in carry.retries] == [
            (0, 2, Outcome.unscored)
        ]
        assert list(carry.in_flight) == [solver] and carry.last_retry == answer
    # It ran once, as attempt 2, and decides its rollout; nothing ran twice.
    assert status.phase is CampaignPhase.completed, status
    assert status.attempts == 3 and status.retried == 1 and status.finished == 2
    assert status.counts[Outcome.scored] == 2 and status.counts[Outcome.unscored] == 0
    assert Counter((r.rollout_id, r.attempt) for r in records) == {
        (retried, 1): 1,
        (solver, 1): 1,
        (retried, 2): 1,
    }
    (again,) = [r for r in records if r.attempt == 2]
    assert again.outcome is Outcome.scored and again.reward == 0.75
    assert status.last_retry == answer
