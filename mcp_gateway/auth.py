"""Who may use the gateway: API keys for the server's routes, episode tokens for an episode's
MCP endpoint (DESIGN §6 item 6, §9 "MCP-only clients").

- API keys (`POSTTRAIN_API_KEYS`, comma-separated) are required whenever the server binds
  anything but loopback or runs the `hf` backend. When set, every route but the open ones needs
  `Authorization: Bearer <key>` or `X-API-Key: <key>`, else 401. Open: `/health`, `/metadata`,
  `/schema` and `/openapi.json` (they describe the server, hold no episode, and are what
  `openenv validate` reads first), and an episode's own routes (`/episodes/<id>/mcp`, `GET` and
  `DELETE /episodes/<id>`), which take its episode's token.
- An episode token is an HMAC of the episode id under the server key (`ServerKey`), so any
  replica can check it and nothing is stored. It opens only its own episode's routes.

Keys and tokens are compared in constant time and never logged; refusals say what is missing
without echoing what was sent.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_gateway.refusals import refuse
from posttrain_common.keys import ServerKey
from workflows.ids import EPISODE_ID

OPEN_PATHS = frozenset({"/health", "/metadata", "/schema", "/openapi.json"})
# An episode's own routes (its MCP endpoint, GET and DELETE): behind its episode token instead.
EPISODE_ROUTES = re.compile(r"/episodes/[^/]+(?:/mcp)?")


def headers_of(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def bearer(headers: Mapping[str, str]) -> str | None:
    """The credential of `Authorization: Bearer <credential>`, or None."""
    scheme, _, credential = headers.get("authorization", "").partition(" ")
    credential = credential.strip()
    return credential if scheme.lower() == "bearer" and credential else None


def matches_any(given: str, expected: Iterable[str]) -> bool:
    """Constant-time membership: every candidate is compared, whatever matched first."""
    given_bytes = given.encode()
    found = False
    for candidate in expected:
        found |= hmac.compare_digest(given_bytes, candidate.encode())
    return found


def episode_token_ok(key: ServerKey, episode_id: str, token: str | None) -> bool:
    return token is not None and hmac.compare_digest(
        token.encode(), key.episode_token(episode_id).encode()
    )


TOKEN_NEEDED = (
    "send `Authorization: Bearer <episode_token>` with this episode's token (from POST /episodes "
    "or the reset metadata)"
)


def episode_refusal(
    key: ServerKey, episode_id: str, headers: Mapping[str, str]
) -> tuple[int, str] | None:
    """Why a request to an episode's own route is refused (status, message), or None: an id
    that cannot be an episode is not found (Temporal is not asked), a missing or wrong token is
    unauthorized."""
    if not EPISODE_ID.fullmatch(episode_id):
        return 404, "no such episode"
    if not episode_token_ok(key, episode_id, bearer(headers)):
        return 401, TOKEN_NEEDED
    return None


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def start_refusal(
    host: str, api_keys: list[str], *, backend: str, spends_money: bool
) -> str | None:
    """Why the server must not start with these settings, or None (DESIGN §6 item 6).
    `spends_money`: what the backend called `backend` declares (its `Capabilities`)."""
    if api_keys:
        return None
    if not is_loopback(host):
        return (
            f"refusing to bind {host}: a server reachable from a network needs API keys. "
            "Set POSTTRAIN_API_KEYS (comma-separated random strings, e.g. from "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`) or bind 127.0.0.1."
        )
    if spends_money:
        return (
            f"refusing to start the {backend} backend without API keys: it spends money. "
            "Set POSTTRAIN_API_KEYS (comma-separated random strings)."
        )
    return None


class ApiKeyGuard:
    """Every route but the open ones needs an API key, when keys are configured."""

    def __init__(self, app: ASGIApp, api_keys: Iterable[str] = ()) -> None:
        self._app = app
        self._keys = [key for key in api_keys if key]

    def allowed(self, scope: Scope) -> bool:
        path = scope["path"]
        if not self._keys or path in OPEN_PATHS or EPISODE_ROUTES.fullmatch(path):
            return True
        headers = headers_of(scope)
        given = bearer(headers) or headers.get("x-api-key", "").strip()
        return bool(given) and matches_any(given, self._keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and not self.allowed(scope):
            await refuse(
                scope,
                receive,
                send,
                401,
                "an API key is required: send `Authorization: Bearer <key>` or `X-API-Key`",
            )
            return
        await self._app(scope, receive, send)
