"""`posttrain_env.agents.play` against a fake client (no server): what the agent reads, which
calls reach the environment, and how a play ends. The example's tests play it for real."""

from __future__ import annotations

from typing import Any, cast

from openenv.core.client_types import StepResult
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation

from posttrain_env.agents.conversation import AgentCall, Conversation, Message, Turn
from posttrain_env.agents.play import CallAnswered, PlayEvent, Started, TurnTaken, play
from posttrain_env.agents.prompts import NUDGE
from posttrain_env.client import PostTrainEnv, RequestTooLarge
from posttrain_env.models import ServiceSpend

RESET = {
    "episode_id": "ep-1",
    "prompt": "Produce a checkpoint.",
    "task": {"max_steps": 10, "budget_usd": 0.5},
    "base_model": {"repo_id": "org/base", "revision": "a" * 40},
    "episode_token": "secret-token",
    "mcp_url": "http://127.0.0.1/mcp",
    "service_spend": ServiceSpend().model_dump(mode="json"),
}


def metadata(steps_left: int, *, end: dict[str, Any] | None = None) -> dict[str, Any]:
    spend = ServiceSpend.model_validate({"settled": {"usd": 0.25, "jobs": 1}})
    meta: dict[str, Any] = {
        "episode_id": "ep-1",
        "steps_used": 10 - steps_left,
        "steps_left": steps_left,
        "time_left_s": 100.0,
        "service_spend": spend.model_dump(mode="json"),
    }
    if end is not None:
        meta["episode_end"] = end
    return meta


class FakeEnv:
    """Answers `task_info` with data, refuses `too_big` as the client does, ends on `submit`."""

    def __init__(self) -> None:
        self.steps: list[CallToolAction] = []

    async def reset(self, **kwargs: Any) -> StepResult[Observation]:
        return StepResult(observation=Observation(metadata=RESET))

    async def step(self, action: CallToolAction) -> StepResult[CallToolObservation]:
        if action.tool_name == "too_big":
            raise RequestTooLarge("the request is too large")
        self.steps.append(action)
        done = action.tool_name == "submit"
        meta = metadata(10 - len(self.steps), end={"reason": "submitted"} if done else None)
        observation = CallToolObservation(
            tool_name=action.tool_name,
            result={"data": {"tool": action.tool_name}},
            done=done,
            reward=0.75 if done else None,
            metadata=meta,
        )
        return StepResult(observation=observation, reward=observation.reward, done=done)


class Calls:
    """Plays its turns in order, keeping what it read."""

    def __init__(self, *turns: Turn) -> None:
        self.turns = list(turns)
        self.read: list[Conversation] = []

    async def act(self, conversation: Conversation) -> Turn:
        self.read.append(conversation.model_copy(deep=True))
        return self.turns.pop(0)


def call(call_id: str, tool: str, **problem: str) -> AgentCall:
    return AgentCall(id=call_id, tool=tool, arguments=None if problem else {}, **problem)


async def test_a_play_runs_calls_answers_bad_ones_locally_and_ends_with_the_episode() -> None:
    env = FakeEnv()
    agent = Calls(
        Turn(kind="calls", calls=[call("c1", "jobs_status", problem="not valid JSON")]),
        Turn(kind="calls", calls=[call("c2", "too_big"), call("c3", "task_info")]),
        Turn(kind="calls", calls=[call("c4", "submit"), call("c5", "task_info")]),
    )
    events: list[PlayEvent] = []
    result = await play(cast(PostTrainEnv, env), agent, "t_a", on_event=events.append)

    assert result.ended and result.end is not None and result.end.reason == "submitted"
    assert result.reward == 0.75 and result.turns == 3
    assert result.spend.settled.usd == 0.25 and result.spend.settled.jobs == 1
    # Only well-formed calls became steps; nothing after the episode's end was sent.
    assert [a.tool_name for a in env.steps] == ["task_info", "submit"]

    brief = agent.read[0].brief
    assert brief.episode_id == "ep-1" and brief.reference_task == "t_a"
    assert "secret-token" not in brief.model_dump_json()  # no capability reaches an agent
    malformed, too_big, info = agent.read[2].answers()
    assert malformed.data == {"error": {"type": "invalid_argument", "message": "not valid JSON"}}
    assert malformed.steps_left is None  # answered here, like a campaign's local answer
    assert too_big.data is not None and too_big.data["error"]["type"] == "invalid_argument"
    assert info.data == {"tool": "task_info"} and info.steps_left == 9
    assert info.spend_usd == {"settled": 0.25, "reserved": 0.0}

    kinds = [type(event) for event in events]
    assert kinds[:3] == [Started, TurnTaken, CallAnswered]
    local = [e.local for e in events if isinstance(e, CallAnswered)]
    assert local == [True, True, False, False]


async def test_a_stop_ends_the_play_with_the_nudges_kept_in_the_conversation() -> None:
    nudged = [Message(role="assistant", content="first words"), Message(role="user", content=NUDGE)]
    stop = Turn(kind="stop", content="done thinking", exchanged=nudged)
    agent = Calls(Turn.call("task_info", {}, "c1"), stop)
    result = await play(cast(PostTrainEnv, FakeEnv()), agent, "t_a")
    assert result.finish == "agent_stopped" and not result.ended and result.turns == 2
    roles = [m.role for m in result.conversation.messages]
    assert roles == ["assistant", "tool", "assistant", "user", "assistant"]
    assert result.conversation.messages[-1].content == "done thinking"


async def test_a_play_out_of_turns_says_so_and_reports_the_spend_so_far() -> None:
    agent = Calls(Turn.call("task_info", {}, "c1"), Turn.call("task_info", {}, "c2"))
    result = await play(cast(PostTrainEnv, FakeEnv()), agent, "t_a", max_turns=2)
    assert result.finish == "out_of_turns" and result.end is None and result.reward is None
    assert result.spend.settled.usd == 0.25 and result.turns == 2
