"""The runbook's `curl` on the gateway's /metrics (docs/operations.md, block "metrics"), run as
written against `posttrain-env server` on its own port: the named series are there, and the tool
calls of an episode move them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.gateway.mcp_helpers import create_episode, mcp_session
from tests.gateway.server import ServerProcess
from tests.waiting import PROGRESS_S, eventually

OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"
CALLS = re.compile(r"^posttrain_gateway_tool_call_seconds_count\{(.*)\} (\S+)$", re.M)


def curl(server: ServerProcess) -> str:
    (block,) = re.findall(r'```bash title="metrics"\n(.*?)```', OPERATIONS.read_text(), re.S)
    (line,) = block.strip().splitlines()
    line = line.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}")
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def task_info_calls(output: str) -> float:
    return sum(
        float(count) for labels, count in CALLS.findall(output) if 'tool="task_info"' in labels
    )


async def test_the_pages_curl_shows_the_series_move_during_an_episode(
    server: ServerProcess,
) -> None:
    before = task_info_calls(curl(server))
    episode = await create_episode(server)
    async with mcp_session(episode) as session:
        await session.call_tool("task_info", {})
        await session.call_tool("task_info", {})
    output = curl(server)
    assert task_info_calls(output) == before + 2
    assert 'posttrain_worker_info{backend="fake"} 1.0' in output

    async def episodes_read() -> bool:
        return (
            re.search(r'^posttrain_episodes\{state="running"\} [1-9]', curl(server), re.M)
            is not None
        )

    await eventually(
        episodes_read, PROGRESS_S, "the running episode in posttrain_episodes", every_s=1
    )
