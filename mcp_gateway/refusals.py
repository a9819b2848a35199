"""The gateway's refusals before a route runs (401, 403, 404, 413), in the form each client reads.

A plain route answers `{"detail": {"code", "message"}}`. An episode's MCP endpoint answers the
same code and message as a JSON-RPC error as well (`{"jsonrpc": "2.0", "id": null, "error":
{"code", "message", "data": {"code", "status"}}}`, `detail` kept beside it): MCP clients of the
2.x SDK line (fastmcp, inspect-ai, the OpenAI Agents SDK) show the body of a non-2xx answer only
when it is a JSON-RPC error, and print "Server returned an error response" otherwise.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

# An episode's MCP endpoint: its refusals are JSON-RPC errors too.
EPISODE_MCP_PATH = re.compile(r"/episodes/[^/]+/mcp")
# Our code for each status, and a JSON-RPC error code for it from the range JSON-RPC leaves to
# servers (-32000 to -32099; no standard code exists for any of these), clear of the codes the
# MCP SDKs give meaning to: -32000 connection closed, -32001 request timeout (inspect-ai reads a
# -32001 as "the tool timed out"), -32020 to -32022, -32042.
CODES = {401: "UNAUTHORIZED", 403: "FORBIDDEN", 404: "NOT_FOUND", 413: "PAYLOAD_TOO_LARGE"}
JSONRPC_CODES = {401: -32010, 403: -32013, 404: -32014, 413: -32030}


def refusal_body(status: int, message: str, *, jsonrpc: bool) -> dict[str, Any]:
    code = CODES[status]
    body: dict[str, Any] = {"detail": {"code": code, "message": message}}
    if jsonrpc:
        body = {
            "jsonrpc": "2.0",
            "id": None,  # the request is refused before its body is read
            "error": {
                "code": JSONRPC_CODES[status],
                "message": message,
                "data": {"code": code, "status": status},
            },
            **body,
        }
    return body


async def refuse(
    scope: Scope, receive: Receive, send: Send, status: int, message: str, *, jsonrpc: bool = False
) -> None:
    """A JSON refusal for HTTP; for a WebSocket the same response as the handshake's answer
    where the server supports it (uvicorn does), else a close before accept (HTTP 403)."""
    response = JSONResponse(
        refusal_body(status, message, jsonrpc=jsonrpc),
        status,
        headers={"WWW-Authenticate": "Bearer"} if status == 401 else None,
    )
    if scope["type"] == "websocket" and "websocket.http.response" not in scope.get(
        "extensions", {}
    ):
        await send({"type": "websocket.close", "code": 1008})
        return
    await response(scope, receive, send)
