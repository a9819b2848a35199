"""The standard MCP endpoint of an episode: `/episodes/<episode_id>/mcp` (DESIGN §2, §9).

One MCP server for every episode, mounted once: the route carries the episode id, the bearer
token (`auth.episode_token_ok`) proves the caller holds that episode, and the tool handler reads
the id back from the HTTP request of the call. Streamable HTTP, stateless (any replica, or this
one after a restart, serves any call), SSE replies so that progress notifications can flow.

It is the SDK's low-level `Server` (what FastMCP wraps), not FastMCP: FastMCP derives schemas
from function signatures and validates arguments itself, which would answer a bad argument as
an untyped error that is not a step. Here the tools, schemas and descriptions are the one
catalogue (`posttrain_env.tools`), arguments go to the episode unchanged, and the episode answers
them exactly as on the OpenEnv path: the tool's data as structured content, errors as the typed
envelope `{"error": {"type", "message", ...}}` with `isError: true`. Every call is a step.

Long calls (`jobs_wait`, `dev_evaluate`, `submit`, or anything slow) send a progress
notification every `PROGRESS_EVERY_S` while the workflow update runs. The update lives in
Temporal: a client that disconnects cancels only our waiting, and may simply call again.

Request ids: MCP has none of ours, and JSON-RPC ids restart at 0 in every client session, so
each call gets a fresh one (`mcp-<uuid>`) and a resent call is a new call (a new step). A client
that wants a retry answered once sends its own id as `_meta.request_id` (1-200 printable ASCII
characters); the update id is then `<episode_id>:<request_id>`, as on every path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send
from temporalio.client import Client
from temporalio.service import RPCError

from mcp_gateway.auth import episode_refusal, headers_of
from mcp_gateway.bounds import MalformedJson, parse_json, read_bounded_body
from mcp_gateway.episode_calls import UnknownEpisode, call_tool, tool_call
from mcp_gateway.jsonrpc import has_valid_id
from mcp_gateway.metrics import GatewayMetrics
from mcp_gateway.refusals import refuse
from mcp_gateway.sessions import request_id_of
from posttrain_common.contracts.episode_calls import ToolResult
from posttrain_common.failures import temporal_failure
from posttrain_common.keys import ServerKey
from posttrain_common.version import installed_version
from posttrain_env.errors import ErrorType, SessionError, ToolError, is_error
from posttrain_env.limits import MAX_BODY_BYTES
from posttrain_env.tools import tool_catalog

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 5.0  # the contract is "at least every 10 s"
SERVER_NAME = "posttrain-env"  # with the installed version: the `serverInfo` clients see
# What the result's second text block says of the episode (all of it is in `_meta` too).
PROGRESS_KEYS = ("steps_used", "steps_left", "time_left_s", "done")
INSTRUCTIONS = (
    "You post-train a language model with training jobs you submit through these tools; "
    "call task_info first. Every tool call is a step of the episode (max_steps); submit ends it."
)


class EpisodeMcp:
    """The per-episode MCP endpoint as an ASGI app; `serving(client, key)` runs it."""

    def __init__(self, metrics: GatewayMetrics | None = None) -> None:
        self.metrics = metrics or GatewayMetrics(enabled=False)
        self.server: Server[Any, Request] = Server(
            SERVER_NAME, version=installed_version(), instructions=INSTRUCTIONS
        )
        self.server.list_tools()(self._list_tools)
        self.server.call_tool(validate_input=False)(self._call_tool)
        # The gateway's HostOriginGuard, outermost, already checks Host and Origin on this
        # route; the SDK's own check (exact, case-sensitive strings) would only disagree with it.
        self._manager = StreamableHTTPSessionManager(
            self.server,
            json_response=False,
            stateless=True,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            # The same body limit as every route; the arguments' own limit (1 MiB) is answered
            # by the episode as a typed error.
            max_request_body_size=MAX_BODY_BYTES,
        )
        self._client: Client | None = None
        self._key: ServerKey | None = None
        # The SDK logs every request at INFO, and warns of each call to a tool it does not list
        # (an agent's typo, answered as invalid_argument by the episode): noise in our log.
        logging.getLogger("mcp.server").setLevel(logging.WARNING)
        logging.getLogger("mcp.server.lowlevel.server").setLevel(logging.ERROR)

    @asynccontextmanager
    async def serving(self, client: Client, key: ServerKey) -> AsyncIterator[None]:
        """Run inside the app's lifespan (the SDK's session manager needs its task group)."""
        self._client, self._key = client, key
        async with self._manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The route `/episodes/{episode_id}/mcp`: a well-formed id, then its token."""
        episode_id = scope.get("path_params", {}).get("episode_id", "")
        assert self._key is not None, "serving() was not entered"
        refusal = episode_refusal(self._key, episode_id, headers_of(scope))
        if refusal is not None:
            await refuse(scope, receive, send, *refusal, jsonrpc=True)
            return
        if scope.get("method") == "POST":
            # The SDK's own parser fails with a 500 on deeply nested JSON: check it first, and
            # hand the SDK the body we read. Its size is bounded here, not by Starlette (the
            # route lifts Starlette's limit): Starlette's 413 is plain text, which MCP clients
            # do not show.
            request = Request(scope, receive)
            body = await read_bounded_body(request)
            if body is None:
                self.metrics.refused("body")
                message = f"the request body is over {MAX_BODY_BYTES} bytes; it was not read"
                await refuse(scope, receive, send, 413, message, jsonrpc=True)
                return
            try:
                message = parse_json(body)
            except MalformedJson as exc:
                await _rpc_error(-32700, str(exc))(scope, receive, send)
                return
            if not has_valid_id(message, null=False):  # MCP: never null
                # The SDK would take it for a notification (whose model lets an unknown `id`
                # through) and answer 202 with no reply at all.
                why = "a JSON-RPC request's id must be a string or an integer"
                await _rpc_error(-32600, why)(scope, receive, send)
                return
            receive = replay(body, receive)
        await self._manager.handle_request(scope, receive, send)

    async def _list_tools(self) -> list[types.Tool]:
        return [
            types.Tool(name=t["name"], description=t["description"], inputSchema=t["input_schema"])
            for t in tool_catalog()
        ]

    async def _call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        context = self.server.request_context
        assert context.request is not None and self._client is not None
        episode_id: str = context.request.path_params["episode_id"]  # checked by __call__
        meta = context.meta.model_dump() if context.meta else {}
        try:
            request_id = request_id_of(meta.get("request_id"))
        except SessionError as err:
            return _result(ToolError(ErrorType.invalid_argument, err.message).envelope())
        call = tool_call(request_id, name, arguments, "mcp")
        work = asyncio.ensure_future(
            self.metrics.timed(call, call_tool(self._client, episode_id, call))
        )
        try:
            answer = await self._wait_reporting_progress(work, name, meta.get("progressToken"))
        except UnknownEpisode:
            gone = ToolError(
                ErrorType.episode_over,
                "this episode no longer exists; start another with POST /episodes",
            )
            return _result(gone.envelope())
        except SessionError as err:  # permanent (e.g. too large to send): say so, typed
            return _result(ToolError(ErrorType.invalid_argument, err.message).envelope())
        except RPCError as err:
            log.warning("Temporal call failed for MCP %s: %s", name, err.status)
            answer = temporal_failure(err)
            if answer.retryable:
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=UNAVAILABLE)], isError=True
                )
            return _result(answer.tool_error().envelope())  # permanent: typed, not retryable
        finally:
            if not work.done():  # a dropped client: our waiting ends, the update goes on
                work.cancel()
                # Temporal's client reports the cancelled RPC as an error: retrieve it.
                work.add_done_callback(lambda w: w.cancelled() or w.exception())
        return _result(answer.data, {**answer.metadata.view("mcp"), "done": answer.done})

    async def _wait_reporting_progress(
        self, work: asyncio.Future[ToolResult], name: str, token: str | int | None
    ) -> ToolResult:
        started = time.monotonic()
        while True:
            done, _ = await asyncio.wait({work}, timeout=PROGRESS_EVERY_S)
            if done:
                return work.result()
            if token is None:
                continue
            elapsed = round(time.monotonic() - started, 1)
            context = self.server.request_context
            await context.session.send_progress_notification(
                token,
                elapsed,
                message=f"{name} is running ({elapsed:.0f} s); it goes on if you disconnect",
                related_request_id=str(context.request_id),
            )


UNAVAILABLE = "the episode service is temporarily unavailable; call again"


def _rpc_error(code: int, message: str) -> JSONResponse:
    """A JSON-RPC error for a request that cannot be answered, with HTTP 400 (as the SDK's)."""
    error = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return JSONResponse(error, 400)


def replay(body: bytes, receive: Receive) -> Receive:
    """An ASGI `receive` that hands over the already read `body` once, then passes on what the
    connection says next (a disconnect, which the SDK listens for while it streams a reply)."""
    sent = False

    async def replaying() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replaying


def _result(data: dict[str, Any], meta: dict[str, Any] | None = None) -> types.CallToolResult:
    """The tool's data as structured content and as JSON text; the episode's progress in
    `_meta` and, for clients that pass only a result's text to the model (Inspect), as a second
    text block `{"episode": {"steps_used", "steps_left", "time_left_s", "done"}}`."""
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=_json(data))]
    if meta is not None:
        progress = {key: meta[key] for key in PROGRESS_KEYS if key in meta}
        content.append(types.TextContent(type="text", text=_json({"episode": progress})))
    return types.CallToolResult(
        content=content,
        structuredContent=data,
        isError=is_error(data),
        _meta=meta,
    )


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))
