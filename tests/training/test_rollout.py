"""The generic rollout against the real gateway (fake backend): a scored, an unscored, a
budget-exhausted and an orphaned rollout, each with its reward (None kept), its cost and its
transcript, and always an episode that is over afterwards."""

from __future__ import annotations

from typing import Any

from posttrain_env import PostTrainEnv
from posttrain_env.agents.scripted import ScriptedAgent
from posttrain_env.models import EndReason
from posttrain_env.training.rollout import rollout
from posttrain_env.training.sampler import SamplerBridge
from tests.gateway.server import ServerProcess
from tests.training.scenario import (
    GRADER_FAILS,
    HOLD_CANCEL,
    ONE_MINUTE_USD,
    SCORE_HIGH,
    SCORE_LOW,
    SHORT,
    TASK,
    TIGHT,
    episode,
    submit,
)


async def play(server: ServerProcess, calls: list[dict[str, Any]], task: str = TASK, **kw: Any):
    async with PostTrainEnv(base_url=server.base_url, message_timeout_s=600) as env:
        return await rollout(env, ScriptedAgent(calls), task, **kw)


async def test_a_scored_rollout_answers_its_reward_and_its_settled_cost(
    server: ServerProcess,
) -> None:
    reward, cost, transcript = await play(server, episode(SCORE_HIGH))
    assert reward == 0.75
    assert cost == ONE_MINUTE_USD  # the agent job's minute; the grader is not charged
    outcome = transcript.outcome
    assert outcome.end is not None and outcome.end.reason is EndReason.submitted
    assert outcome.spend.final and not outcome.orphan and outcome.scored
    assert transcript.finish == "episode_over" and transcript.conversation is not None
    assert [m.tool for m in transcript.conversation.answers()] == [
        "jobs_submit",
        "jobs_wait",
        "submit",
    ]


async def test_an_unscored_rollout_keeps_its_reward_none_and_its_cost(
    server: ServerProcess,
) -> None:
    reward, cost, transcript = await play(server, episode(GRADER_FAILS))
    assert reward is None  # never 0
    assert cost == ONE_MINUTE_USD
    outcome = transcript.outcome
    assert outcome.end is not None and outcome.end.reason is EndReason.score_failed
    assert outcome.unscored_reason is EndReason.score_failed and not outcome.orphan


async def test_a_budget_exhausted_rollout_is_ended_as_abandoned_with_reward_0_and_its_cost(
    server: ServerProcess,
) -> None:
    # $0.003 of budget: a 10-minute cpu-basic job ($0.00167 reserved) runs and settles one
    # minute; a 20-minute one ($0.00334 reserved) no longer fits.
    calls = [submit(SCORE_HIGH), {"wait": True}, submit(SCORE_HIGH, timeout_minutes=20)]
    reward, cost, transcript = await play(server, calls, TIGHT)
    assert transcript.conversation is not None
    refusals = [
        m.data["error"]["type"]
        for m in transcript.conversation.answers()
        if m.data and "error" in m.data
    ]
    assert refusals == ["budget_exhausted"]
    # The policy stopped with the episode live: the rollout ended it (nothing left billing).
    assert transcript.finish == "agent_stopped"
    assert reward == 0.0 and transcript.outcome.scored
    assert transcript.outcome.end is not None
    assert transcript.outcome.end.reason is EndReason.abandoned
    assert cost == ONE_MINUTE_USD and transcript.outcome.spend.final
    assert transcript.outcome.spend.reserved.usd == 0.0


async def test_an_orphaned_rollout_keeps_spend_final_false_and_is_flagged(
    server: ServerProcess,
) -> None:
    # Two steps: the second ends the episode (max_steps), whose job's cancellation is never
    # confirmed: the job may still bill, so the spend is not final.
    calls = [submit(HOLD_CANCEL), {"tool": "jobs_status", "arguments": {"job_id": "$job"}}]
    reward, cost, transcript = await play(server, calls, SHORT)
    outcome = transcript.outcome
    assert outcome.end is not None and outcome.end.reason is EndReason.max_steps
    assert reward == 0.0
    assert outcome.spend.final is False and outcome.orphan
    assert outcome.spend.reserved.usd > 0  # the reservation stands until it settles
    assert cost == outcome.spend.settled.usd


async def test_rollouts_reach_the_sampler_with_none_kept_and_one_cost_each(
    server: ServerProcess,
) -> None:
    seen: list[tuple[Any, list[float | None], list[float] | None]] = []

    class Recorder:
        def update(self, task: Any, rewards: Any, costs: Any = None) -> None:
            seen.append((task, list(rewards), list(costs)))

    bridge = SamplerBridge(Recorder(), cost_unit="jobs")
    outcomes = []
    for script in (SCORE_HIGH, GRADER_FAILS, SCORE_LOW):
        _, cost, transcript = await play(server, episode(script), cost_unit="jobs")
        assert cost == 1.0  # one agent job each
        outcomes.append(transcript.outcome)
    bridge.update(outcomes)
    assert seen == [(TASK, [0.75, None, 0.25], [1.0, 1.0, 1.0])]
    assert bridge.totals.unscored == 1 and bridge.totals.usd == 3 * ONE_MINUTE_USD


async def test_a_replayed_rollout_is_flagged_and_charged_what_its_recording_cost(
    server: ServerProcess,
) -> None:
    # The first run of the script falls through to the fake backend and is recorded (unless an
    # earlier test recorded it); the second is replayed.
    await play(server, episode(SCORE_LOW))
    reward, cost, transcript = await play(server, episode(SCORE_LOW))
    assert reward == 0.25 and cost == ONE_MINUTE_USD
    outcome = transcript.outcome
    assert outcome.replayed
    assert outcome.spend.replayed is not None and outcome.spend.replayed.jobs == 1
    assert outcome.end is not None and outcome.end.replayed is True
