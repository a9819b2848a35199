"""fastmcp's `Client` (mcp 2.x) against an episode's MCP endpoint, with its default settings;
run by the interpreter of a venv of its own (fastmcp 4 needs mcp 2, the project pins mcp 1).

    python fastmcp_client.py <mcp_url> <job_id> <timeout_s>    (the token in EPISODE_TOKEN)

Prints one JSON object: the server's name and version, `jobs_wait`'s answer, how long it took
and the progress notifications it got, and what a wrong token raises.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from fastmcp import Client


async def main() -> None:
    url, job_id, timeout_s = sys.argv[1], sys.argv[2], int(sys.argv[3])
    out: dict[str, Any] = {}
    try:
        async with Client(url, auth="not-this-episodes-token") as client:
            await client.list_tools()
        out["wrong_token"] = None
    except Exception as exc:  # what a user would see
        out["wrong_token"] = f"{type(exc).__name__}: {exc}"
    progress: list[str | None] = []

    async def seen(done: float, total: float | None, message: str | None) -> None:
        progress.append(message)  # fastmcp's default handler only logs these

    async with Client(url, auth=os.environ["EPISODE_TOKEN"], progress_handler=seen) as client:
        info = client.initialize_result
        out["server"] = None if info is None else info.server_info.model_dump()
        started = time.monotonic()
        waited = await client.call_tool("jobs_wait", {"job_id": job_id, "timeout_s": timeout_s})
        out["jobs_wait"] = {
            "data": waited.structured_content,
            "seconds": time.monotonic() - started,
            "progress": progress,
        }
    print(json.dumps(out))


asyncio.run(main())
