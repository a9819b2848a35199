"""Bounds at the edge: JSON nesting, and where the body limits are set (DESIGN §10).

Bodies: an HTTP request body over MAX_BODY_BYTES is refused with 413 before it is read whole, on
every route, by Starlette's own `RequestBodyLimitMiddleware` (`FastAPI(max_body_size=...)` in
`create_app`): a declared length at the first read, a streamed body as soon as it passes the
limit. The one exception is an episode's MCP endpoint, which MCP clients read only as JSON-RPC:
its route lifts Starlette's limit and `read_bounded_body` applies the same one, so that its 413
can be a JSON-RPC error (mcp_gateway/refusals.py). WebSocket messages have the same limit, set
on the server (`ws_max_size` in `uvicorn_config`), which closes the socket with 1009 without
reading the message.

`parse_json` refuses nesting deeper than MAX_JSON_DEPTH as malformed, instead of letting the
parser's recursion fail with a 500.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from posttrain_env.errors import GatewayCode, SessionError
from posttrain_env.limits import MAX_BODY_BYTES, MAX_JSON_DEPTH

# Routes read their JSON body themselves (bounded, depth-checked); this documents it in OpenAPI.
JSON_OBJECT_BODY: dict[str, Any] = {
    "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}}
}


class MalformedJson(ValueError):
    """Not JSON, or JSON nested deeper than MAX_JSON_DEPTH."""


def parse_json(raw: bytes | str) -> Any:
    """The JSON value of `raw`. Raises MalformedJson with a reason a client can act on."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise MalformedJson(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise MalformedJson(f"invalid JSON: {exc}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise MalformedJson(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


async def read_bounded_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes | None:
    """The request's body, or None as soon as it is known to be over `limit` bytes (a declared
    length before anything is read, a streamed body once it passes the limit)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_object(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object. Raises SessionError INVALID_JSON otherwise."""
    try:
        value = parse_json(await request.body())
    except MalformedJson as exc:
        raise SessionError(GatewayCode.invalid_json, str(exc)) from None
    if not isinstance(value, dict):
        raise SessionError(GatewayCode.invalid_json, "the body must be a JSON object")
    return value


def _depth(value: Any) -> int:
    """How deeply containers nest in `value` (a scalar is 0), without recursion."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        todo.extend((child, level) for child in children)
    return deepest
