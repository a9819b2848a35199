"""What an agent reads and what it answers (pure pydantic; no server code).

A `Conversation` is the task brief and the messages so far: each of the agent's turns (an
`assistant` message with its tool calls) and each tool's answer (a `tool` message with the
tool's data and where the episode stands). An agent's `act(conversation)` returns a `Turn`:
one or more tool calls, or a stop, with the tokens it used. The shapes follow the OpenAI chat
format, so an LLM agent renders them almost one to one; other agents read the structured data.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from posttrain_env.limits import MAX_AGENT_CALLS_PER_TURN, MAX_TOOL_NAME_CHARS


class BaseModelRef(BaseModel):
    repo_id: str
    revision: str


class TaskBrief(BaseModel):
    """The task as the episode presents it at its start (the reset metadata, no capability)."""

    task_id: str
    # The folder that holds the task's reference solution: its family's, or its own.
    reference_task: str
    prompt: str
    base_model: BaseModelRef
    # `max_steps`, `time_limit_s`, `budget_usd`, `max_timeout_minutes`, `score_timeout_s`,
    # `flavors` (each with its price): the reset metadata's `task` block.
    limits: dict[str, Any] = Field(default_factory=dict)
    episode_id: str = ""


class AgentCall(BaseModel):
    """One tool call an agent makes. `arguments` is None when the agent's raw arguments were not
    a JSON object; `problem` then says why, and the call is answered as `invalid_argument`
    without reaching the environment (it is not a step)."""

    id: str = Field(max_length=128)
    tool: str = Field(max_length=4 * MAX_TOOL_NAME_CHARS)
    arguments: dict[str, Any] | None = None
    raw_arguments: str | None = None  # as the model wrote them (LLM agents)
    problem: str | None = None


class Usage(BaseModel):
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    requests: int = Field(default=0, ge=0)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            requests=self.requests + other.requests,
        )


class Message(BaseModel):
    """A message of the conversation after the brief."""

    role: Literal["assistant", "tool", "user"]
    content: str | None = None
    calls: list[AgentCall] = Field(default_factory=list)  # assistant
    call_id: str | None = None  # tool: which call it answers
    tool: str | None = None  # tool: which tool answered
    # tool: the tool's data (or `{"error": ...}`), then where the episode stands.
    data: dict[str, Any] | None = None
    steps_left: int | None = None
    time_left_s: float | None = None
    spend_usd: dict[str, float] | None = None
    done: bool = False


class Conversation(BaseModel):
    brief: TaskBrief
    messages: list[Message] = Field(default_factory=list)

    def turns(self) -> list[Message]:
        return [m for m in self.messages if m.role == "assistant"]

    def answers(self) -> list[Message]:
        return [m for m in self.messages if m.role == "tool"]


class Turn(BaseModel):
    """An agent's answer to the conversation: tool calls (run in order) or a stop."""

    kind: Literal["calls", "stop"]
    calls: list[AgentCall] = Field(default_factory=list, max_length=MAX_AGENT_CALLS_PER_TURN)
    content: str | None = None  # the agent's own words, if any
    # Messages exchanged within the turn before its last reply (an LLM agent's nudges: a reply
    # without a tool call and the prompt to go on), kept so the conversation stays faithful.
    exchanged: list[Message] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)

    @classmethod
    def stop(cls, content: str | None = None, usage: Usage | None = None) -> Turn:
        return cls(kind="stop", content=content, usage=usage or Usage())

    @classmethod
    def call(cls, tool: str, arguments: dict[str, Any], call_id: str) -> Turn:
        return cls(kind="calls", calls=[AgentCall(id=call_id, tool=tool, arguments=arguments)])

    def message(self) -> Message:
        """The assistant message this turn adds to the conversation."""
        return Message(role="assistant", content=self.content, calls=self.calls)


class Agent(Protocol):
    """An agent: `module:attr` names a class (or factory) called with the spec's `args`."""

    async def act(self, conversation: Conversation) -> Turn: ...


class AgentError(Exception):
    """The agent cannot go on (its LLM refused or kept failing, its code failed): the rollout's
    attempt ends as an `error` and is retried under the campaign's retry policy."""
