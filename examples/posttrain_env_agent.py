"""An LLM plays one posttrain_env episode through any OpenAI-compatible chat-completions endpoint.

    AGENT_API_KEY=hf_... uv run python examples/posttrain_env_agent.py \\
        --base-url http://127.0.0.1:8000 --model openai/gpt-oss-120b

The environment's tools become OpenAI function tools. Each tool call the model makes is one `step`
on the environment (one of the episode's steps), and its answer goes back to the model as a
`tool` message: the tool's data, then the steps and time left and the money spent so far. The
loop ends when the episode is done (the model called `submit`, or a limit ended it) and prints
the reward and the spend; exit status 0 then, 1 when `--max-turns` ran out first.

The API key is the agent's own, read from the variable `--api-key-env` names (default
`AGENT_API_KEY`): for the default endpoint, Hugging Face Inference Providers, a token of yours
with the "Make calls to Inference Providers" permission. It is never the broker's token — the
server runs jobs with that one, and the agent never needs it — so the key comes from that one
variable only, and `HF_TOKEN`, the broker's, is refused. The key is sent only to
`--llm-base-url`, in the `Authorization` header, and never printed.

A server with API keys (`POSTTRAIN_API_KEYS`) wants one of them from its clients: put it in the
variable `--env-api-key-env` names (default `ENV_SERVER_API_KEY`); it goes to the env server only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import httpx
from openenv.core.env_server.mcp_types import CallToolAction

from posttrain_env import PostTrainEnv

DEFAULT_LLM_BASE_URL = "https://router.huggingface.co/v1"
DEFAULT_MODEL = "openai/gpt-oss-120b"
DEFAULT_API_KEY_ENV = "AGENT_API_KEY"
DEFAULT_ENV_API_KEY_ENV = "ENV_SERVER_API_KEY"
BROKER_TOKEN_ENV = "HF_TOKEN"
# Rate limits and server-side hiccups are worth another try; anything else is our request's fault.
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# `jobs_logs` can return 2,000 lines: keep one tool message from filling the model's context.
MAX_TOOL_MESSAGE_CHARS = 20_000
NUDGE = (
    "Keep working through the tools: every action is a tool call. When a job has succeeded and "
    "you are satisfied with it, call `submit` with its job_id to end the episode."
)


class LLMError(RuntimeError):
    """The chat-completions endpoint refused the request or kept failing."""


class ChatClient:
    """`POST {base_url}/chat/completions`, retrying rate limits, 5xx and dropped connections with
    exponential backoff (or the server's `Retry-After`)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        *,
        attempts: int = 6,
        timeout_s: float = 300.0,
    ) -> None:
        self.model = model
        self.attempts = attempts
        self._api_key = api_key
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._http.close()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict:
        """The assistant message of one completion. Raises LLMError."""
        request = {"model": self.model, "messages": messages, "tools": tools, "tool_choice": "auto"}
        delay = 1.0
        for attempt in range(1, self.attempts + 1):
            retry_after: float | None = None
            try:
                response = self._http.post("chat/completions", json=request)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == 200:
                    return _assistant_message(response)
                # Some endpoints quote the key they refused: never print it.
                detail = response.text[:300].replace(self._api_key, "<key>")
                problem = f"HTTP {response.status_code}: {detail}"
                if response.status_code not in RETRY_STATUSES:
                    raise LLMError(problem)
                retry_after = _retry_after_s(response)
            if attempt == self.attempts:
                break
            wait = min(retry_after if retry_after is not None else delay, 60.0)
            print(f"  (LLM: {problem.splitlines()[0][:120]}; retrying in {wait:.0f} s)")
            time.sleep(wait)
            delay = min(delay * 2, 30.0)
        raise LLMError(f"gave up after {self.attempts} attempts: {problem}")


def _assistant_message(response: httpx.Response) -> dict[str, Any]:
    try:
        message = response.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise LLMError(f"not a chat completion: {response.text[:300]}") from exc
    if not isinstance(message, dict):
        raise LLMError(f"not a chat completion: {response.text[:300]}")
    return message


