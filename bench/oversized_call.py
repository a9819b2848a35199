"""How long an oversized tool call takes to be answered (issue 11: "a typed error within a
second"), beside an ordinary call, through `PostTrainEnv` on the real server.

    uv run python bench/oversized_call.py [--calls 20]

The real server (`posttrain-env server`: embedded file-backed Temporal dev server, in-process
worker, fake jobs backend) runs as its own process. One `PostTrainEnv` session sends, `--calls`
times each and alternating: `jobs_submit` with a 2.4 MB script (`"x=1\\n" * 600_000`, answered
`invalid_script` from the small stand-in the edge sends instead of the arguments), the same with
a 20 MB script, and `task_info` (an ordinary call). Each is one step of the same episode.
Prints p50 / p90 / max per call, and the machine's load average at the start and the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.gateway.server: the server process a test runs

from openenv.core.env_server.mcp_types import CallToolAction  # noqa: E402

from posttrain_env import PostTrainEnv  # noqa: E402
from tests.gateway.server import ServerProcess  # noqa: E402

SUBMIT = {"flavor": "cpu-basic", "timeout_minutes": 5}
CALLS = {
    "2.4 MB script": CallToolAction(
        tool_name="jobs_submit", arguments={"script": "x=1\n" * 600_000, **SUBMIT}
    ),
    "20 MB script": CallToolAction(
        tool_name="jobs_submit", arguments={"script": "#" * 20_000_000, **SUBMIT}
    ),
    "task_info": CallToolAction(tool_name="task_info", arguments={}),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as state:
        server = ServerProcess(Path(state) / "server")
        server.start()
        try:
            timings: dict[str, list[float]] = {name: [] for name in CALLS}
            with PostTrainEnv(base_url=server.base_url, message_timeout_s=120).sync() as env:
                env.reset(task_id="t0_artifact")
                for action in CALLS.values():  # warm up every path once
                    env.step(action)
                for _ in range(args.calls):
                    for name, action in CALLS.items():
                        started = time.perf_counter()
                        result = env.step(action)
                        timings[name].append(time.perf_counter() - started)
                        data = result.observation.result["data"]
                        if name != "task_info":
                            assert data["error"]["type"] == "invalid_script", data
        finally:
            server.stop()
    for name, seconds in timings.items():
        ordered = sorted(seconds)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        print(
            f"{name:>14}: p50 {statistics.median(ordered) * 1000:7.1f} ms, "
            f"p90 {p90 * 1000:7.1f} ms, max {ordered[-1] * 1000:7.1f} ms ({len(ordered)} calls)"
        )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
