"""The gateway's app factory: OpenEnv over WebSocket, JSON-RPC and HTTP, behind the host guard.

`create_app(settings)` builds it; the Temporal client lives in the app's lifespan. Every route
is stateless: sessions and episodes are workflows, found again from their ids.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Body, FastAPI, Header, Request, WebSocket
from fastapi.responses import JSONResponse
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import (
    EnvironmentMetadata,
    Observation,
    SchemaResponse,
    State,
)
from starlette.routing import Route
from temporalio.client import Client
from temporalio.service import RPCError

from activities.keys import ServerKey
from mcp_gateway import jsonrpc
from mcp_gateway.auth import ApiKeyGuard
from mcp_gateway.episode_mcp import EpisodeMcp
from mcp_gateway.episodes_route import router as episodes_router
from mcp_gateway.guard import HostOriginGuard
from mcp_gateway.openenv_ws import serve_openenv_ws
from mcp_gateway.protocol import OpenEnvProtocol
from mcp_gateway.sessions import SessionError, Sessions, check_session_id, new_session_id
from posttrain_env.settings import Settings

log = logging.getLogger(__name__)
SESSION_HEADER = "X-Session-Id"
DESCRIPTION = (
    "An agent post-trains a language model with training jobs it submits through tools; a "
    "hidden-split score of its submitted checkpoint is the reward. Budgets in micro-USD, "
    "durable episodes on Temporal."
)


def create_app(settings: Settings, client: Client | None = None) -> FastAPI:
    """The gateway. `client`: an already connected Temporal client (tests); None: connect to
    `settings.temporal_address` at start-up."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from posttrain_env.worker import connect

        temporal = client or await connect(settings)
        key = ServerKey.load_or_create(settings.state_dir / "server.key")
        app.state.protocol = OpenEnvProtocol(Sessions(temporal, settings.task_queue), key)
        async with episode_mcp.serving(temporal, key):
            yield

    app = FastAPI(title="posttrain_env", version="0.1.0", lifespan=lifespan)
    # The standard MCP endpoint of each episode, behind its episode token (not the API keys).
    episode_mcp = EpisodeMcp()
    app.router.routes.append(Route("/episodes/{episode_id}/mcp", endpoint=episode_mcp))
    app.include_router(episodes_router)

    def protocol(request: Request) -> OpenEnvProtocol:
        return request.app.state.protocol

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/metadata")
    async def metadata() -> EnvironmentMetadata:
        return EnvironmentMetadata(name="posttrain_env", description=DESCRIPTION, version="0.1.0")

    @app.get("/schema")
    async def schema() -> SchemaResponse:
        return SchemaResponse(
            action=CallToolAction.model_json_schema(),
            observation=CallToolObservation.model_json_schema(),
            reset_observation=Observation.model_json_schema(),
            state=State.model_json_schema(),
        )

    @app.post("/reset")
    async def reset(request: Request, body: Annotated[dict[str, Any], Body()]) -> Any:
        """Start an episode (`task_id`). Without `session_id` a new session is made; its id is
        in the observation's metadata, for `/step` and `/state` (header `X-Session-Id`)."""
        given = body.get("session_id") or request.headers.get(SESSION_HEADER)
        session_id = new_session_id() if given is None else check_session_id(given)
        base = str(request.base_url).rstrip("/")
        return await protocol(request).reset(session_id, body, base, reveal_session=True)

    @app.post("/step")
    async def step(request: Request, body: Annotated[dict[str, Any], Body()]) -> Any:
        """One action of the session named by `session_id` (body) or `X-Session-Id`."""
        session_id = check_session_id(body.get("session_id") or request.headers.get(SESSION_HEADER))
        action = body.get("action")
        if not isinstance(action, dict):
            raise SessionError("VALIDATION_ERROR", "step needs an `action` object")
        if body.get("request_id") is not None:
            action = {**action, "request_id": body["request_id"]}
        return await protocol(request).step(session_id, action)

    @app.get("/state")
    async def state(
        request: Request, session: str | None = Header(default=None, alias=SESSION_HEADER)
    ) -> dict[str, Any]:
        return await protocol(request).state(check_session_id(session))

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
        status = 409 if err.code == "NO_EPISODE" else 400
        return JSONResponse({"detail": {"code": err.code, "message": err.message}}, status)

    @app.exception_handler(RPCError)
    async def temporal_error(_request: Request, err: RPCError) -> JSONResponse:
        log.warning("Temporal call failed: %s", err.status)
        detail = {"code": "UNAVAILABLE", "message": "the episode service is unavailable; retry"}
        return JSONResponse({"detail": detail}, 503)

    app.add_middleware(ApiKeyGuard, api_keys=settings.api_key_list)
    # Outermost: refuses a foreign Host or Origin before any route runs (DESIGN §9).
    app.add_middleware(HostOriginGuard, allowed_hosts=settings.allowed_host_list)
    return app
