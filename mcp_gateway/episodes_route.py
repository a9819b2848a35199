"""An episode for a client that speaks only MCP (DESIGN §9 "MCP-only clients"):

- `POST /episodes` starts one in a fresh session that nobody else holds and answers the
  episode's MCP endpoint and bearer token; the session id is not returned (the token is the
  capability). Behind the API keys when they are configured, like every route but the open ones.
- `GET /episodes/<id>`: its state, steps and time left, `service_spend` and `episode_end`, and
  a page of its jobs (`?cursor=`, `?limit=`).
- `DELETE /episodes/<id>`: ends it as `abandoned` (reward 0; its jobs cancelled and confirmed),
  answering 200 once nothing is live, or 202 while a cancellation is still unconfirmed. An
  episode already over keeps its end. Both take the episode token, not an API key.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from mcp_gateway.auth import episode_refusal
from mcp_gateway.bounds import JSON_OBJECT_BODY, read_json_object
from mcp_gateway.episode_control import EpisodeControl, InvalidPage, episode_body, state_of
from mcp_gateway.protocol import OpenEnvProtocol
from mcp_gateway.refusals import refusal_body
from posttrain_common.contracts.episode_calls import JobsPage
from posttrain_common.failures import EpisodeNotFound
from posttrain_common.keys import ServerKey
from posttrain_env.errors import GatewayCode

router = APIRouter()
ANSWERED = ("episode_id", "mcp_url", "episode_token", "prompt", "task")


@router.post("/episodes", openapi_extra=JSON_OBJECT_BODY)
async def create_episode(request: Request) -> Any:
    """Start an episode of `task_id`. Answers `episode_id`, `mcp_url`, `episode_token` (send it
    as `Authorization: Bearer <episode_token>` to `mcp_url`), `prompt` and the `task` limits."""
    body = await read_json_object(request)
    protocol: OpenEnvProtocol = request.app.state.protocol
    base = str(request.base_url).rstrip("/")
    reset = await protocol.reset(protocol.session_ids.mint(), body, base, reveal_session=False)
    return {key: reset["metadata"][key] for key in ANSWERED}


@router.get("/episodes/{episode_id}")
async def get_episode(episode_id: str, request: Request) -> Any:
    """The episode (`Authorization: Bearer <episode_token>`): `state` (running, ending while
    a cancellation is unconfirmed, ended), steps and time left, `service_spend`, `episode_end`
    (reason and reward) once it is over, and a page of its jobs, oldest first: `jobs`,
    `jobs_total` and `jobs_next_cursor` (pass it as `?cursor=` for the next page; `?limit=`
    sets the page's size, at most MAX_JOBS_PAGE)."""
    refused = _refused(request, episode_id)
    if refused is not None:
        return refused
    try:
        page = JobsPage.model_validate(
            {k: v for k, v in request.query_params.items() if k in ("cursor", "limit")}
        )
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return _bad_request(f"query parameter {where!r}: {first['msg']}")
    try:
        status = await _control(request).status(episode_id, page)
    except EpisodeNotFound:
        return _not_found()
    except InvalidPage as err:
        return _bad_request(str(err))
    return episode_body(status)


@router.delete("/episodes/{episode_id}")
async def end_episode(episode_id: str, request: Request) -> Any:
    """End the episode as `abandoned`, reward 0 (`Authorization: Bearer <episode_token>`):
    its live jobs are cancelled and, within 10 s, confirmed (200); 202 while one is not
    confirmed yet (GET shows when it is). An episode already over keeps its end and reward."""
    refused = _refused(request, episode_id)
    if refused is not None:
        return refused
    try:
        status = await _control(request).end(episode_id)
    except EpisodeNotFound:
        return _not_found()
    return JSONResponse(episode_body(status), 200 if state_of(status) == "ended" else 202)


def _control(request: Request) -> EpisodeControl:
    return request.app.state.episodes


def _refused(request: Request, episode_id: str) -> JSONResponse | None:
    key: ServerKey = request.app.state.key
    refusal = episode_refusal(key, episode_id, request.headers)
    if refusal is None:
        return None
    status, message = refusal
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(refusal_body(status, message, jsonrpc=False), status, headers=headers)


def _bad_request(message: str) -> JSONResponse:
    """A page of jobs that cannot be answered (a bad `limit`, a cursor not given here)."""
    body = {"detail": {"code": GatewayCode.validation_error.value, "message": message}}
    return JSONResponse(body, 400)


def _not_found() -> JSONResponse:
    message = "no such episode (it never started, or Temporal no longer keeps it)"
    return JSONResponse(refusal_body(404, message, jsonrpc=False), 404)
