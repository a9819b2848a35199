"""OpenEnv's JSON-RPC methods, served on `POST /mcp` and inside `{"type": "mcp"}` WebSocket frames.

`openenv/session/create` hands out a new session id (nothing is stored: the id itself resolves
to the session's workflow); `openenv/session/close` ends the session's live episode as
cancelled; `tools/list`; `tools/call` runs a tool directly — it counts toward `max_steps` and
obeys the time limit like any call, but returns no reward (DESIGN §9).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from mcp_gateway.bounds import MalformedJson, parse_json
from mcp_gateway.protocol import OpenEnvProtocol
from mcp_gateway.wire import JsonRpcErrorCode, JsonRpcRequest, JsonRpcResponse
from posttrain_env.errors import SessionError

log = logging.getLogger(__name__)


def has_valid_id(message: object, *, null: bool) -> bool:
    """False for a JSON-RPC message whose `id` is there but neither a string nor an integer (an
    object, an array, a fraction, a boolean; null unless `null`: JSON-RPC allows it, MCP not).
    A model would otherwise take `true` for 1, or (the MCP SDK's) an object id for a
    notification's unknown key."""
    if not isinstance(message, dict) or "id" not in message:
        return True  # a notification, or not an object at all (the caller's parser says so)
    rid = message["id"]
    if rid is None:
        return null
    return isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool))


def parse_request(body: bytes | str) -> JsonRpcRequest | JsonRpcResponse:
    """The request, or the JSON-RPC error response for a body that is not one (a parse error
    for JSON nested deeper than MAX_JSON_DEPTH, too)."""
    try:
        message = parse_json(body)
        if not has_valid_id(message, null=True):
            return JsonRpcResponse.error_response(
                JsonRpcErrorCode.INVALID_REQUEST,
                "not a JSON-RPC 2.0 request: its id must be a string, an integer or null",
            )
        return JsonRpcRequest.model_validate(message)
    except MalformedJson as exc:
        return JsonRpcResponse.error_response(JsonRpcErrorCode.PARSE_ERROR, str(exc))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return JsonRpcResponse.error_response(
            JsonRpcErrorCode.INVALID_REQUEST, f"not a JSON-RPC 2.0 request: {problems}"
        )


async def handle(
    protocol: OpenEnvProtocol, request: JsonRpcRequest, attached_session: str | None = None
) -> JsonRpcResponse:
    """Answer one request. `attached_session`: the session of the WebSocket it arrived on."""
    rid = request.id
    params = request.params
    try:
        match request.method:
            case "openenv/session/create":
                return JsonRpcResponse.success(
                    {"session_id": attached_session or protocol.session_ids.mint()}, rid
                )
            case "openenv/session/close":
                session_id = protocol.session_ids.check(params.get("session_id"))
                confirmed = await protocol.sessions.close(session_id)
                return JsonRpcResponse.success(
                    {"session_id": session_id, "closed": confirmed, "closing": not confirmed}, rid
                )
            case "tools/list":
                return JsonRpcResponse.success({"tools": protocol.tools()}, rid)
            case "tools/call":
                session_id = protocol.session_ids.check(
                    params.get("session_id") or attached_session
                )
                body = await protocol.call_direct(
                    session_id,
                    params.get("name"),
                    params.get("arguments") or {},
                    params.get("request_id"),
                )
                return JsonRpcResponse.success(body, rid)
            case _:
                return JsonRpcResponse.error_response(
                    JsonRpcErrorCode.METHOD_NOT_FOUND,
                    f"method {request.method!r} is not served here; the standard MCP endpoint "
                    "of an episode is /episodes/<episode_id>/mcp",
                    request_id=rid,
                )
    except SessionError as err:
        return JsonRpcResponse.error_response(
            JsonRpcErrorCode.INVALID_PARAMS, err.message, {"code": err.code}, rid
        )
    except Exception:
        log.exception("JSON-RPC %s failed", request.method)
        return JsonRpcResponse.error_response(
            JsonRpcErrorCode.INTERNAL_ERROR, "internal error; the call may be retried", None, rid
        )


def dump(response: JsonRpcResponse) -> dict[str, Any]:
    return response.model_dump(mode="json")