def _retry_after_s(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None  # absent, or an HTTP date: use our own backoff


# -- the conversation ----------------------------------------------------------------------------


def system_prompt(metadata: dict[str, Any]) -> str:
    """The task's prompt and limits from the reset observation (and nothing else from it: the
    reset metadata also holds the episode's token, which the model has no use for)."""
    task = metadata.get("task", {})
    base = metadata.get("base_model", {})
    flavors = ", ".join(
        f"{f['name']} (${f['price_per_minute_usd']}/min)" for f in task.get("flavors", [])
    )
    return f"""You are the agent of a posttrain_env episode: you post-train a language model by \
running Python scripts as jobs, only through the tools you are given.

# Task
{metadata.get("prompt", "").strip()}

# Base model
{base.get("repo_id", "?")} at revision {base.get("revision", "?")}, mounted read-only at \
/base_model in every job.

# Limits
- Steps: {task.get("max_steps")} tool calls in all; every call counts, waiting and errors too.
- Time: {task.get("time_limit_s")} s for the whole episode.
- Budget: ${task.get("budget_usd")}. A job reserves its flavor's price x timeout_minutes \
(at most {task.get("max_timeout_minutes")} minutes) and then pays for the minutes it ran; \
dev evaluations are charged too.
- Flavors: {flavors}.

Tool errors come back as {{"error": {{"type": ..., "message": ...}}}}: the message says what to \
change. Check a succeeded job with dev_evaluate, then call submit with its job_id: that ends the \
episode, and the job's score on a hidden split is your reward."""


def openai_tools(env: PostTrainEnv) -> list[dict[str, Any]]:
    """The environment's tools as OpenAI function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.input_schema,
            },
        }
        for tool in env.list_tools()
    ]


def error_message(message: str) -> str:
    """A problem with the model's tool call, answered in the environment's own error shape."""
    return json.dumps({"error": {"type": "invalid_argument", "message": message}})


def tool_message(observation: Any) -> str:
    """What the model reads after a step: the tool's data and where the episode stands."""
    metadata = observation.metadata or {}
    if observation.error is not None:  # transport or framework failure, not a tool error
        return error_message(f"the environment could not run the tool: {observation.error}")
    spend = metadata.get("service_spend") or {}
    content = json.dumps(
        {
            "result": (observation.result or {}).get("data"),
            "steps_left": metadata.get("steps_left"),
            "time_left_s": round(metadata.get("time_left_s") or 0),
            "spend_usd": {
                "settled": spend.get("settled", {}).get("usd"),
                "reserved": spend.get("reserved", {}).get("usd"),
            },
        }
    )
    if len(content) > MAX_TOOL_MESSAGE_CHARS:
        content = content[:MAX_TOOL_MESSAGE_CHARS] + " …[truncated: ask for fewer lines]"
    return content


def run_tool_call(env: PostTrainEnv, call: dict[str, Any], names: set[str]) -> tuple[str, Any]:
    """Run one tool call of the model: (the tool message's content, the step result or None
    when the call never reached the environment)."""
    function = call.get("function") or {}
    name = function.get("name")
    raw = function.get("arguments") or "{}"
    if name not in names:
        return error_message(f"there is no tool {name!r}; the tools are {sorted(names)}"), None
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        return error_message(f"the arguments of {name} are not valid JSON ({exc})"), None
    if not isinstance(arguments, dict):
        return error_message(f"the arguments of {name} must be a JSON object"), None
    result = env.step(CallToolAction(tool_name=name, arguments=arguments))
    return tool_message(result.observation), result


def play(env: PostTrainEnv, llm: ChatClient, task_id: str, max_turns: int) -> int:
    """Reset, then let the model call tools until the episode is done. The exit status."""
    reset = env.reset(task_id=task_id)
    print(f"episode {env.episode_id}, task {task_id}, model {llm.model}")
    tools = openai_tools(env)
    names = {tool["function"]["name"] for tool in tools}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt(reset.observation.metadata)},
        {"role": "user", "content": "Begin."},
    ]
    for turn in range(1, max_turns + 1):
        reply = llm.complete(messages, tools)
        calls = reply.get("tool_calls") or []
        # Only what the API defines goes back: providers add fields (reasoning, refusal, ...).
        assistant: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        if calls:
            assistant["tool_calls"] = calls
        messages.append(assistant)
        if reply.get("content"):
            print(f"[{turn}] model: {_clip(str(reply['content']), 300)}")
        if not calls:
            messages.append({"role": "user", "content": NUDGE})
            continue
        for call in calls:
            function = call.get("function") or {}
            print(f"[{turn}] {function.get('name')} {_clip(str(function.get('arguments')), 120)}")
            content, result = run_tool_call(env, call, names)
            print(f"      -> {_clip(content, 200)}")
            messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": content})
            if result is not None and result.done:
                report(result)
                return 0
    print(f"no end after {max_turns} turns; closing the session ends the episode (cancelled)")
    return 1


def report(result: Any) -> None:
    metadata = result.observation.metadata or {}
    end = metadata.get("episode_end") or {}
    spend = metadata.get("service_spend") or {}
    settled = spend.get("settled", {})
    print(f"done: {end.get('reason')}")
    print(f"reward: {result.reward}")
    print(
        f"spend: ${settled.get('usd')} settled ({settled.get('jobs')} jobs, "
        f"{settled.get('calls')} dev evaluations), ${spend.get('reserved', {}).get('usd')} "
        f"still reserved{'' if spend.get('final') else ' (not final yet)'}"
    )


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the env server")
    parser.add_argument("--task-id", default="t0_artifact")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"default {DEFAULT_MODEL}")
    parser.add_argument("--llm-base-url", default=DEFAULT_LLM_BASE_URL, help="ends in /v1")
    parser.add_argument("--max-turns", type=int, default=100, help="model replies at most")
    parser.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        help=f"the variable holding the agent's own API key (default {DEFAULT_API_KEY_ENV})",
    )
    parser.add_argument(
        "--env-api-key-env",
        default=DEFAULT_ENV_API_KEY_ENV,
        help="the variable holding an API key of the env server, when it has keys "
        f"(default {DEFAULT_ENV_API_KEY_ENV})",
    )
    args = parser.parse_args(argv)
    if args.api_key_env == BROKER_TOKEN_ENV:
        parser.error(f"{BROKER_TOKEN_ENV} is the broker's token: give the agent a key of its own")
    api_key = os.environ.get(args.api_key_env)
    if not api_key:
        parser.error(f"set {args.api_key_env} to the agent's API key for {args.llm_base_url}")

    env_key = os.environ.get(args.env_api_key_env)
    llm = ChatClient(args.llm_base_url, api_key, args.model)
    # jobs_wait may hold a step for up to 600 s: wait longer than that for a reply.
    client = PostTrainEnv(
        base_url=args.base_url,
        message_timeout_s=900,
        headers={"X-API-Key": env_key} if env_key else None,
    )
    try:
        with client.sync() as env:
            return play(env, llm, args.task_id, args.max_turns)
    except LLMError as exc:
        print(f"the LLM failed: {exc}", file=sys.stderr)
        return 1
    except (httpx.HTTPError, ConnectionError, RuntimeError) as exc:  # refused, or unreachable
        print(f"the env server at {args.base_url} failed: {exc}", file=sys.stderr)
        return 1
    finally:
        llm.close()


if __name__ == "__main__":
    sys.exit(main())
