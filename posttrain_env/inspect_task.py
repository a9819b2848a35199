"""posttrain_env as an Inspect task: each sample is one episode, played by the model under
evaluation through the episode's MCP tools (`pip install 'posttrain-env[inspect]'`).

    inspect eval posttrain_env/posttrain --model <provider/model> \\
        -T task_id=t0_artifact -T server=http://127.0.0.1:8000

(or `inspect eval posttrain_env/inspect_task.py@posttrain` from a checkout). Per sample:

- setup: `POST /episodes` starts an episode; the model gets the task's prompt and limits, and
  the episode's tools over its MCP endpoint;
- the agent: the model calls tools until the episode is over (its `submit`, `max_steps` or the
  time limit), with a nudge when it answers without a tool call (`max_nudges` in a row end it);
- the scorer reads `GET /episodes/<id>`: the reward as the score (in [0, 1]), unscored when the
  episode has no reward (the grader failed, or an operator cancelled it), 0 when the model
  stopped before the end (the episode is then ended as `abandoned`, reward 0, so nothing keeps
  running); the end reason,
  `service_spend` and steps in the score's metadata;
- cleanup, whatever happened (a failed sample too): `DELETE /episodes/<id>` ends an episode that
  is still running, cancelling its jobs, so none keeps billing until the time limit.

Secrets stay out of Inspect's log: a server with API keys gets one from the environment variable
`api_key_env` names (default `ENV_SERVER_API_KEY`; never a task argument, which the log keeps),
and each episode's token lives only in this process's memory, never in the sample's state.
Scoring needs that token, so a log cannot be re-scored later (`inspect score`).

This module imports only Inspect, httpx and the standard library.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import httpx
from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ChatMessageSystem, ChatMessageUser
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import mcp_server_http, mcp_tools

EPISODE_KEY = "posttrain_episode_id"  # in the sample's metadata (an id, not a secret)
SYSTEM = (
    "You are an agent in posttrain_env: you post-train a language model with training jobs you "
    "start through the tools you have. Every tool call is a step of the episode. Start jobs, "
    "wait for them, read their logs, check a finished job with dev_evaluate, and call submit on "
    "your best job: its score on a hidden split is your reward, and the episode ends. The "
    "episode also ends at its step or time limit, with reward 0. Each tool result ends with the "
    'episode\'s progress, {"episode": {"steps_left", "time_left_s", "done"}}.'
)
NUDGE = (
    "Call a tool to go on. The episode ends only when you call submit on a succeeded job, or at "
    "its step or time limit."
)
HTTP_TIMEOUT = httpx.Timeout(30, read=120)  # DELETE waits up to 30 s for cancellations


@dataclass(frozen=True)
class Episode:
    episode_id: str
    mcp_url: str
    token: str  # the capability: kept in memory only


class EpisodeServer:
    """The server's episode routes, and the tokens of this process's episodes."""

    def __init__(self, server: str, api_key_env: str) -> None:
        self._base = server.rstrip("/")
        self._api_key_env = api_key_env
        self._episodes: dict[str, Episode] = {}

    async def start(self, task_id: str) -> tuple[Episode, dict[str, Any]]:
        """`POST /episodes`: the episode, and the server's answer without its token."""
        key = os.environ.get(self._api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as http:
            response = await http.post(
                f"{self._base}/episodes", json={"task_id": task_id}, headers=headers
            )
        if response.status_code != 200:
            raise RuntimeError(f"POST /episodes answered {response.status_code}: {response.text}")
        answer = response.json()
        episode = Episode(answer["episode_id"], answer["mcp_url"], answer.pop("episode_token"))
        self._episodes[episode.episode_id] = episode
        return episode, answer

    def of(self, state: TaskState) -> Episode | None:
        return self._episodes.get(state.metadata.get(EPISODE_KEY, ""))

    async def read(self, episode: Episode) -> dict[str, Any]:
        """`GET /episodes/<id>`."""
        return await self._call("GET", episode)

    async def end(self, episode: Episode) -> dict[str, Any]:
        """`DELETE /episodes/<id>`: ends it as abandoned (reward 0) unless it is over already."""
        return await self._call("DELETE", episode)

    def forget(self, episode: Episode) -> None:
        self._episodes.pop(episode.episode_id, None)

    async def _call(self, method: str, episode: Episode) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as http:
            response = await http.request(
                method,
                f"{self._base}/episodes/{episode.episode_id}",
                headers={"Authorization": f"Bearer {episode.token}"},
            )
        if response.status_code not in (200, 202):
            raise RuntimeError(
                f"{method} /episodes/{episode.episode_id} answered {response.status_code}: "
                f"{response.text}"
            )
        return response.json()


@solver
def start_episode(episodes: EpisodeServer, task_id: str) -> Solver:
    """Setup: start the sample's episode; give the model its prompt, limits and tools."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        episode, answer = await episodes.start(task_id)
        state.metadata[EPISODE_KEY] = episode.episode_id
        limits = json.dumps(answer["task"], indent=1)
        state.messages = [
            ChatMessageSystem(content=SYSTEM),
            ChatMessageUser(
                content=f"{answer['prompt'].strip()}\n\nThis episode's limits:\n{limits}"
            ),
        ]
        server = mcp_server_http(
            name="posttrain_env",
            url=episode.mcp_url,
            headers={"Authorization": f"Bearer {episode.token}"},
        )
        state.tools = await mcp_tools(server).tools()
        state.tool_choice = "auto"
        return state

    return solve


@solver
def play_episode(episodes: EpisodeServer, max_nudges: int = 3) -> Solver:
    """The model calls tools, one round at a time, until the episode is over, a message or
    token limit is reached, or it answers `max_nudges` times in a row without a tool call."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        episode = episodes.of(state)
        assert episode is not None, "start_episode must run first"
        quiet = 0
        while not state.completed:
            state = await generate(state, tool_calls="single")
            if state.output.message.tool_calls:
                quiet = 0
                if (await episodes.read(episode))["done"]:
                    break
            else:
                quiet += 1
                if quiet > max_nudges:
                    break
                state.messages.append(ChatMessageUser(content=NUDGE))
        return state

    return solve


@scorer(metrics=[mean(), stderr()])
def episode_reward(episodes: EpisodeServer) -> Scorer:
    """The episode's reward; unscored when it has none; 0 when the model stopped early."""

    async def score(state: TaskState, target: Target) -> Score:
        episode = episodes.of(state)
        if episode is None:
            return Score.unscored(reason="scoring_failed", explanation="no episode was started")
        body = await episodes.read(episode)
        stopped_early = body["state"] == "running"
        if stopped_early:  # end it, so that nothing keeps running (and billing)
            body = await episodes.end(episode)
        end = body["episode_end"] or {}
        metadata = {
            "episode_id": episode.episode_id,
            "end_reason": end.get("reason"),
            "reward": end.get("reward"),
            "service_spend": body["service_spend"],
            "steps_used": body["steps_used"],
        }
        if stopped_early:
            return Score(
                value=0.0,
                explanation="the model stopped before the episode's end; it was ended (reward 0)",
                metadata={**metadata, "stopped_early": True},
            )
        if end.get("reward") is None:
            return Score.unscored(
                reason="grader_failed" if end.get("reason") == "score_failed" else "scoring_failed",
                explanation=f"the episode ended {end.get('reason')} without a reward",
                metadata=metadata,
            )
        return Score(
            value=float(end["reward"]),
            explanation=f"the episode ended {end['reason']}, reward {end['reward']}",
            metadata=metadata,
        )

    return score


def end_if_running(episodes: EpisodeServer) -> Any:
    """Cleanup after every sample (a failed one too): end its episode unless it is over."""

    async def cleanup(state: TaskState) -> None:
        episode = episodes.of(state)
        if episode is None:
            return
        try:
            if (await episodes.read(episode))["state"] == "running":
                await episodes.end(episode)
        finally:
            episodes.forget(episode)

    return cleanup


@task
def posttrain(
    task_id: str = "t0_artifact",
    server: str = "http://127.0.0.1:8000",
    samples: int = 1,
    api_key_env: str = "ENV_SERVER_API_KEY",
    max_nudges: int = 3,
) -> Task:
    """Episodes of `task_id` on the posttrain_env server at `server`, one per sample.

    Args:
        task_id: The task every episode plays (e.g. t0_artifact).
        server: The server's base URL.
        samples: How many episodes (samples) to run; Inspect's `--epochs` repeats them too.
        api_key_env: The environment variable holding the server's API key, if it needs one.
        max_nudges: Replies without a tool call in a row before the sample ends.
    """
    episodes = EpisodeServer(server, api_key_env)
    dataset = MemoryDataset(
        [
            Sample(id=f"{task_id}-{n}", input=f"An episode of {task_id}")
            for n in range(1, samples + 1)
        ],
        name=f"posttrain_env/{task_id}",
    )
    return Task(
        dataset=dataset,
        setup=start_episode(episodes, task_id),
        solver=play_episode(episodes, max_nudges),
        scorer=episode_reward(episodes),
        cleanup=end_if_running(episodes),
    )
