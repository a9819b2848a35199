"""Latency and throughput of `jobs_status` through the gateway, beside the bare Temporal update.

    uv run python bench/gateway_latency.py [--calls 300] [--levels 1,50]

The real server (`posttrain-env server`: embedded file-backed Temporal dev server, in-process
worker, fake jobs backend) runs as its own process. At each level of concurrent sessions (one
caller per session, one call in flight each; every episode has one running job), `--calls`
`jobs_status` calls are made three ways, in the same run, against the same server:

- `ws`: OpenEnv `step` frames over each session's `/ws` (what `PostTrainEnv.step` does);
- `mcp`: JSON-RPC `tools/call` over `POST /mcp` (what `call_tool` does);
- `bare`: the `EpisodeWorkflow.call_tool` update the gateway makes, sent straight to Temporal by
  a client in this process: the floor any gateway pays.

Target (issue 4): the gateway paths at most 1.3x the bare update at p50.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.gateway.server: the server process a test runs

import httpx  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from tool_latency import TASK, TASK_ID  # noqa: E402 - bench/ is sys.path[0]
from websockets.asyncio.client import ClientConnection, connect  # noqa: E402

from activities.fake.backend import FakeJobScript, FakeScenario  # noqa: E402
from mcp_gateway.episode_calls import update_id  # noqa: E402
from tests.gateway.server import ServerProcess  # noqa: E402
from workflows.episode import EpisodeWorkflow  # noqa: E402
from workflows.episode_contract import ToolCall  # noqa: E402
from workflows.ids import episode_workflow_id  # noqa: E402

WARMUP_CALLS = 10
SUBMIT = {"script": "RUN_LONG = 1\n", "flavor": "cpu-basic", "timeout_minutes": 30}


class Session:
    def __init__(self, base_url: str, ws_base: str, http: httpx.AsyncClient) -> None:
        self.base_url = base_url
        self.ws_base = ws_base
        self.http = http
        self.session_id = ""
        self.episode_id = ""
        self.ws: ClientConnection | None = None

    async def open(self) -> None:
        created = await self.http.post(f"{self.base_url}/mcp", json=_rpc("openenv/session/create"))
        self.session_id = created.json()["result"]["session_id"]
        self.ws = await connect(f"{self.ws_base}/ws?session_id={self.session_id}", max_size=None)
        reset = await self._frame({"type": "reset", "data": {"task_id": TASK_ID}})
        self.episode_id = reset["data"]["metadata"]["episode_id"]
        await self._frame(_step("jobs_submit", SUBMIT))

    async def _frame(self, message: dict) -> dict:
        assert self.ws is not None
        await self.ws.send(json.dumps(message))
        reply = json.loads(await self.ws.recv())
        assert reply["type"] != "error", reply
        return reply

    async def ws_call(self) -> None:
        reply = await self._frame(_step("jobs_status", {}))
        assert "jobs" in reply["data"]["observation"]["result"]["data"], reply

    async def mcp_call(self) -> None:
        params = {"name": "jobs_status", "arguments": {}, "session_id": self.session_id}
        reply = (
            await self.http.post(f"{self.base_url}/mcp", json=_rpc("tools/call", params))
        ).json()
        assert "jobs" in reply["result"]["data"], reply

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


def _rpc(method: str, params: dict | None = None) -> dict:
    return {"jsonrpc": "2.0", "method": method, "params": params or {}, "id": 1}


def _step(tool: str, arguments: dict) -> dict:
    return {
        "type": "step",
        "data": {"type": "call_tool", "tool_name": tool, "arguments": arguments},
    }


async def measure(
    calls: int, callers: list[Callable[[], Awaitable[None]]]
) -> tuple[list[float], float]:
    """`calls` calls spread over the callers, each caller one call at a time."""
    latencies: list[float] = []
    per_caller = max(1, calls // len(callers))

    async def run(call: Callable[[], Awaitable[None]]) -> None:
        for _ in range(per_caller):
            started = time.perf_counter()
            await call()
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(run(c) for c in callers))
    return latencies, len(latencies) / (time.perf_counter() - started)


def row(level: int, path: str, latencies: list[float], throughput: float, bare_p50: float) -> str:
    ordered = sorted(latencies)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    ratio = f"{p50 / bare_p50:5.2f}x" if bare_p50 else "   - "
    return f"{level:>6} {path:>5} {p50:9.2f} {p99:9.2f} {throughput:10.0f} {ratio}"


async def bench(server: ServerProcess, calls: int, levels: list[int]) -> None:
    temporal = await Client.connect(server.temporal_address, data_converter=pydantic_data_converter)
    limits = httpx.Limits(max_connections=max(levels) + 10)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        ws_base = server.base_url.replace("http://", "ws://")
        print(f"{'level':>6} {'path':>5} {'p50 ms':>9} {'p99 ms':>9} {'calls/s':>10} vs bare")
        for level in levels:
            sessions = [Session(server.base_url, ws_base, http) for _ in range(level)]
            # 50 job starts at once would swamp a 2-core worker: open five at a time.
            for batch in range(0, level, 5):
                await asyncio.gather(*(s.open() for s in sessions[batch : batch + 5]))

            def bare_caller(s: Session) -> Callable[[], Awaitable[None]]:
                handle = temporal.get_workflow_handle_for(
                    EpisodeWorkflow.run, episode_workflow_id(s.episode_id)
                )

                async def call() -> None:
                    request = ToolCall(request_id=uuid.uuid4().hex, tool="jobs_status")
                    await handle.execute_update(
                        EpisodeWorkflow.call_tool,
                        request,
                        id=update_id(s.episode_id, request.request_id),
                    )

                return call

            paths = {
                "bare": [bare_caller(s) for s in sessions],
                "ws": [s.ws_call for s in sessions],
                "mcp": [s.mcp_call for s in sessions],
            }
            for callers in paths.values():  # warm every path up first
                await measure(min(WARMUP_CALLS * level, 200), callers)
            results = {path: await measure(calls, callers) for path, callers in paths.items()}
            bare_p50 = statistics.median(results["bare"][0])
            for path, (latencies, throughput) in results.items():
                print(row(level, path, latencies, throughput, bare_p50))
            await asyncio.gather(*(s.close() for s in sessions))
    print("target: ws and mcp at most 1.30x bare at p50")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--levels", default="1,50")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    with tempfile.TemporaryDirectory() as state:
        tasks = Path(state) / "tasks"
        (tasks / TASK_ID).mkdir(parents=True)
        (tasks / TASK_ID / "task.toml").write_text(TASK)
        scenario = FakeScenario(jobs=[FakeJobScript(queue_s=0, run_s=3600)])
        server = ServerProcess(
            Path(state) / "server", scenario=scenario, extra_env={"POSTTRAIN_TASKS_DIR": str(tasks)}
        )
        server.start()
        try:
            asyncio.run(bench(server, args.calls, levels))
        except BaseException:
            print(server.log(), file=sys.stderr)
            raise
        finally:
            server.stop()


if __name__ == "__main__":
    main()
