"""The gateway's app factory: OpenEnv over WebSocket, JSON-RPC and HTTP, behind the host guard.

`create_app(settings, client, key)` builds it on a connected Temporal client. Every route
is stateless: sessions and episodes are workflows, found again from their ids.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Header, Request, WebSocket
from fastapi.responses import JSONResponse
from starlette.routing import Route
from temporalio.client import Client
from temporalio.service import RPCError

from mcp_gateway import jsonrpc
from mcp_gateway.auth import ApiKeyGuard
from mcp_gateway.bounds import JSON_OBJECT_BODY, read_json_object
from mcp_gateway.episode_control import EpisodeControl
from mcp_gateway.episode_mcp import EpisodeMcp
from mcp_gateway.episodes_route import router as episodes_router
from mcp_gateway.guard import HostOriginGuard
from mcp_gateway.metrics import GatewayMetrics, metrics_endpoint
from mcp_gateway.openenv_ws import serve_openenv_ws
from mcp_gateway.protocol import OpenEnvProtocol
from mcp_gateway.sessions import Sessions
from mcp_gateway.wire import (
    CallToolAction,
    CallToolObservation,
    EnvironmentMetadata,
    Observation,
    SchemaResponse,
    State,
)
from posttrain_common.failures import temporal_failure
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_common.version import installed_version
from posttrain_env.errors import GatewayCode, SessionError
from posttrain_env.limits import MAX_BODY_BYTES

log = logging.getLogger(__name__)
# At shutdown, requests in flight get this long to finish; then uvicorn cancels them. Without
# it uvicorn waits for every open call: a `jobs_wait` over /ws kept a stopping server alive for
# its whole 300 s. Cancelling loses nothing: the call lives in its episode's workflow, and the
# client re-sends it (same request id) to another replica or to this one restarted.
GATEWAY_GRACE_S = 10
SESSION_HEADER = "X-Session-Id"
VERSION = installed_version()
DESCRIPTION = (
    "An agent post-trains a language model with training jobs it submits through tools; a "
    "hidden-split score of its submitted checkpoint is the reward. Budgets in micro-USD, "
    "durable episodes on Temporal."
)


def uvicorn_config(app: FastAPI, host: str, port: int) -> uvicorn.Config:
    """How the gateway is served: WebSocket messages bounded like HTTP bodies (larger ones are
    closed with 1009 before they are read), no access log of uvicorn's own (ours has no query
    strings, which may hold a session id), a bounded shutdown (`GATEWAY_GRACE_S`)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,
        log_level="warning",
        lifespan="on",
        ws_max_size=MAX_BODY_BYTES,
        timeout_graceful_shutdown=GATEWAY_GRACE_S,
    )


def create_app(settings: Settings, client: Client, key: ServerKey) -> FastAPI:
    """The gateway, on a connected Temporal client and the deployment's server key (the entry
    point connects the one and resolves the other: posttrain_server/deployment_key.py)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.key = key
        app.state.protocol = OpenEnvProtocol(Sessions(client, settings.task_queue), key, metrics)
        app.state.episodes = EpisodeControl(client)
        async with episode_mcp.serving(client, key):
            yield

    # Every request body over the limit is refused with 413 before it is read whole.
    app = FastAPI(
        title="posttrain_env", version=VERSION, lifespan=lifespan, max_body_size=MAX_BODY_BYTES
    )
    metrics = GatewayMetrics(enabled=settings.metrics)
    # The standard MCP endpoint of each episode, behind its episode token (not the API keys).
    episode_mcp = EpisodeMcp(metrics)
    # Its route lifts the app's body limit (a route's limit replaces the app's): the endpoint
    # applies the same one itself, and answers 413 as a JSON-RPC error, which MCP clients show.
    app.router.routes.append(
        Route("/episodes/{episode_id}/mcp", endpoint=episode_mcp, max_body_size=sys.maxsize)
    )
    app.include_router(episodes_router)
    if settings.metrics:  # behind the API keys like every route (Prometheus sends a bearer key)
        app.add_api_route("/metrics", metrics_endpoint, methods=["GET"], include_in_schema=False)

    def protocol(request: Request) -> OpenEnvProtocol:
        return request.app.state.protocol

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/metadata")
    async def metadata() -> EnvironmentMetadata:
        return EnvironmentMetadata(name="posttrain_env", description=DESCRIPTION, version=VERSION)

    @app.get("/schema")
    async def schema() -> SchemaResponse:
        return SchemaResponse(
            action=CallToolAction.model_json_schema(),
            observation=CallToolObservation.model_json_schema(),
            reset_observation=Observation.model_json_schema(),
            state=State.model_json_schema(),
        )

    @app.post("/reset", openapi_extra=JSON_OBJECT_BODY)
    async def reset(request: Request) -> Any:
        """Start an episode (`task_id`). Without `session_id` a new session is made; its id is
        in the observation's metadata, for `/step` and `/state` (header `X-Session-Id`). Only
        ids the server issued are accepted."""
        body = await read_json_object(request)
        openenv = protocol(request)
        given = body.get("session_id") or request.headers.get(SESSION_HEADER)
        session_id = (
            openenv.session_ids.mint() if given is None else openenv.session_ids.check(given)
        )
        base = str(request.base_url).rstrip("/")
        return await openenv.reset(session_id, body, base, reveal_session=True)

    @app.post("/step", openapi_extra=JSON_OBJECT_BODY)
    async def step(request: Request) -> Any:
        """One action of the session named by `session_id` (body) or `X-Session-Id`."""
        body = await read_json_object(request)
        openenv = protocol(request)
        session_id = openenv.session_ids.check(
            body.get("session_id") or request.headers.get(SESSION_HEADER)
        )
        action = body.get("action")
        if not isinstance(action, dict):
            raise SessionError(GatewayCode.validation_error, "step needs an `action` object")
        if body.get("request_id") is not None:
            action = {**action, "request_id": body["request_id"]}
        return await openenv.step(session_id, action)

    @app.get("/state")
    async def state(
        request: Request, session: str | None = Header(default=None, alias=SESSION_HEADER)
    ) -> dict[str, Any]:
        openenv = protocol(request)
        return await openenv.state(openenv.session_ids.check(session))

    @app.post("/mcp")
    async def mcp(request: Request) -> dict[str, Any]:
        parsed = jsonrpc.parse_request(await request.body())
        if not isinstance(parsed, jsonrpc.JsonRpcRequest):
            return jsonrpc.dump(parsed)
        return jsonrpc.dump(await jsonrpc.handle(protocol(request), parsed))

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await serve_openenv_ws(websocket, websocket.app.state.protocol)

    @app.exception_handler(SessionError)
    async def session_error(_request: Request, err: SessionError) -> JSONResponse:
        statuses = {GatewayCode.no_episode.value: 409, GatewayCode.payload_too_large.value: 413}
        status = statuses.get(err.code, 400)
        return JSONResponse({"detail": {"code": err.code, "message": err.message}}, status)

    @app.exception_handler(RPCError)
    async def temporal_error(_request: Request, err: RPCError) -> JSONResponse:
        log.warning("Temporal call failed: %s", err.status)
        answer = temporal_failure(err)  # transient (503) or permanent, never guessed
        detail = {"code": answer.code.value, "message": answer.message}
        return JSONResponse({"detail": detail}, answer.status)

    app.add_middleware(ApiKeyGuard, api_keys=settings.api_key_list)
    # Outermost: refuses a foreign Host or Origin before any route runs (DESIGN §9).
    app.add_middleware(HostOriginGuard, allowed_hosts=settings.allowed_host_list)
    return app
