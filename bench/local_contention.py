"""A CPU hog in one local job beside another episode's dev evaluation and the server (issue 17).

    uv run python bench/local_contention.py [--pairs 5] [--hog-processes 16]

Run as root on the local backend (real jobs in bubblewrap). Prints, for each containment, the
t0_artifact dev evaluation of the tiny model (submit to end, the reference solution's
artifact) and a slice of the server's own work (plain additions in this process, calibrated to
last about 0.3 s alone), alone and beside an agent job of another episode spinning
`--hog-processes` processes:

    groups      as built: a control group per job (equal CPU weights, a quota of the flavor's
                vCPUs) beneath a parent that weighs as one server process
    nice        no control groups (a host without them): the stand-in, jobs at nice 10
    none        no control groups and no nice: the local backend before issue 17

Target: with groups, the evaluation beside the hog within 3x its time alone (the median of the
per-pair ratios). The machine is shared, and its load moves within seconds, so each figure is
a pair measured back to back under the same outside load: alone (the hog's processes stopped
with SIGSTOP) and beside the hog (SIGCONT), in ABBA order across pairs (alone-busy, busy-alone,
...) so that a drifting load cancels out. Printed per row: the median time alone and beside the
hog, the median and the range of the per-pair ratios, and the load average (without the hog).

The hog's processes each start a session of their own (`setsid`): with the kernel's autogroup
scheduling (on here), a session weighs as much as the server's, so without groups 16 busy
sessions take ~16/17 of the CPUs, whatever their niceness.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import secrets
import signal
import statistics
import tempfile
import textwrap
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import activities.backends.local.backend as local_backend
from activities.backends.interface import JobRequest
from activities.backends.local.backend import LocalBackend
from job_launcher.trusted_lines import NONCE_ENV
from posttrain_common.contracts.jobs import BackendJob, JobRole, RepoRef
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


SERVER_WORK_S = 0.3


def server_work(additions: int) -> float:
    """What the server does between jobs: plain Python in this process (outside the jobs'
    groups, as the server is). Long enough to span many scheduler periods: a slice of a few
    periods moves by half its length with one preemption by someone else's burst."""
    started = time.monotonic()
    total = 0
    for n in range(additions):
        total += n
    return time.monotonic() - started


class PausedHog:
    """The hog job's processes (those of its uid: with or without groups), stopped and resumed
    as a whole."""

    def __init__(self, backend: LocalBackend, ref: str) -> None:
        spec = json.loads((backend.jobs_dir / ref / "job.json").read_text())
        self.pids = pids_of_uid(int(spec["uid"]))

    def pause(self) -> None:
        self._signal(signal.SIGSTOP, stopped=True)

    def resume(self) -> None:
        self._signal(signal.SIGCONT, stopped=False)

    def _signal(self, signum: int, stopped: bool) -> None:
        for pid in self.pids:
            os.kill(pid, signum)
        deadline = time.monotonic() + 10
        while any(is_stopped(pid) != stopped for pid in self.pids):
            if time.monotonic() > deadline:
                raise SystemExit("the hog's processes did not stop or resume")
            time.sleep(0.01)


def pids_of_uid(uid: int) -> set[int]:
    found = set()
    for name in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{name}/status").read_text() if name.isdigit() else ""
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:") and str(uid) in line.split()[1:]:
                found.add(int(name))
    return found


def is_stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] in "Tt"


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


@dataclasses.dataclass
class Pair:
    """One pair under the same outside load: seconds alone and beside the hog."""

    load: float  # the 1-minute load average, measured with the hog stopped
    alone: float
    busy: float
    server_alone: float
    server_busy: float


def measure(bench: Bench, pairs: int, hog_processes: int) -> list[Pair]:
    hog = bench.hog(hog_processes)
    paused = PausedHog(bench.backend, hog.ref)
    out: list[Pair] = []
    try:
        paused.pause()
        additions = round(3_000_000 * SERVER_WORK_S / min(server_work(3_000_000) for _ in range(3)))
        running, load = False, 0.0
        for index in range(pairs):
            measured: dict[bool, tuple[float, float]] = {}
            for busy in (False, True) if index % 2 == 0 else (True, False):
                if busy and not running:
                    paused.resume()
                elif running and not busy:
                    paused.pause()
                running = busy
                if not busy:
                    load = load_average()
                measured[busy] = bench.dev_evaluate(), server_work(additions)
            (alone, s_alone), (busy_s, s_busy) = measured[False], measured[True]
            out.append(Pair(load, alone, busy_s, s_alone, s_busy))
    finally:
        paused.resume()
        asyncio.run(bench.backend.cancel(hog.ref, datetime.now(UTC)))
    return out


def row(name: str, pairs: list[Pair]) -> str:
    def ratios(busy: Callable[[Pair], float], alone: Callable[[Pair], float]) -> str:
        values = [busy(p) / alone(p) for p in pairs]
        median = statistics.median(values)
        return f"{median:>5.2f}x ({min(values):.2f}-{max(values):.2f})"

    def med(get: Callable[[Pair], float]) -> float:
        return statistics.median(get(p) for p in pairs)

    loads = [p.load for p in pairs]
    return (
        f"{name:<12} {med(lambda p: p.alone):>7.2f} {med(lambda p: p.busy):>7.2f} "
        f"{ratios(lambda p: p.busy, lambda p: p.alone):<18} "
        f"{med(lambda p: p.server_alone):>7.3f} {med(lambda p: p.server_busy):>7.3f} "
        f"{ratios(lambda p: p.server_busy, lambda p: p.server_alone):<18} "
        f"{min(loads):.1f}-{max(loads):.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--hog-processes", type=int, default=16)
    parser.add_argument(
        "--containments", default="groups,nice,none", help="which rows, comma-separated"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="posttrain-bench-") as tmp:
        backend = LocalBackend(Path(tmp) / "local", job_python="/usr/bin/python3")
        built = backend.containment
        bench = Bench(backend)
        print(
            f"seconds, medians of {args.pairs} pairs (alone, beside the hog) measured back to "
            "back; ratio: the median of the per-pair ratios (their range)"
        )
        print(
            f"{'containment':<12} {'eval':>7} {'+ hog':>7} {'ratio':<18} "
            f"{'server':>7} {'+ hog':>7} {'ratio':<18} load"
        )
        saved = local_backend.FALLBACK_NICENESS
        for name in args.containments.split(","):
            backend.containment = (
                built if name == "groups" else dataclasses.replace(built, placements=())
            )
            local_backend.FALLBACK_NICENESS = 0 if name == "none" else saved
            try:
                pairs = measure(bench, args.pairs, args.hog_processes)
            finally:
                local_backend.FALLBACK_NICENESS = saved
            print(row(name, pairs))
        print("target: with groups, eval + hog within 3x eval alone (median ratio)")


if __name__ == "__main__":
    main()
