"""A language model as the agent, through any OpenAI-compatible chat-completions endpoint
(Hugging Face Inference Providers by default), with the `openai` package's client.

    {agent = "openai", api_key_env = "AGENT_API_KEY", args = {model = "openai/gpt-oss-120b"}}

Why the `openai` client: it is typed (usage comes back as numbers, not dict digging), and it
retries what is worth retrying (429, 408, 409, 5xx, dropped connections) with jittered
exponential backoff that honours the endpoint's `Retry-After`, up to `max_retries` times.

The key is the agent's own, handed in by the agent worker from the variable the spec names
(`api_key_env`); it goes only to `base_url`, in the `Authorization` header, and is cut out of
every error message this agent raises.
"""

from __future__ import annotations

from typing import Any

from posttrain_env.agents.conversation import (
    AgentError,
    Conversation,
    Message,
    Turn,
    Usage,
)
from posttrain_env.agents.prompts import NUDGE, chat_messages, openai_tools, parse_call

DEFAULT_BASE_URL = "https://router.huggingface.co/v1"
DEFAULT_MODEL = "openai/gpt-oss-120b"


class OpenAIAgent:
    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        max_retries: int = 6,
        timeout_s: float = 300.0,
        nudges: int = 2,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> None:
        if not api_key:
            raise AgentError(
                "the OpenAI-compatible agent needs an API key: name its variable with "
                "`api_key_env` in the campaign spec"
            )
        from openai import AsyncOpenAI

        self.model = model
        self.nudges = nudges
        self._api_key = api_key
        self._extra: dict[str, Any] = {}
        if max_tokens is not None:
            self._extra["max_tokens"] = max_tokens
        if temperature is not None:
            self._extra["temperature"] = temperature
        self._client = AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=max_retries, timeout=timeout_s
        )

    async def act(self, conversation: Conversation) -> Turn:
        messages = chat_messages(conversation)
        exchanged: list[Message] = []
        usage = Usage()
        for attempt in range(self.nudges + 1):
            reply, used = await self._complete(messages)
            usage = usage + used
            tool_calls = reply.tool_calls or []
            if tool_calls:
                calls = [
                    parse_call(
                        call.id,
                        getattr(getattr(call, "function", None), "name", None),
                        getattr(getattr(call, "function", None), "arguments", None),
                    )
                    for call in tool_calls
                ]
                return Turn(
                    kind="calls",
                    calls=calls,
                    content=reply.content,
                    exchanged=exchanged,
                    usage=usage,
                )
            if attempt == self.nudges:  # still no tool call: the agent stops
                return Turn(kind="stop", content=reply.content, exchanged=exchanged, usage=usage)
            # A reply without a tool call: nudge, as the episode only moves through tools.
            exchanged += [
                Message(role="assistant", content=reply.content),
                Message(role="user", content=NUDGE),
            ]
            messages += [
                {"role": "assistant", "content": reply.content},
                {"role": "user", "content": NUDGE},
            ]
        raise AssertionError("unreachable: the last attempt returns")

    async def _complete(self, messages: list[dict[str, Any]]) -> tuple[Any, Usage]:
        import openai

        try:
            response = await self._client.chat.completions.create(
                model=self.model,
                messages=messages,  # type: ignore[arg-type]
                tools=openai_tools(),  # type: ignore[arg-type]
                tool_choice="auto",
                **self._extra,
            )
        except openai.APIStatusError as exc:
            message = f"the LLM answered HTTP {exc.status_code}: {exc.message}"
            raise AgentError(self._scrub(message)) from None
        except openai.APIError as exc:  # connection failures and timeouts, after the retries
            raise AgentError(self._scrub(f"the LLM could not be reached: {exc}")) from None
        if not response.choices:
            raise AgentError("the LLM answered without a choice")
        used = response.usage
        usage = Usage(
            prompt_tokens=used.prompt_tokens if used else 0,
            completion_tokens=used.completion_tokens if used else 0,
            requests=1,
        )
        return response.choices[0].message, usage

    def _scrub(self, text: str) -> str:
        return text.replace(self._api_key, "<key>")[:1000]
