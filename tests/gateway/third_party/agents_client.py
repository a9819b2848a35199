"""The OpenAI Agents SDK's `MCPServerStreamableHttp` (mcp 2.x) against an episode's MCP endpoint;
run by the interpreter of a venv of its own (the SDK needs mcp 2, the project pins mcp 1).

    python agents_client.py <mcp_url> <job_id> <timeout_s> <session_timeout>
        (the token in EPISODE_TOKEN; <session_timeout>: "default" for the SDK's own 5 s, or
        "none" for the setting docs/clients.md gives, `client_session_timeout_seconds=None`)

Prints one JSON object: `jobs_wait`'s answer (or the error it raised) and how long it took, and
what a wrong token raises.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from agents.mcp import MCPServerStreamableHttp


def describe(exc: BaseException) -> str:
    """The error as its traceback shows it: with every error an exception group holds."""
    text = f"{type(exc).__name__}: {exc}"
    for inner in getattr(exc, "exceptions", ()):
        text += f" | {describe(inner)}"
    return text


def server(url: str, token: str, session_timeout: str) -> MCPServerStreamableHttp:
    params = {"url": url, "headers": {"Authorization": f"Bearer {token}"}}
    if session_timeout == "default":
        return MCPServerStreamableHttp(params=params)
    return MCPServerStreamableHttp(params=params, client_session_timeout_seconds=None)


async def main() -> None:
    url, job_id, timeout_s, session_timeout = sys.argv[1:5]
    out: dict[str, Any] = {}
    try:
        async with server(url, "not-this-episodes-token", session_timeout) as wrong:
            await wrong.list_tools()
        out["wrong_token"] = None
    except Exception as exc:  # what a user would see: the error and those it groups
        out["wrong_token"] = describe(exc)
    started = time.monotonic()
    try:
        async with server(url, os.environ["EPISODE_TOKEN"], session_timeout) as mcp:
            waited = await mcp.call_tool(
                "jobs_wait", {"job_id": job_id, "timeout_s": int(timeout_s)}
            )
        out["jobs_wait"] = {"data": waited.structured_content}
    except Exception as exc:
        out["jobs_wait"] = {"error": describe(exc)}
    out["jobs_wait"]["seconds"] = time.monotonic() - started
    print(json.dumps(out))


asyncio.run(main())
