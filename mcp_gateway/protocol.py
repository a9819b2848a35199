"""OpenEnv operations (reset, step, state, direct tool calls) over any transport.

The WebSocket, `POST /mcp` and the HTTP routes all parse their framing and call this; it
resolves the session, turns the operation into a workflow update or query, and shapes the
answer. Nothing here outlives a request except the session cache in `Sessions`.
"""

from __future__ import annotations

from typing import Any

from mcp_gateway.episode_calls import tool_call
from mcp_gateway.metrics import GatewayMetrics
from mcp_gateway.observations import (
    reset_metadata,
    reset_observation,
    state_body,
    tool_observation,
    tool_result_body,
    tools_observation,
)
from mcp_gateway.sessions import SessionIds, Sessions, request_id_of
from posttrain_common.keys import ServerKey
from posttrain_env.errors import GatewayCode, SessionError
from posttrain_env.models import ToolPath
from posttrain_env.tools import tool_catalog


class OpenEnvProtocol:
    def __init__(
        self, sessions: Sessions, key: ServerKey, metrics: GatewayMetrics | None = None
    ) -> None:
        self.sessions = sessions
        self.metrics = metrics or GatewayMetrics(enabled=False)
        self.session_ids = SessionIds(key)
        self._key = key

    async def reset(
        self, session_id: str, data: dict[str, Any], base_url: str, *, reveal_session: bool
    ) -> dict[str, Any]:
        request_id = request_id_of(data.get("request_id"))
        reset = await self.sessions.reset(session_id, data.get("task_id"), request_id)
        metadata = reset_metadata(
            reset,
            session_id=session_id if reveal_session else None,
            episode_token=self._key.episode_token(reset.episode_id),
            mcp_url=f"{base_url}/episodes/{reset.episode_id}/mcp",
        )
        return reset_observation(metadata)

    async def step(self, session_id: str, action: dict[str, Any]) -> dict[str, Any]:
        """One `step`: a `call_tool` action (counts as a step) or `list_tools` (does not)."""
        kind = action.get("type", "call_tool")
        if kind == "list_tools":
            return tools_observation()
        if kind != "call_tool":
            raise SessionError(GatewayCode.validation_error, f"unknown action type {kind!r}")
        result = await self._call(session_id, action, path="step")
        return tool_observation(result)

    async def call_direct(
        self, session_id: str, name: object, arguments: object, request_id: object
    ) -> dict[str, Any]:
        """`tools/call` over `POST /mcp`: counts toward max_steps, returns no reward."""
        action = {"tool_name": name, "arguments": arguments, "request_id": request_id}
        result = await self._call(session_id, action, path="openenv_mcp")
        return tool_result_body(result)

    async def state(self, session_id: str) -> dict[str, Any]:
        try:
            episode_id = await self.sessions.episode_of(session_id)
        except SessionError:
            return state_body(None)
        return state_body(await self.sessions.status(episode_id))

    @staticmethod
    def tools() -> list[dict[str, Any]]:
        return tool_catalog()

    async def _call(self, session_id: str, action: dict[str, Any], path: ToolPath) -> Any:
        name = action.get("tool_name")
        arguments = action.get("arguments") or {}
        if not isinstance(name, str) or not name:
            raise SessionError(GatewayCode.validation_error, "a tool call needs tool_name")
        if not isinstance(arguments, dict):
            raise SessionError(
                GatewayCode.validation_error, "a tool call's arguments must be an object"
            )
        metadata = action.get("metadata")
        request_id = action.get("request_id")
        if request_id is None and isinstance(metadata, dict):
            request_id = metadata.get("request_id")
        call = tool_call(request_id_of(request_id), name, arguments, path)
        return await self.metrics.timed(call, self.sessions.call(session_id, call))
