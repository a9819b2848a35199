"""How a conversation reads to a language model: the system prompt, the tools, the messages
(OpenAI chat format). Shared by every LLM agent; pure."""

from __future__ import annotations

import json
from typing import Any

from posttrain_env.agents.conversation import AgentCall, Conversation, Message, TaskBrief
from posttrain_env.limits import MAX_TOOL_MESSAGE_CHARS
from posttrain_env.tools import TOOLS, tool_catalog

BEGIN = "Begin."
NUDGE = (
    "Keep working through the tools: every action is a tool call. When a job has succeeded and "
    "you are satisfied with it, call `submit` with its job_id to end the episode."
)


def system_prompt(brief: TaskBrief) -> str:
    """The task's prompt and limits (and nothing else: no capability ever reaches a model)."""
    limits = brief.limits
    flavors = ", ".join(
        f"{f['name']} (${f['price_per_minute_usd']}/min)" for f in limits.get("flavors", [])
    )
    return f"""You are the agent of a posttrain_env episode: you post-train a language model by \
running Python scripts as jobs, only through the tools you are given.

# Task
{brief.prompt.strip()}

# Base model
{brief.base_model.repo_id} at revision {brief.base_model.revision}, mounted read-only at \
/base_model in every job.

# Limits
- Steps: {limits.get("max_steps")} tool calls in all; every call counts, waiting and errors too.
- Time: {limits.get("time_limit_s")} s for the whole episode.
- Budget: ${limits.get("budget_usd")}. A job reserves its flavor's price x timeout_minutes \
(at most {limits.get("max_timeout_minutes")} minutes) and then pays for the minutes it ran; \
dev evaluations are charged too.
- Flavors: {flavors}.

Tool errors come back as {{"error": {{"type": ..., "message": ...}}}}: the message says what to \
change. Check a succeeded job with dev_evaluate, then call submit with its job_id: that ends the \
episode, and the job's score on a hidden split is your reward."""


def openai_tools() -> list[dict[str, Any]]:
    """The environment's tools as OpenAI function tools (from the one tool registry)."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool["description"],
                "parameters": tool["input_schema"],
            },
        }
        for tool in tool_catalog()
    ]


def error_data(message: str) -> dict[str, Any]:
    """A problem with the model's tool call, in the environment's own error shape."""
    return {"error": {"type": "invalid_argument", "message": message}}


def tool_content(message: Message) -> str:
    """What the model reads after a tool call: its data and where the episode stands."""
    body: dict[str, Any] = {"result": message.data}
    if message.steps_left is not None:
        body["steps_left"] = message.steps_left
    if message.time_left_s is not None:
        body["time_left_s"] = round(message.time_left_s)
    if message.spend_usd is not None:
        body["spend_usd"] = message.spend_usd
    content = json.dumps(body)
    if len(content) > MAX_TOOL_MESSAGE_CHARS:
        content = content[:MAX_TOOL_MESSAGE_CHARS] + " …[truncated: ask for fewer lines]"
    return content


def chat_messages(conversation: Conversation) -> list[dict[str, Any]]:
    """The conversation as chat-completions `messages`."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt(conversation.brief)},
        {"role": "user", "content": BEGIN},
    ]
    for message in conversation.messages:
        if message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": message.content}
            if message.calls:
                entry["tool_calls"] = [_tool_call(call) for call in message.calls]
            out.append(entry)
        elif message.role == "tool":
            out.append(
                {"role": "tool", "tool_call_id": message.call_id, "content": tool_content(message)}
            )
        else:
            out.append({"role": "user", "content": message.content or ""})
    return out


def _tool_call(call: AgentCall) -> dict[str, Any]:
    raw = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)
    return {"id": call.id, "type": "function", "function": {"name": call.tool, "arguments": raw}}


def parse_call(call_id: str, name: str | None, raw: str | None) -> AgentCall:
    """A model's tool call; a call naming no tool, or whose arguments are not a JSON object,
    carries the `problem` it is answered with."""
    tool = name or ""
    if tool not in TOOLS:
        return AgentCall(
            id=call_id,
            tool=tool[:256],
            raw_arguments=raw,
            problem=f"there is no tool {tool!r}; the tools are {sorted(TOOLS)}",
        )
    try:
        arguments = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        return AgentCall(
            id=call_id,
            tool=tool,
            raw_arguments=raw,
            problem=f"the arguments of {tool} are not valid JSON ({exc})",
        )
    if not isinstance(arguments, dict):
        return AgentCall(
            id=call_id,
            tool=tool,
            raw_arguments=raw,
            problem=f"the arguments of {tool} must be a JSON object",
        )
    return AgentCall(id=call_id, tool=tool, arguments=arguments, raw_arguments=raw)
