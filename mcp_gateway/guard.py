"""Host and Origin checks on every route, and an access log without query strings (DESIGN §9).

A browser page can open a WebSocket to 127.0.0.1 (cross-site WebSockets are not blocked by the
same-origin policy), and a DNS-rebound page reaches the server under its own host name. So every
HTTP request and WebSocket must name an allowed host in `Host`, and an `Origin`, when a browser
sends one, must be an allowed host too. Non-browser clients send no `Origin`.

The access log carries method, path and status only: `/ws?session_id=…` holds a capability.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_gateway.refusals import EPISODE_MCP_PATH, refuse

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
access_log = logging.getLogger("posttrain_env.access")


def host_name(value: str) -> str:
    """`example.org:8000` -> `example.org`; `[::1]:8000` -> `::1`."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class HostOriginGuard:
    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] = ()) -> None:
        self._app = app
        self._allowed = LOOPBACK_HOSTS | {host_name(h) for h in allowed_hosts if h.strip()}

    def refusal(self, scope: Scope) -> str | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host")
        if host is None or host_name(host) not in self._allowed:
            return "host not allowed"
        origin = headers.get("origin")
        if origin is not None:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or (
                (parts.hostname or "") not in self._allowed
            ):
                return "origin not allowed"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self._app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        started = time.monotonic()
        status = {"code": 0}

        async def send_logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        if refusal is not None:
            if scope["type"] == "websocket":
                # Closing before accepting makes the server answer the handshake with 403.
                await send({"type": "websocket.close", "code": 1008})
            else:
                mcp = EPISODE_MCP_PATH.fullmatch(scope["path"]) is not None
                await refuse(scope, receive, send, 403, refusal, jsonrpc=mcp)
            access_log.warning("%s %s refused: %s", _method(scope), scope["path"], refusal)
            return
        try:
            await self._app(scope, receive, send_logged)
        finally:
            access_log.info(
                "%s %s %s %.1f ms",
                _method(scope),
                scope["path"],
                status["code"] or "-",
                (time.monotonic() - started) * 1000,
            )


def _method(scope: Scope) -> str:
    return "WS" if scope["type"] == "websocket" else scope.get("method", "?")
