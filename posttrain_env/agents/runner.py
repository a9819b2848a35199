"""One agent turn in a process of its own: `python -m posttrain_env.agents.runner`.

The agent worker starts this for every turn, in an empty folder, with an environment that holds
nothing but the basics and the agent's own key (DESIGN §10: agent code never runs where the
broker's secrets are). It reads one `TurnRequest` as JSON on standard input, and writes one
`TurnReply` as JSON on standard output; what the agent itself prints goes to standard error.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from posttrain_env.agents.conversation import AgentError, Conversation, Turn
from posttrain_env.agents.registry import AgentSpecError, build
from posttrain_env.errors import AGENT_FAILED, AGENT_INVALID
from posttrain_env.limits import cut_text


class TurnRequest(BaseModel):
    kind: str
    args: dict[str, Any] = Field(default_factory=dict)
    api_key_env: str | None = None  # the variable's name; its value is in this environment
    conversation: Conversation | None = None  # None: only check that the agent can be built


class TurnFailure(BaseModel):
    # posttrain_env.errors: AGENT_INVALID (the agent's spec is wrong: never retried) or
    # AGENT_FAILED (its LLM, its code)
    type: Literal["agent_invalid", "agent_failed"]
    message: str


class TurnReply(BaseModel):
    turn: Turn | None = None
    error: TurnFailure | None = None


async def take_turn(request: TurnRequest) -> TurnReply:
    api_key = os.environ.get(request.api_key_env) if request.api_key_env else None
    try:
        agent = build(request.kind, request.args, api_key)
        if request.conversation is None:
            return TurnReply()
        turn = await agent.act(request.conversation)
        if not isinstance(turn, Turn):
            turn = Turn.model_validate(turn)
        if turn.kind == "calls" and not turn.calls:
            raise AgentError("the agent answered a turn of calls without any call")
        return TurnReply(turn=turn)
    except AgentSpecError as exc:
        return TurnReply(error=TurnFailure(type=AGENT_INVALID, message=_scrub(str(exc), api_key)))
    except AgentError as exc:
        return TurnReply(error=TurnFailure(type=AGENT_FAILED, message=_scrub(str(exc), api_key)))
    except ValidationError as exc:
        message = f"the agent's turn is not a Turn: {exc}"
        return TurnReply(error=TurnFailure(type=AGENT_FAILED, message=_scrub(message, api_key)))
    except Exception as exc:  # the agent's own code failed: say where, as a crash would
        traceback.print_exc(file=sys.stderr)
        message = f"the agent raised {type(exc).__name__}: {exc}"
        return TurnReply(error=TurnFailure(type=AGENT_FAILED, message=_scrub(message, api_key)))


def _scrub(text: str, key: str | None) -> str:
    if key:
        text = text.replace(key, "<key>")
    return cut_text(text)


def main() -> int:
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # the agent's prints must not corrupt the reply
    request = TurnRequest.model_validate_json(sys.stdin.buffer.read())
    reply = asyncio.run(take_turn(request))
    out.write(reply.model_dump_json(exclude_none=True) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
