"""An LLM plays one posttrain_env episode through any OpenAI-compatible chat-completions endpoint.

    AGENT_API_KEY=hf_... uv run python examples/posttrain_env_agent.py \\
        --base-url http://127.0.0.1:8000 --model openai/gpt-oss-120b

A thin command line over the library: `posttrain_env.agents.play.play` runs the episode with
`posttrain_env.agents.openai_agent.OpenAIAgent` (the agent campaigns use), and this script
prints what happens. Each tool call of the model is one `step`; it reads the tool's data back
with the steps and time left and the money spent. The run ends when the episode is done (the
model called `submit`, or a limit ended it), printing the reward and the spend: exit status 0.
It exits 1 when `--max-turns` ran out first, the model stopped without submitting, or the LLM or
the env server failed.

The API key is the agent's own, read from the variable `--api-key-env` names (default
`AGENT_API_KEY`): for the default endpoint, Hugging Face Inference Providers, a token of yours
with the "Make calls to Inference Providers" permission. `HF_TOKEN`, the broker's token, is
refused: the server runs jobs with it and the agent never needs it. The key is sent only to
`--llm-base-url`, in the `Authorization` header, and never printed.

A server with API keys (`POSTTRAIN_API_KEYS`) wants one of them from its clients: put it in the
variable `--env-api-key-env` names (default `ENV_SERVER_API_KEY`); it goes to the env server only.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import httpx

from posttrain_env import PostTrainEnv
from posttrain_env.agents import AgentError
from posttrain_env.agents.openai_agent import DEFAULT_BASE_URL, DEFAULT_MODEL, OpenAIAgent
from posttrain_env.agents.play import (
    CallAnswered,
    PlayEvent,
    PlayResult,
    Started,
    TurnTaken,
    play,
)
from posttrain_env.agents.prompts import tool_content

DEFAULT_API_KEY_ENV = "AGENT_API_KEY"
DEFAULT_ENV_API_KEY_ENV = "ENV_SERVER_API_KEY"
BROKER_TOKEN_ENV = "HF_TOKEN"
# jobs_wait may hold a step for up to 600 s: wait longer than that for a reply.
MESSAGE_TIMEOUT_S = 900


def show(event: PlayEvent) -> None:
    if isinstance(event, Started):
        brief = event.brief
        print(f"episode {brief.episode_id}, task {brief.task_id}")
    elif isinstance(event, TurnTaken):
        said = [m.content for m in event.turn.exchanged if m.role == "assistant"]
        for content in [*said, event.turn.content]:
            if content:
                print(f"[{event.number}] model: {_clip(content, 300)}")
    elif isinstance(event, CallAnswered):
        call = event.call
        arguments = call.raw_arguments if call.raw_arguments is not None else call.arguments
        print(f"[{event.number}] {call.tool} {_clip(str(arguments), 120)}")
        print(f"      -> {_clip(tool_content(event.answer), 200)}")


def report(result: PlayResult, max_turns: int) -> int:
    """Print how the play ended; the exit status."""
    if result.finish == "out_of_turns":
        print(f"no end after {max_turns} turns; closing the session ends the episode (cancelled)")
        return 1
    if result.finish == "agent_stopped":
        print("the model stopped without submitting; closing the session ends the episode")
        return 1
    spend = result.spend
    print(f"done: {result.end.reason.value if result.end else None}")
    print(f"reward: {result.reward}")
    print(
        f"spend: ${spend.settled.usd} settled ({spend.settled.jobs} jobs, "
        f"{spend.settled.calls} dev evaluations), ${spend.reserved.usd} still reserved"
        f"{'' if spend.final else ' (not final yet)'}"
    )
    usage = result.usage
    print(
        f"LLM: {usage.requests} replies, {usage.prompt_tokens} prompt and "
        f"{usage.completion_tokens} completion tokens"
    )
    return 0


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def run(args: argparse.Namespace, api_key: str, env_key: str | None) -> int:
    agent = OpenAIAgent(model=args.model, base_url=args.llm_base_url, api_key=api_key)
    print(f"model {args.model} at {args.llm_base_url}")
    client = PostTrainEnv(
        base_url=args.base_url,
        message_timeout_s=MESSAGE_TIMEOUT_S,
        headers={"X-API-Key": env_key} if env_key else None,
    )
    try:
        async with client:
            result = await play(
                client, agent, args.task_id, max_turns=args.max_turns, on_event=show
            )
    except AgentError as exc:  # its message has the key cut out
        print(f"the agent failed: {exc}", file=sys.stderr)
        return 1
    # Refused, unreachable, or an answer that cannot be played on (PlayError is a RuntimeError).
    except (httpx.HTTPError, ConnectionError, TimeoutError, RuntimeError) as exc:
        print(f"the env server at {args.base_url} failed: {exc}", file=sys.stderr)
        return 1
    return report(result, args.max_turns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the env server")
    parser.add_argument("--task-id", default="t0_artifact")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"default {DEFAULT_MODEL}")
    parser.add_argument("--llm-base-url", default=DEFAULT_BASE_URL, help="ends in /v1")
    parser.add_argument(
        "--max-turns",
        type=int,
        default=100,
        help="agent turns at most (a reply without a tool call is nudged within its turn)",
    )
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
    # The openai client retries rate limits and 5xx answers itself; show each retry.
    retries = logging.StreamHandler(sys.stdout)
    retries.setFormatter(logging.Formatter("  (LLM: %(message)s)"))
    openai_log = logging.getLogger("openai")
    openai_log.addHandler(retries)
    openai_log.setLevel(logging.INFO)
    openai_log.propagate = False
    return asyncio.run(run(args, api_key, os.environ.get(args.env_api_key_env)))


if __name__ == "__main__":
    sys.exit(main())
