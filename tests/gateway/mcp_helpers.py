"""An episode played over its standard MCP endpoint with the MCP SDK's own client (mcp 1.x)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from tests.gateway.server import ServerProcess

SUBMIT = {"script": "print('training')\n", "flavor": "cpu-basic", "timeout_minutes": 5}


async def create_episode(
    server: ServerProcess, task_id: str = "t0_artifact", headers: dict[str, str] | None = None
) -> dict[str, Any]:
    async with httpx.AsyncClient(headers=headers) as http:
        response = await http.post(
            f"{server.base_url}/episodes", json={"task_id": task_id}, timeout=60
        )
    assert response.status_code == 200, response.text
    return response.json()


@asynccontextmanager
async def mcp_session(
    episode: dict[str, Any], read_timeout_s: float = 300
) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {episode['episode_token']}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=read_timeout_s)) as http,
        streamable_http_client(episode["mcp_url"], http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def data(result: CallToolResult) -> dict[str, Any]:
    assert result.structuredContent is not None, result
    return result.structuredContent


async def wait_for_state(session: ClientSession, job_id: str, states: set[str]) -> int:
    """jobs_wait until the job is in one of `states`; the number of calls made."""
    calls = 0
    while True:
        calls += 1
        job = data(await session.call_tool("jobs_wait", {"job_id": job_id, "timeout_s": 60}))
        if job["state"] in states:
            return calls
        assert job["state"] in {"queued", "running"}, job
