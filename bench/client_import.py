"""The client's start-up: `from posttrain_env import PostTrainEnv` in a fresh process.

    uv run python bench/client_import.py [--runs 10]

Each run is a fresh interpreter with bytecode caches on (as a user's machine has them; the
first run writes them). Printed: the import's wall time (median, min, max), the modules it
loaded and how many of them are openenv's. Beside it, in the same runs, the import as it was
before openenv's server side was left out (`openenv.core` imported whole, its Gradio web UI
hidden as the client still does): the difference is what `posttrain_env/openenv_light.py`
saves. Target: the client loads no web framework (FastAPI, Starlette, uvicorn, fastmcp,
Gradio), which `tests/gateway/test_startup_imports.py` holds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass

PROBE = """
import json, sys, time
started = time.perf_counter()
{prepare}
from posttrain_env import PostTrainEnv
seconds = time.perf_counter() - started
names = sorted(sys.modules)
print(json.dumps({{"s": seconds, "modules": len(names),
                  "openenv": sum(n.split(".")[0] == "openenv" for n in names),
                  "web": sorted({{n.split(".")[0] for n in names}}
                                & {{"fastapi", "starlette", "uvicorn", "fastmcp", "gradio"}})}}))
"""
WHOLE = (
    "from posttrain_env.openenv_light import gradio_hidden\n"
    "import openenv\n"
    "with gradio_hidden():\n"
    "    import openenv.core\n"
)


@dataclass(frozen=True)
class Sample:
    seconds: float
    modules: int
    openenv: int
    web: list[str]


def measure(prepare: str) -> Sample:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(prepare=prepare)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return Sample(found["s"], found["modules"], found["openenv"], found["web"])


def main() -> None:
    parser = argparse.ArgumentParser(description="the client import, in fresh processes")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    shapes = {"today": "", "openenv.core whole": WHOLE}
    runs: dict[str, list[Sample]] = {name: [] for name in shapes}
    for _ in range(args.runs):  # interleaved, so both see the same load
        for name, prepare in shapes.items():
            runs[name].append(measure(prepare))
    after = os.getloadavg()[0]
    print(f"`from posttrain_env import PostTrainEnv`, {args.runs} fresh processes each")
    print(f"cores: {os.cpu_count()}; load average before {load:.2f}, after {after:.2f}")
    header = ("shape", "median s", "min s", "max s", "modules", "openenv")
    print(f"{header[0]:<20} " + " ".join(f"{h:>9}" for h in header[1:]) + "  web")
    for name, samples in runs.items():
        seconds = [sample.seconds for sample in samples]
        last = samples[-1]
        figures = (statistics.median(seconds), min(seconds), max(seconds))
        print(
            f"{name:<20} "
            + " ".join(f"{f:>9.3f}" for f in figures)
            + f" {last.modules:>9} {last.openenv:>9}  {', '.join(last.web) or '-'}"
        )


if __name__ == "__main__":
    main()
