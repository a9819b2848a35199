"""`PostTrainEnv.iter_jobs` follows `jobs_status`'s pages to the last one: every job once, in
order, each page one step with the cursor it was given. A real WebSocket server on this machine
answers the pages (the gateway's frames, built by the gateway's own code); the same over the
real server is in tests/gateway/test_jobs_paging.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from mcp_gateway.observations import tool_observation
from posttrain_common.contracts.episode_calls import ToolResult
from posttrain_env.client import PostTrainEnv
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import StepMetadata


class Pages:
    """Answers each `jobs_status` step with the page its cursor names (cursors are "p<n>")."""

    def __init__(self, jobs: int, error_at: str | None = None) -> None:
        self.jobs = [{"job_id": f"job-{n:012x}", "state": "running"} for n in range(jobs)]
        self.error_at = error_at
        self.arguments: list[dict[str, Any]] = []

    def page(self, arguments: dict[str, Any]) -> dict[str, Any]:
        cursor = arguments.get("cursor")
        if self.error_at is not None and cursor == self.error_at:
            return ToolError(ErrorType.invalid_argument, "bad cursor", field="cursor").envelope()
        start = int(cursor[1:]) if cursor else 0
        end = start + arguments["limit"]
        following = f"p{end}" if end < len(self.jobs) else None
        return {"jobs": self.jobs[start:end], "total": len(self.jobs), "next_cursor": following}

    async def handle(self, ws: ServerConnection) -> None:
        async for message in ws:
            frame = json.loads(message)
            if frame["type"] != "step":
                continue  # the client's `close` as it leaves
            action = frame["data"]
            assert action["tool_name"] == "jobs_status"
            self.arguments.append(action["arguments"])
            metadata = StepMetadata(episode_id="ep-1", steps_used=1, steps_left=1, time_left_s=1)
            result = ToolResult(
                tool="jobs_status", data=self.page(action["arguments"]), metadata=metadata
            )
            await ws.send(json.dumps({"type": "observation", "data": tool_observation(result)}))


@asynccontextmanager
async def client_of(pages: Pages, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[PostTrainEnv]:
    async with serve(pages.handle, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]

        async def session(_self: Any) -> str:
            return "s" * 64

        monkeypatch.setattr(PostTrainEnv, "_ensure_production_session", session)
        env = PostTrainEnv(base_url=f"http://127.0.0.1:{port}", reconnect_timeout_s=5)
        try:
            yield env
        finally:
            await env.close()


async def test_iter_jobs_lists_every_job_once_following_the_cursors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pages = Pages(jobs=7)
    async with client_of(pages, monkeypatch) as env:
        listed = [job["job_id"] async for job in env.iter_jobs(limit=3)]
    assert listed == [job["job_id"] for job in pages.jobs]
    assert pages.arguments == [
        {"limit": 3},
        {"limit": 3, "cursor": "p3"},
        {"limit": 3, "cursor": "p6"},
    ]


async def test_iter_jobs_of_an_episode_without_jobs_asks_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pages = Pages(jobs=0)
    async with client_of(pages, monkeypatch) as env:
        assert [job async for job in env.iter_jobs()] == []
    assert len(pages.arguments) == 1


async def test_an_error_page_raises_the_tool_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pages = Pages(jobs=5, error_at="p2")
    async with client_of(pages, monkeypatch) as env:
        listed = []
        with pytest.raises(ToolError) as raised:
            async for job in env.iter_jobs(limit=2):
                listed.append(job)
    assert raised.value.type is ErrorType.invalid_argument and len(listed) == 2
