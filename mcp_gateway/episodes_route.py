"""`POST /episodes`: an episode for a client that speaks only MCP (DESIGN §9 "MCP-only clients").

It starts the episode in a fresh session that nobody else holds and answers the episode's MCP
endpoint and bearer token; the session id is not returned (the token is the capability). Behind
the API keys when they are configured, like every route but the open ones.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from mcp_gateway.bounds import read_json_object
from mcp_gateway.protocol import OpenEnvProtocol

router = APIRouter()
ANSWERED = ("episode_id", "mcp_url", "episode_token", "prompt", "task")


@router.post(
    "/episodes",
    openapi_extra={
        "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}}
    },
)
async def create_episode(request: Request) -> Any:
    """Start an episode of `task_id`. Answers `episode_id`, `mcp_url`, `episode_token` (send it
    as `Authorization: Bearer <episode_token>` to `mcp_url`), `prompt` and the `task` limits."""
    body = await read_json_object(request)
    protocol: OpenEnvProtocol = request.app.state.protocol
    base = str(request.base_url).rstrip("/")
    reset = await protocol.reset(protocol.session_ids.mint(), body, base, reveal_session=False)
    return {key: reset["metadata"][key] for key in ANSWERED}
