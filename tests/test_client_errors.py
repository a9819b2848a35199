"""How `PostTrainEnv` treats the gateway's error frames: only UNAVAILABLE is sent again (for up
to `reconnect_timeout_s`); a request refused for its size raises `RequestTooLarge` at once, any
other permanent refusal a RuntimeError at once. A real WebSocket server on this machine answers
every frame with the error under test (the session, made over HTTP by the stock client, is
given)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from openenv.core.env_server.mcp_types import CallToolAction
from websockets.asyncio.server import ServerConnection, serve

from posttrain_env.client import PostTrainEnv, RequestTooLarge
from posttrain_env.errors import GatewayCode


class Answering:
    """A WebSocket server that answers every frame with one error frame, counting frames."""

    def __init__(self, code: GatewayCode) -> None:
        self.code = code
        self.frames = 0

    async def handle(self, ws: ServerConnection) -> None:
        async for _ in ws:
            self.frames += 1
            await ws.send(
                json.dumps({"type": "error", "data": {"code": self.code, "message": "no"}})
            )


@asynccontextmanager
async def client_of(
    code: GatewayCode, monkeypatch: pytest.MonkeyPatch, reconnect_timeout_s: float = 30.0
) -> AsyncIterator[tuple[PostTrainEnv, Answering]]:
    answering = Answering(code)
    async with serve(answering.handle, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]

        async def session(_self: Any) -> str:
            return "s" * 64

        monkeypatch.setattr(PostTrainEnv, "_ensure_production_session", session)
        env = PostTrainEnv(
            base_url=f"http://127.0.0.1:{port}", reconnect_timeout_s=reconnect_timeout_s
        )
        try:
            yield env, answering
        finally:
            await env.close()


STEP = CallToolAction(tool_name="task_info", arguments={})


async def test_a_payload_too_large_frame_raises_request_too_large_and_is_not_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with client_of(GatewayCode.payload_too_large, monkeypatch) as (env, server):
        with pytest.raises(RequestTooLarge, match="too large"):
            await env.step(STEP)
        assert server.frames == 1


async def test_a_refused_frame_raises_at_once_and_is_not_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with client_of(GatewayCode.refused, monkeypatch) as (env, server):
        with pytest.raises(RuntimeError, match="REFUSED"):
            await env.step(STEP)
        assert server.frames == 1


async def test_an_unavailable_frame_is_sent_again_until_the_reconnect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with client_of(GatewayCode.unavailable, monkeypatch, reconnect_timeout_s=1.0) as (
        env,
        server,
    ):
        started = time.monotonic()
        with pytest.raises(ConnectionError, match=r"gave up after 1\.0 s"):
            await env.step(STEP)
        assert server.frames >= 2
        assert time.monotonic() - started < 10  # bounded by reconnect_timeout_s
