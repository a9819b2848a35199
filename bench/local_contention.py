"""A CPU hog in one local job beside another episode's dev evaluation and the server (issue 17).

    uv run python bench/local_contention.py [--runs 5] [--hog-processes 16]

Run as root on the local backend (real jobs in bubblewrap). Prints, for each containment, the
t0_artifact dev evaluation of the tiny model (submit to end, the reference solution's
artifact) and a slice of the server's own work (3 million additions in this process), alone
and beside an agent job of another episode spinning `--hog-processes` processes:

    groups      as built: a control group per job (equal CPU weights, a quota of the flavor's
                vCPUs) beneath a parent that weighs as one server process
    nice        no control groups (a host without them): the stand-in, jobs at nice 10
    none        no control groups and no nice: the local backend before issue 17

Target: with groups, the evaluation beside the hog within 3x its time alone. Each figure is
the best and the median of `--runs`; the ratios compare medians. The hog's processes each
start a session of their own (`setsid`): with the kernel's autogroup scheduling (on here), a
session weighs as much as the server's, so without groups 16 busy sessions take ~16/17 of the
CPUs, whatever their niceness.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import secrets
import statistics
import tempfile
import textwrap
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import activities.local.backend as local_backend
from activities.backend import JobRequest
from activities.local.backend import LocalBackend
from job_launcher.trusted_lines import NONCE_ENV
from posttrain_env.contracts.jobs import BackendJob, JobRole, RepoRef
from tasks.registry import TASKS_DIR, evaluator_script, load_task

HOG = """
import os, time
for _ in range({n}):
    if os.fork() == 0:
        os.setsid()  # a session each: with autogroup, each session weighs as much as a user's
        break
else:
    print("spinning", flush=True)
deadline = time.time() + 600
while time.time() < deadline:
    pass
"""


class Bench:
    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        task = load_task("t0_artifact")
        assert task.base_model.local is not None
        revision = asyncio.run(backend.resolve_model(task.base_model.local, "main"))
        self.model = RepoRef(repo_id=task.base_model.local, revision=revision)
        self.evaluator = evaluator_script(task)
        solution = (TASKS_DIR / "t0_artifact" / "reference_solution.py").read_text()
        self.artifact = self.run(solution, JobRole.agent, "ep-agent").ref

    def submit(self, script: str, role: JobRole, episode: str, **fields: object) -> BackendJob:
        values: dict[str, object] = {
            "role": role,
            "episode_id": episode,
            "task_id": "t0_artifact",
            "job_id": "job-" + secrets.token_hex(6),
            "flavor": "cpu-basic",
            "timeout_s": 300,
            "script": textwrap.dedent(script),
            "base_model": self.model,
            "key": f"bench/{secrets.token_hex(8)}",
            "env": {NONCE_ENV: secrets.token_hex(16)},
            "now": datetime.now(UTC),
        }
        values.update(fields)
        return asyncio.run(self.backend.submit(JobRequest(**values)))  # type: ignore[arg-type]

    def view(self, ref: str) -> BackendJob:
        return asyncio.run(self.backend.observe([ref], datetime.now(UTC)))[ref]

    def run(self, script: str, role: JobRole, episode: str, **fields: object) -> BackendJob:
        job = self.submit(script, role, episode, **fields)
        while not job.state.terminal:
            time.sleep(0.02)
            job = self.view(job.ref)
        if job.state.value != "succeeded":
            raise SystemExit(f"a bench job ended {job.state.value}: {job.message}")
        return job

    def dev_evaluate(self) -> float:
        started = time.monotonic()
        self.run(self.evaluator, JobRole.dev, "ep-eval", artifact_ref=self.artifact)
        return time.monotonic() - started

    def hog(self, processes: int) -> BackendJob:
        job = self.submit(HOG.format(n=processes - 1), JobRole.agent, "ep-hog")
        log = self.backend.jobs_dir / job.ref / "log"
        deadline = time.monotonic() + 60
        while "spinning" not in log.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise SystemExit("the hog did not start")
            time.sleep(0.05)
        return job


def server_work() -> float:
    started = time.monotonic()
    total = 0
    for n in range(3_000_000):
        total += n
    return time.monotonic() - started


Figures = tuple[float, float]  # (best, median) seconds


def timed(measure_once: Callable[[], float], runs: int) -> Figures:
    values = [measure_once() for _ in range(runs)]
    return min(values), statistics.median(values)


def measure(bench: Bench, runs: int, hog_processes: int) -> list[Figures]:
    """eval alone, eval beside the hog, server alone, server beside the hog."""
    alone = timed(bench.dev_evaluate, runs)
    server_alone = timed(server_work, runs)
    hog = bench.hog(hog_processes)
    try:
        busy = timed(bench.dev_evaluate, runs)
        server_busy = timed(server_work, runs)
    finally:
        asyncio.run(bench.backend.cancel(hog.ref, datetime.now(UTC)))
    return [alone, busy, server_alone, server_busy]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hog-processes", type=int, default=16)
    parser.add_argument(
        "--containments", default="groups,nice,none", help="which rows, comma-separated"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="posttrain-bench-") as tmp:
        backend = LocalBackend(Path(tmp) / "local", job_python="/usr/bin/python3")
        built = backend.containment
        bench = Bench(backend)
        print(f"seconds, best / median of {args.runs} runs; ratios of the medians")
        print(
            f"{'containment':<12} {'eval alone':>13} {'eval + hog':>13} {'ratio':>6}   "
            f"{'server alone':>13} {'server + hog':>13} {'ratio':>6}"
        )
        saved = local_backend.FALLBACK_NICENESS
        for name in args.containments.split(","):
            backend.containment = (
                built if name == "groups" else dataclasses.replace(built, placements=())
            )
            local_backend.FALLBACK_NICENESS = 0 if name == "none" else saved
            try:
                alone, busy, s_alone, s_busy = measure(bench, args.runs, args.hog_processes)
            finally:
                local_backend.FALLBACK_NICENESS = saved
            print(
                f"{name:<12} {alone[0]:>6.2f}/{alone[1]:<6.2f} {busy[0]:>6.2f}/{busy[1]:<6.2f} "
                f"{busy[1] / alone[1]:>5.2f}x   {s_alone[0]:>6.3f}/{s_alone[1]:<6.3f} "
                f"{s_busy[0]:>6.3f}/{s_busy[1]:<6.3f} {s_busy[1] / s_alone[1]:>5.2f}x"
            )
        print("target: with groups, eval + hog within 3x eval alone")


if __name__ == "__main__":
    main()
