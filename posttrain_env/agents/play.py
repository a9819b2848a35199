"""One episode played by any agent against a running server, through the OpenEnv client.

    async with PostTrainEnv(base_url="http://127.0.0.1:8000") as env:
        result = await play(env, agent, "t0_artifact", max_turns=100)

The agent reads the same conversation as in a campaign: the brief from the reset observation
(never its `episode_token` or `mcp_url`), its own turns, and one `tool` message per call built
as `activities/campaigns/activities.py` builds it. A call that could not be a tool call (`problem`,
or no
arguments) is answered here as `invalid_argument` and never reaches the episode (no step used).
What happens is reported through `on_event`; nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from posttrain_env.openenv_light import load as load_openenv

load_openenv()  # before the first import of openenv: without its Gradio web UI

from openenv.core.env_server.mcp_types import CallToolAction
from pydantic import BaseModel, ValidationError

from posttrain_env.agents.conversation import (
    Agent,
    AgentCall,
    AgentError,
    BaseModelRef,
    Conversation,
    Message,
    TaskBrief,
    Turn,
    Usage,
)
from posttrain_env.agents.prompts import error_data
from posttrain_env.client import PostTrainEnv, RequestTooLarge
from posttrain_env.models import EpisodeEnd, ServiceSpend, StepMetadata


class PlayError(RuntimeError):
    """The environment answered something no play can go on from (a reset without its task, a
    step without its metadata, a transport failure inside an observation)."""


class Started(BaseModel):
    brief: TaskBrief


class TurnTaken(BaseModel):
    number: int
    turn: Turn


class CallAnswered(BaseModel):
    number: int  # the turn's
    call: AgentCall
    answer: Message
    local: bool  # answered here, without reaching the episode (no step used)


PlayEvent = Started | TurnTaken | CallAnswered
Finish = Literal["episode_over", "agent_stopped", "out_of_turns"]


class PlayResult(BaseModel):
    episode_id: str
    # How the play ended: the episode is over (submitted, or a limit ended it), the agent
    # stopped, or `max_turns` ran out first. Only the first leaves nothing running.
    finish: Finish
    end: EpisodeEnd | None = None  # the episode's end (reason, reward, ...) once it is over
    reward: float | None = None
    spend: ServiceSpend  # as the last answer reported it (`final` once every job settled)
    turns: int
    usage: Usage  # the agent's, summed over its turns
    conversation: Conversation

    @property
    def ended(self) -> bool:
        return self.finish == "episode_over"


async def play(
    env: PostTrainEnv,
    agent: Agent,
    task_id: str,
    *,
    max_turns: int = 100,
    on_event: Callable[[PlayEvent], None] | None = None,
) -> PlayResult:
    """Reset `task_id` on `env` (connected, in async mode), then let `agent` take turns until
    the episode is over, the agent stops, or `max_turns` turns were taken.

    Raises AgentError as the agent raises it, PlayError for an answer of the environment that
    cannot be played on, and what the client raises (ConnectionError, TimeoutError,
    RuntimeError) when the server fails."""

    def report(event: PlayEvent) -> None:
        if on_event is not None:
            on_event(event)

    reset = await env.reset(task_id=task_id)
    metadata = reset.observation.metadata or {}
    conversation = Conversation(brief=task_brief(task_id, metadata))
    report(Started(brief=conversation.brief))
    spend = _spend(metadata)
    usage = Usage()

    def outcome(
        finish: Finish, turns: int, end: EpisodeEnd | None = None, reward: float | None = None
    ) -> PlayResult:
        return PlayResult(
            episode_id=conversation.brief.episode_id,
            finish=finish,
            end=end,
            reward=reward,
            spend=spend,
            turns=turns,
            usage=usage,
            conversation=conversation,
        )

    for number in range(1, max_turns + 1):
        turn = await agent.act(conversation)
        usage = usage + turn.usage
        if turn.kind == "calls" and not turn.calls:
            raise AgentError("the agent answered a turn of calls without any call")
        # The nudges the agent exchanged within the turn stay: the next turn reads them too.
        conversation.messages += [*turn.exchanged, turn.message()]
        report(TurnTaken(number=number, turn=turn))
        if turn.kind == "stop":
            return outcome("agent_stopped", number)
        for call in turn.calls:
            answer, stepped = await _run_call(env, call)
            conversation.messages.append(answer)
            report(CallAnswered(number=number, call=call, answer=answer, local=stepped is None))
            if stepped is None:
                continue
            meta, reward = stepped
            spend = meta.service_spend
            if answer.done:  # calls after the end would only answer `episode_over`
                return outcome("episode_over", number, meta.episode_end, reward)
    return outcome("out_of_turns", max_turns)


def task_brief(task_id: str, metadata: dict[str, Any]) -> TaskBrief:
    """The brief from a reset observation's metadata. Its capabilities (`episode_token`,
    `mcp_url`) are left out: no agent needs them, and an LLM agent would send them away."""
    try:
        return TaskBrief(
            task_id=task_id,
            # The reset metadata names no family today: the task's own folder, then.
            reference_task=metadata.get("family") or task_id,
            prompt=metadata["prompt"],
            base_model=BaseModelRef.model_validate(metadata["base_model"]),
            limits=metadata.get("task") or {},
            episode_id=metadata.get("episode_id") or "",
        )
    except (KeyError, ValidationError) as exc:
        raise PlayError(f"the reset observation has no usable task ({exc})") from None


async def _run_call(
    env: PostTrainEnv, call: AgentCall
) -> tuple[Message, tuple[StepMetadata, float | None] | None]:
    """The answer to one call, with the step's metadata and reward (None: answered here)."""
    if call.arguments is None or call.problem is not None:
        return _local(call, call.problem or "the call has no arguments"), None
    try:
        step = await env.step(CallToolAction(tool_name=call.tool, arguments=call.arguments))
    except RequestTooLarge as exc:  # refused by the client before sending: the agent can fix it
        return _local(call, str(exc)), None
    observation = step.observation
    if getattr(observation, "error", None) is not None:  # transport, not a tool error (data)
        raise PlayError(f"the environment could not run {call.tool}: {observation.error}")
    body = getattr(observation, "result", None)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict):
        raise PlayError(f"the answer to {call.tool} carries no data")
    meta = _step_metadata(observation.metadata)
    # As `activities/campaigns/activities.py::_answer` builds it: an agent reads one conversation
    # shape.
    answer = Message(
        role="tool",
        call_id=call.id,
        tool=call.tool,
        data=data,
        steps_left=meta.steps_left,
        time_left_s=meta.time_left_s,
        spend_usd={
            "settled": meta.service_spend.settled.usd,
            "reserved": meta.service_spend.reserved.usd,
        },
        done=step.done,
    )
    return answer, (meta, step.reward)


def _local(call: AgentCall, problem: str) -> Message:
    return Message(role="tool", call_id=call.id, tool=call.tool, data=error_data(problem))


def _step_metadata(metadata: dict[str, Any] | None) -> StepMetadata:
    try:
        return StepMetadata.model_validate(metadata or {})
    except ValidationError as exc:
        raise PlayError(f"a step's answer has no usable metadata ({exc})") from None


def _spend(metadata: dict[str, Any]) -> ServiceSpend:
    try:
        return ServiceSpend.model_validate(metadata.get("service_spend") or {})
    except ValidationError as exc:
        raise PlayError(f"the reset observation's spend is unreadable ({exc})") from None
