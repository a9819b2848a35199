"""One episode's hog beside another episode's small job and tool calls, on the local backend
(issue 30, "episodes are tenants"; tracked as issue 41).

    uv run python bench/neighbours.py [--hogs fork_storm,cpu_threads,...] [--rounds 3]

Run as root (real jobs in bubblewrap, their control groups and filesystems). It starts the
all-in-one server (`posttrain-env server`: the embedded Temporal, a worker on the local backend
and the gateway) on a state dir of its own, then, for each hog:

1. idle: a baseline episode runs `--rounds` small jobs (a script that writes 1 MiB to
   /data/outputs), each timed from `jobs_submit` until `jobs_wait` sees it end, and
   `--calls` tool calls (`jobs_status`), each timed as the client sees it;
2. beside the hog: another episode's job runs the hog (below) and, once its log says it is at
   full force, the same measurements again;
3. idle again, after the hog's job was cancelled.

Printed per hog: the baseline's job time (median) and tool-call p50/p99, idle (both idle
phases together) and beside the hog, and their ratios; the target is at most 2x for every
figure. The hogs (each an agent job of cpu-basic, its whole timeout long):

    fork_storm    forks without end (held at the job's process limit), every process spinning
    fork_classic  the classic bomb: each process forks until a fork fails, which kills it
    fork_memory   forks without end, each child taking 32 MiB (memory and processes at once)
    cpu_threads   64 threads hashing (hashlib releases the GIL: real work on every core)
    memory        grows its memory to the job's limit and keeps touching it
    disk_io       writes and fsyncs 64 MiB files in a loop, rewriting them
    file_flood    creates empty files until its filesystem has no inode left, then rewrites
    log_flood     prints as fast as it can (the job's log is capped)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _topology import Topology  # noqa: E402 - bench/ is sys.path[0]

from activities.backends.fake.backend import FakeScenario  # noqa: E402
from tasks.registry import TASKS_DIR  # noqa: E402

TASK = "t0_artifact"
FLAVOR = "cpu-basic"
READY = "HOG-AT-FULL-FORCE"

SMALL_JOB = """
import os
os.makedirs("/data/outputs", exist_ok=True)
with open("/data/outputs/small.bin", "wb") as fh:
    fh.write(os.urandom(1 << 20))
print("done")
"""

HOGS: dict[str, str] = {
    "fork_storm": f"""
import os, time
print("{READY}", flush=True)
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0)
""",
    "fork_classic": f"""
import os, time
print("{READY}", flush=True)
# The classic bomb: every process forks until a fork fails, which kills it (an uncaught
# OSError). The job's first process only restarts it each time the storm dies out, so the
# churn at the process limit lasts as long as the job.
while True:
    try:
        if os.fork() == 0:
            while True:
                os.fork()
        os.wait()
    except OSError:
        time.sleep(0)
""",
    "fork_memory": f"""
import os
print("{READY}", flush=True)
while True:
    try:
        if os.fork() == 0:
            ballast = bytearray(32 << 20)
    except OSError:
        pass
""",
    "cpu_threads": f"""
import hashlib, threading
data = b"x" * (1 << 20)
def spin():
    while True:
        hashlib.sha256(data).digest()
for _ in range(64):
    threading.Thread(target=spin, daemon=True).start()
print("{READY}", flush=True)
threading.Event().wait()
""",
    "memory": f"""
import mmap, os, time
# A child grows to the job's memory limit and keeps touching its pages; when the kernel kills
# it, another takes its place: pressure at the limit for as long as the job runs.
print("{READY}", flush=True)
while True:
    pid = os.fork()
    if pid == 0:
        chunks = []
        while True:
            block = mmap.mmap(-1, 64 << 20)
            block.write(b"x" * (64 << 20))
            chunks.append(block)
    os.waitpid(pid, 0)
    time.sleep(0.1)
""",
    "disk_io": f"""
import os
os.makedirs("/tmp/hog", exist_ok=True)
block = os.urandom(1 << 20)
told = False
n = 0
while True:
    with open(f"/tmp/hog/{{n % 32}}.bin", "wb") as fh:
        for _ in range(64):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    n += 1
    if n == 4 and not told:
        print("{READY}", flush=True)
        told = True
""",
    "file_flood": f"""
import os
os.makedirs("/tmp/flood", exist_ok=True)
n = 0
told = False
while True:
    try:
        with open(f"/tmp/flood/{{n % 2_000_000}}", "w") as fh:
            fh.write("x")
    except OSError:
        if not told:
            print("{READY}", flush=True)
            told = True
    n += 1
    if n == 20_000 and not told:
        print("{READY}", flush=True)
        told = True
""",
    "log_flood": f"""
import os
print("{READY}", flush=True)
# Short lines, one write each: the most work per byte for whoever copies the log, and the
# job's log cap (1 GiB) lasts minutes.
while True:
    os.write(1, b"y\\n")
""",
}


@dataclass
class Phase:
    """One phase's figures: job times (s) and tool-call times (ms)."""

    jobs: list[float] = field(default_factory=list)
    calls: list[float] = field(default_factory=list)

    def add(self, other: Phase) -> Phase:
        return Phase(self.jobs + other.jobs, self.calls + other.calls)

    @property
    def job_s(self) -> float:
        return statistics.median(self.jobs)

    @property
    def p50_ms(self) -> float:
        return percentile(self.calls, 50)

    @property
    def p99_ms(self) -> float:
        return percentile(self.calls, 99)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


