"""`PostTrainEnv`: openenv's MCP tool client, made durable for hours-long episodes.

What it adds to the stock client:

- every `reset` and `step` carries a request id, which the gateway turns into the Temporal
  update id, so sending it again can never apply it twice;
- a dropped socket or a restarting server is ridden out: it reconnects to the same session (a
  session lives in Temporal, so any gateway serves it) and re-sends the in-flight request with
  the same id, for up to `reconnect_timeout_s`;
- a reply that does not come within `message_timeout_s` raises `TimeoutError` and the socket is
  dropped, so a late reply can never be read as the answer to a later request;
- a request the server can never take (larger than its limit) raises `RequestTooLarge` at
  once, and an error the server marks as permanent is never re-sent;
- `episode_id` names the current episode, and `end_episode()` ends it as `abandoned` (reward 0,
  its jobs cancelled) with its final spend;
- `iter_jobs()` lists every job of the episode, following `jobs_status`'s pages.

Client code only: importing it pulls in no server module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

from posttrain_env.openenv_light import load as load_openenv

load_openenv()  # before the first import of openenv: without its Gradio web UI

from openenv.core.client_types import StepResult
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Observation
from openenv.core.mcp_client import MCPToolClient
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.frames import CloseCode

from posttrain_env.errors import GatewayCode, ToolError, is_error
from posttrain_env.limits import MAX_ARGUMENTS_BYTES, MAX_BODY_BYTES, MAX_JOBS_PAGE

log = logging.getLogger(__name__)
# Error frames with this code are worth re-sending (the gateway could not reach Temporal); every
# other code is permanent.
RETRYABLE_CODES = frozenset({GatewayCode.unavailable.value})


class RequestTooLarge(ValueError):
    """The request is larger than the server accepts; sending it again cannot succeed."""


class PostTrainEnv(MCPToolClient):
    """The posttrain_env client. `reconnect_timeout_s`: how long one request keeps trying
    to reach the server across dropped connections and restarts before it fails."""

    def __init__(self, base_url: str, *, reconnect_timeout_s: float = 300.0, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.reconnect_timeout_s = reconnect_timeout_s
        self._episode_id: str | None = None
        # The current episode's token (a capability: kept in memory, never logged).
        self._episode_token: str | None = None

    @property
    def episode_id(self) -> str | None:
        """The episode the last `reset` started (None before the first)."""
        return self._episode_id

    # -- the OpenEnv operations, durable ----------------------------------------------------

    async def _reset_async(self, **kwargs: Any) -> StepResult[Observation]:
        data = {**kwargs, "request_id": kwargs.get("request_id") or uuid.uuid4().hex}
        response = await self._exchange({"type": "reset", "data": data})
        result = self._parse_result(response.get("data", {}))
        metadata = result.observation.metadata
        self._episode_id = metadata.get("episode_id", self._episode_id)
        self._episode_token = metadata.get("episode_token", self._episode_token)
        return result

    async def end_episode(self) -> dict[str, Any]:
        """End the current episode as `abandoned` (reward 0; its live jobs cancelled and
        confirmed) through `DELETE /episodes/<id>`; an episode already over keeps its end. The
        answer: `state` (`ended`, or `ending` while a cancellation is unconfirmed),
        `service_spend`, `episode_end`. Raises RuntimeError before any reset, or when the server
        refuses (the status and its message)."""
        import httpx

        if self._episode_id is None or self._episode_token is None or self._base_url is None:
            raise RuntimeError("no episode to end: reset first")
        headers = {**(self._headers or {}), "Authorization": f"Bearer {self._episode_token}"}
        async with httpx.AsyncClient(timeout=self._connect_timeout + 60.0) as http:
            response = await http.delete(
                f"{self._base_url}/episodes/{self._episode_id}", headers=headers
            )
        if response.status_code not in (200, 202):
            raise RuntimeError(f"ending the episode was refused: HTTP {response.status_code}")
        return response.json()

    async def _step_async(self, action: Any, **kwargs: Any) -> StepResult[Observation]:
        payload = self._step_payload(action)
        if isinstance(action, CallToolAction):
            # A fresh id per call: re-sending *this* call is safe, and repeating an action object
            # on purpose (a wait loop) still runs it again.
            request_id = action.metadata.get("request_id") or uuid.uuid4().hex
            payload["metadata"] = {**action.metadata, "request_id": request_id}
        response = await self._exchange({"type": "step", "data": payload})
        return self._parse_result(response.get("data", {}))

    async def iter_jobs(self, limit: int = MAX_JOBS_PAGE) -> AsyncIterator[dict[str, Any]]:
        """Every job of the current episode, oldest first: `jobs_status` asked page by page
        (`limit` jobs a page, each page a step), following `next_cursor` to the last page. A
        job started meanwhile is listed on a later page; none is listed twice. An error answer
        raises ToolError."""
        cursor: str | None = None
        while True:
            arguments: dict[str, Any] = {"limit": limit}
            if cursor is not None:
                arguments["cursor"] = cursor
            result = await self._step_async(
                CallToolAction(tool_name="jobs_status", arguments=arguments)
            )
            page = (getattr(result.observation, "result", None) or {}).get("data")
            if not isinstance(page, dict):
                raise RuntimeError(f"jobs_status answered no page: {result.observation}")
            if is_error(page):
                raise ToolError.from_envelope(page)
            for job in page["jobs"]:
                yield job
            cursor = page.get("next_cursor")
            if cursor is None:
                return

    async def _state_async(self) -> Any:
        response = await self._exchange({"type": "state"})
        return self._parse_state(response.get("data", {}))

    # -- transport ------------------------------------------------------------------------

    async def _connect_async(self) -> PostTrainEnv:
        """Open the socket on this client's session, creating the session once.

        Unlike the stock client, a failure here never closes the session: the episode must
        survive a server that is briefly away."""
        if self._ws is not None:
            if self._ws.state.name == "OPEN" and self._ws_loop is asyncio.get_running_loop():
                return self
            self._drop_socket()
        await self._drain_pending_close_tasks()
        session_id = await self._ensure_production_session()
        assert self._ws_url is not None
        url = f"{self._ws_url}?{urlencode({'session_id': session_id})}"
        try:
            self._ws = await ws_connect(
                url,
                open_timeout=self._connect_timeout,
                max_size=self._max_message_size,
                ping_interval=self._websocket_ping_interval_s,
                ping_timeout=self._websocket_ping_timeout_s,
                additional_headers=self._headers,
                proxy=None,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status < 500:  # refused (403: Host/Origin, 401: a key is needed): final
                raise RuntimeError(f"the server refused the connection: HTTP {status}") from exc
            raise ConnectionError(f"cannot reach {self._base_url}: HTTP {status}") from exc
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            raise ConnectionError(f"cannot reach {self._base_url}: {exc}") from exc
        self._ws_loop = asyncio.get_running_loop()
        return self

    async def _exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send `message` and return its reply, re-sending it (same request id) across dropped
        connections, server restarts and retryable error frames until `reconnect_timeout_s`.

        Raises TimeoutError when no reply arrives within `message_timeout_s` (the socket is
        dropped first), ConnectionError when the server stays unreachable, RequestTooLarge for a
        request the server refused for its size, RuntimeError for any other error frame that
        re-sending cannot fix."""
        frame = json.dumps(message)
        if len(frame.encode()) > MAX_BODY_BYTES:
            raise RequestTooLarge(
                f"the request is {len(frame.encode())} bytes; the server takes at most "
                f"{MAX_BODY_BYTES} (a tool call's arguments at most {MAX_ARGUMENTS_BYTES})"
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reconnect_timeout_s
        delay = 0.2
        while True:
            problem: str
            try:
                await self._connect_async()
                assert self._ws is not None
                await self._ws.send(frame)
                response = await self._receive()  # drops the socket on a timeout
            except (TimeoutError, asyncio.CancelledError):
                raise
            except ConnectionClosed as exc:
                self._drop_socket()
                if exc.rcvd is not None and exc.rcvd.code == CloseCode.MESSAGE_TOO_BIG:
                    # Permanent: the same request would be refused again.
                    raise RequestTooLarge(
                        f"the server refused the request as too large: {exc.rcvd.reason}"
                    ) from None
                problem = f"connection lost ({type(exc).__name__})"
            except (ConnectionError, OSError) as exc:
                self._drop_socket()
                problem = f"connection lost ({type(exc).__name__})"
            except Exception as exc:  # e.g. httpx errors while creating the session
                if not _is_transport_error(exc):
                    raise
                self._drop_socket()
                problem = f"server unreachable ({type(exc).__name__})"
            else:
                if response.get("type") != "error":
                    return response
                error = response.get("data") or {}
                if error.get("code") == GatewayCode.payload_too_large.value:
                    raise RequestTooLarge(
                        f"the server refused the request as too large: {error.get('message')}"
                    )
                if error.get("code") not in RETRYABLE_CODES:
                    raise RuntimeError(
                        f"Server error: {error.get('message', 'unknown error')} "
                        f"(code: {error.get('code', 'UNKNOWN')})"
                    )
                problem = str(error.get("message"))
            if loop.time() + delay > deadline:
                raise ConnectionError(
                    f"gave up after {self.reconnect_timeout_s} s: {problem}; the request can be "
                    "sent again safely"
                )
            log.info("%s; re-sending in %.1f s", problem, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _drop_socket(self) -> None:
        """Forget the socket without a close frame (it may be dead); close it in the background."""
        ws = self._ws
        self._ws = None
        self._ws_loop = None
        if ws is not None:
            self._schedule_socket_close(ws)


def _is_transport_error(exc: Exception) -> bool:
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500
    return isinstance(exc, httpx.TransportError)
