"""One rollout for any trainer: `rollout(env, policy, task) -> (reward | None, cost, transcript)`.

    async with PostTrainEnv(base_url=URL, message_timeout_s=3600) as env:
        reward, cost, transcript = await rollout(env, policy, "t0_artifact")

`policy` is an agent (`posttrain_env.agents.conversation.Agent`: `await policy.act(conversation)`
answers the next turn), played by `posttrain_env.agents.play`. The rollout always ends its
episode: when the policy stops, or runs out of turns, before the episode is over, the episode is
ended as `abandoned` (reward 0, as the service scores an agent that gives up; its jobs cancelled),
so nothing is left billing. The reward is the episode's: None when it ended unscored (the grader
failed) or when it is not a measurement (`replay_miss`: the replay backend had no recording of
an evaluation the policy asked for; logged as a warning, `transcript.outcome.not_a_measurement`),
never replaced by 0 here. The cost is in `cost_unit` (settled USD by default); a rollout
whose spend is not final (a cancellation never confirmed, or an episode lost to the transport)
keeps the spend known so far, flagged in `transcript.outcome` (`orphan`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

from posttrain_env.agents.conversation import Agent, Conversation
from posttrain_env.agents.play import Finish, play
from posttrain_env.client import PostTrainEnv
from posttrain_env.training.outcome import RolloutOutcome
from posttrain_env.training.sampler import CostUnit, cost_of

DEFAULT_MAX_TURNS = 100


class Transcript(BaseModel):
    """What the rollout did: the conversation, how the play stopped, and the outcome."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    conversation: Conversation | None  # None when the reset itself failed
    # How the play stopped (play's `finish`), or "lost" when the transport failed mid-episode.
    finish: Finish | str
    outcome: RolloutOutcome
    # Set when the transport failed: what the client raised.
    error: str | None = None


class Rollout(NamedTuple):
    reward: float | None
    cost: float
    transcript: Transcript


async def rollout(
    env: PostTrainEnv,
    policy: Agent,
    task_id: str,
    *,
    cost_unit: CostUnit | Callable[[RolloutOutcome], float] = "usd",
    max_turns: int = DEFAULT_MAX_TURNS,
) -> Rollout:
    """Play one episode of `task_id` on `env` (connected, async) with `policy`, and end it.

    Raises what the policy raises (AgentError) and PlayError for an answer no play can go on
    from; a transport failure (ConnectionError, TimeoutError) does not raise: the rollout is
    then an orphan with reward None and the spend last known."""
    started = time.monotonic()
    try:
        played = await play(env, policy, task_id, max_turns=max_turns)
    except (ConnectionError, TimeoutError) as exc:
        outcome = await _lost(env, task_id, time.monotonic() - started)
        transcript = Transcript(conversation=None, finish="lost", outcome=outcome, error=repr(exc))
        return Rollout(outcome.reward, cost_of(outcome, cost_unit), transcript)
    if played.ended:
        answer: dict[str, Any] = {
            "service_spend": played.spend.model_dump(mode="json"),
            "episode_end": played.end.view() if played.end is not None else None,
        }
    else:  # the policy stopped first: end it, so nothing is left billing
        answer = await env.end_episode()
    latency_s = time.monotonic() - started
    # The policy's turns are part of a rollout here: its service time is its whole time.
    outcome = RolloutOutcome.from_answer(
        task_id, answer, episode_id=played.episode_id, latency_s=latency_s, service_s=latency_s
    )
    transcript = Transcript(conversation=played.conversation, finish=played.finish, outcome=outcome)
    return Rollout(outcome.reward, cost_of(outcome, cost_unit), transcript)


async def _lost(env: PostTrainEnv, task_id: str, latency_s: float) -> RolloutOutcome:
    """The outcome of a rollout whose transport failed: the episode is ended if it can still be
    reached (its spend then known), else an orphan with no spend known."""
    try:
        answer = await env.end_episode()
    except (ConnectionError, TimeoutError, OSError, RuntimeError):
        return RolloutOutcome(
            task_id=task_id, episode_id=env.episode_id, reward=None, latency_s=latency_s
        )
    outcome = RolloutOutcome.from_answer(
        task_id, answer, episode_id=env.episode_id, latency_s=latency_s
    )
    # The play never saw the end: whatever the end says, this rollout's reward is unknown to
    # the trainer, and counted as unscored.
    return outcome.model_copy(update={"reward": None})