@contextlib.contextmanager
def server(state_dir: Path) -> Iterator[str]:
    """`posttrain-env server` on the local backend (bench/_topology.py's all-in-one shape), its
    state in `state_dir`, the repository's tasks."""
    topology = Topology(
        "allinone",
        state_dir,
        FakeScenario(),  # unused: the backend is local
        TASKS_DIR,
        extra_env={"POSTTRAIN_BACKEND": "local"},
    )
    try:
        topology.start()
        yield topology.base_url
    finally:
        topology.stop()


class Episode:
    """One episode through PostTrainEnv (the client a user runs)."""

    def __init__(self, url: str) -> None:
        from posttrain_env.client import PostTrainEnv

        self.env = PostTrainEnv(base_url=url, message_timeout_s=900)

    async def __aenter__(self) -> Episode:
        await self.env.__aenter__()
        await self.env.reset(task_id=TASK)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.env.__aexit__(None, None, None)

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        from openenv.core.env_server.mcp_types import CallToolAction

        result = await self.env.step(CallToolAction(tool_name=tool, arguments=arguments))
        data: dict[str, Any] = result.observation.result["data"]
        if "error" in data:
            raise SystemExit(f"{tool} was refused: {data['error']}")
        return data

    async def submit(self, script: str, timeout_minutes: int = 5) -> str:
        view = await self.call(
            "jobs_submit", script=script, flavor=FLAVOR, timeout_minutes=timeout_minutes
        )
        return str(view["job_id"])

    async def wait_end(self, job_id: str) -> dict[str, Any]:
        while True:
            view = await self.call("jobs_wait", job_id=job_id, timeout_s=300)
            if view["state"] in ("succeeded", "failed", "cancelled", "timed_out"):
                return view


async def measure(url: str, rounds: int, calls: int) -> Phase:
    """A fresh baseline episode: `rounds` small jobs, then `calls` tool calls."""
    phase = Phase()
    job_id = ""
    async with Episode(url) as baseline:
        for _ in range(rounds):
            started = time.monotonic()
            job_id = await baseline.submit(SMALL_JOB)
            view = await baseline.wait_end(job_id)
            phase.jobs.append(time.monotonic() - started)
            if view["state"] != "succeeded":
                raise SystemExit(f"the baseline's job ended {view['state']}: {view['message']}")
        for _ in range(calls):
            started = time.monotonic()
            await baseline.call("jobs_status", job_id=job_id)
            phase.calls.append((time.monotonic() - started) * 1000)
    return phase


async def start_hog(hog: Episode, name: str) -> str:
    job_id = await hog.submit(HOGS[name], timeout_minutes=30)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        lines = (await hog.call("jobs_logs", job_id=job_id, tail=2000))["lines"]
        # A log flood pushes its first line out of any tail: a full tail is its full force.
        if any(READY in line for line in lines) or len(lines) >= 2000:
            await asyncio.sleep(3)  # let it take hold
            return job_id
        view = await hog.call("jobs_status", job_id=job_id)
        if view["state"] not in ("queued", "running"):
            raise SystemExit(f"the {name} hog ended {view['state']}: {view['message']}")
        await asyncio.sleep(2)
    raise SystemExit(f"the {name} hog never said it was at full force")


async def bench_hog(url: str, name: str, rounds: int, calls: int) -> tuple[Phase, Phase, str]:
    idle = await measure(url, rounds, calls)
    async with Episode(url) as hog:
        job_id = await start_hog(hog, name)
        busy = await measure(url, rounds, calls)
        view = await hog.call("jobs_status", job_id=job_id)
        note = "" if view["state"] == "running" else f"hog {view['state']} before the end"
        if view["state"] in ("queued", "running"):
            await hog.call("jobs_cancel", job_id=job_id)
    idle = idle.add(await measure(url, rounds, calls))
    return idle, busy, note


def row(name: str, idle: Phase, busy: Phase, note: str) -> str:
    ratios = (busy.job_s / idle.job_s, busy.p50_ms / idle.p50_ms, busy.p99_ms / idle.p99_ms)
    verdict = "ok" if max(ratios) <= 2 else "OVER 2x"
    return (
        f"{name:<12} {idle.job_s:>6.2f} {busy.job_s:>6.2f} {ratios[0]:>5.2f}x  "
        f"{idle.p50_ms:>6.1f} {busy.p50_ms:>6.1f} {ratios[1]:>5.2f}x  "
        f"{idle.p99_ms:>6.1f} {busy.p99_ms:>6.1f} {ratios[2]:>5.2f}x  {verdict} {note}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--hogs", default=",".join(HOGS), help="comma-separated, of: " + ", ".join(HOGS)
    )
    parser.add_argument("--rounds", type=int, default=3, help="small jobs per phase")
    parser.add_argument("--calls", type=int, default=40, help="tool calls per phase")
    args = parser.parse_args()
    names = [name for name in args.hogs.split(",") if name]
    unknown = [name for name in names if name not in HOGS]
    if unknown:
        parser.error(f"unknown hogs: {', '.join(unknown)}")
    if os.geteuid() != 0:
        parser.error("run as root: the local backend's containment needs it")
    with (
        tempfile.TemporaryDirectory(prefix="posttrain-neighbours-") as tmp,
        server(Path(tmp)) as url,
    ):
        print(f"load average at start: {Path('/proc/loadavg').read_text().split()[0]}")
        print(
            f"{'hog':<12} {'job s':>6} {'+hog':>6} {'ratio':>6}  {'p50 ms':>6} {'+hog':>6} "
            f"{'ratio':>6}  {'p99 ms':>6} {'+hog':>6} {'ratio':>6}"
        )
        for name in names:
            idle, busy, note = asyncio.run(bench_hog(url, name, args.rounds, args.calls))
            print(row(name, idle, busy, note), flush=True)
        print(f"load average at end: {Path('/proc/loadavg').read_text().split()[0]}")


if __name__ == "__main__":
    main()
