"""The OpenEnv WebSocket, `/ws`: reset, step, state, close and JSON-RPC frames.

Two kinds of client use it. openenv 0.10 attaches to a session it created over `POST /mcp`
(`/ws?session_id=…`); its `close` frame only detaches the socket (the client reconnects with it),
and the session ends with `openenv/session/close`. openenv-core 0.3 connects without a session
id: the socket then owns a fresh session and its `close` frame ends the live episode. A dropped
connection never ends anything: the episode lives in Temporal and a client may come back.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect
from temporalio.service import RPCError

from mcp_gateway import jsonrpc
from mcp_gateway.bounds import MalformedJson, parse_json
from mcp_gateway.protocol import OpenEnvProtocol
from mcp_gateway.wire import JsonRpcRequest, WSErrorCode
from posttrain_common.failures import temporal_failure
from posttrain_env.errors import GatewayCode, SessionError

log = logging.getLogger(__name__)
# Sent for failures a retry with the same request id may fix (Temporal restarting, say).
UNAVAILABLE = GatewayCode.unavailable.value


def base_url_of(websocket: WebSocket) -> str:
    scheme = "https" if websocket.url.scheme == "wss" else "http"
    return f"{scheme}://{websocket.headers.get('host', 'localhost')}"


async def serve_openenv_ws(websocket: WebSocket, protocol: OpenEnvProtocol) -> None:
    await websocket.accept()
    requested = websocket.query_params.get("session_id")
    owns_session = requested is None
    ids = protocol.session_ids
    # A peer that has already gone is no error: sending or closing then raises
    # WebSocketDisconnect, which ends the loop quietly. The stock clients drop their socket right
    # after a `close` frame, so our answering close often meets a closed connection.
    try:
        try:
            session_id = ids.mint() if owns_session else ids.check(requested)
        except SessionError as err:
            await _send_error(websocket, err.message, err.code)
            await websocket.close(code=1008)
            return
        while True:
            raw = await websocket.receive_text()
            reply, stop = await _answer(websocket, protocol, session_id, raw, owns_session)
            if reply is not None:
                await websocket.send_text(json.dumps(reply))
            if stop:
                await websocket.close()
                return
    except WebSocketDisconnect:
        return  # a dropped connection does nothing (DESIGN §9)


async def _answer(
    websocket: WebSocket,
    protocol: OpenEnvProtocol,
    session_id: str,
    raw: str,
    owns_session: bool,
) -> tuple[dict[str, Any] | None, bool]:
    """The reply to one frame, and whether the socket should close after it."""
    try:
        message = parse_json(raw)
    except MalformedJson as exc:
        return _error(str(exc), WSErrorCode.INVALID_JSON), False
    if not isinstance(message, dict):
        return _error("a frame must be a JSON object", WSErrorCode.INVALID_JSON), False
    kind = message.get("type")
    data = message.get("data") or {}
    if not isinstance(data, dict):
        return _error("`data` must be an object", WSErrorCode.VALIDATION_ERROR), False
    try:
        match kind:
            case "reset":
                base = base_url_of(websocket)
                body = await protocol.reset(session_id, data, base, reveal_session=False)
                return {"type": "observation", "data": body}, False
            case "step":
                return {"type": "observation", "data": await protocol.step(session_id, data)}, False
            case "state":
                return {"type": "state", "data": await protocol.state(session_id)}, False
            case "close":
                if owns_session:  # no session id was given: closing the socket ends the session
                    await protocol.sessions.close(session_id)
                return None, True
            case "mcp":
                request = JsonRpcRequest.model_validate(data)
                response = await jsonrpc.handle(protocol, request, attached_session=session_id)
                return {"type": "mcp", "data": jsonrpc.dump(response)}, False
            case _:
                return _error(f"unknown message type {kind!r}", WSErrorCode.UNKNOWN_TYPE), False
    except SessionError as err:
        return _error(err.message, err.code), False
    except ValidationError as exc:
        return _error(
            f"invalid message: {exc.errors()[0]['msg']}", WSErrorCode.VALIDATION_ERROR
        ), False
    except RPCError as exc:
        log.warning("Temporal call failed for a %s frame: %s", kind, exc.status)
        answer = temporal_failure(exc)  # only UNAVAILABLE is worth sending again
        return _error(answer.message, answer.code), False
    except Exception:
        log.exception("a %s frame failed", kind)
        return _error("internal error; retry the same request", UNAVAILABLE), False


def _error(message: str, code: str) -> dict[str, Any]:
    # WSErrorCode is a str enum: send its value, not "WSErrorCode.X".
    return {"type": "error", "data": {"message": message, "code": getattr(code, "value", code)}}


async def _send_error(websocket: WebSocket, message: str, code: str) -> None:
    await websocket.send_text(json.dumps(_error(message, code)))
