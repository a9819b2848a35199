"""Wall time of the demo episode from process start, split into phases, beside the work the
jobs themselves did.

    uv run python bench/episode_wall.py [--runs 3] [--cold] [--venv]

Each run is `uv run posttrain-env demo` as a user types it, timed from the moment `uv run`
starts: a process of its own (uv's check of the project environment, the interpreter, the
imports, embedded Temporal, a local-backend worker, the gateway, `PostTrainEnv` playing the
specification's flow with the t0_artifact reference solution) on a fresh state dir. Warm (the
default): the generated base model and the demo's uv cache are kept between runs, as on a
user's second run, after one warm-up run that is not counted. `--cold`: every run starts from
an empty state dir, as a user's very first run (the base model is generated, the jobs' uv cache
starts empty); only uv's own package cache and the project's environment exist already.
`--venv`: the project environment's `posttrain-env` script directly, without `uv run`. The
machine's load average is printed before and after. The demo's lines are timestamped as they
arrive; every local job records when each of its phases (install, run) started and ended.
From those:

- start-up: from process start until the gateway answers (Python and the imports, Temporal, the
  worker, the gateway), shown apart, and the imports alone in a process of their own;
- the agent job: from jobs_submit to its install phase (job start), the install phase
  (launcher: venv and packages), the run phase (the training script in its sandbox), and from
  its end to the client seeing `succeeded`;
- the dev evaluation and the grading: each call's wall time beside its evaluator job's phases;
- shutdown, and the whole command from process start to exit (target, issue 20: under 10 s on
  2 cores).

"work" is the time inside the jobs' phases; "machinery" is everything else. Target (issue 5):
machinery at most 10% of the wall time of the episode (start-up shown apart).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Which line of the demo's output marks which moment (the demo prints as each call returns).
MARKS = [
    ("stack_ready", re.compile(r"^Temporal, a worker .* are up at")),
    ("reset", re.compile(r"^episode ep-")),
    ("submitted", re.compile(r"^job job-\w+: \w+ \(reserved")),
    ("succeeded", re.compile(r"^job job-\w+: succeeded")),
    ("dev_evaluated", re.compile(r"^dev score:")),
    ("graded", re.compile(r"^done: ")),
]
ROOT = Path(__file__).resolve().parents[1]
VENV_DEMO = [str(Path(sys.executable).with_name("posttrain-env")), "demo"]
UV = Path(sys.executable).with_name("uv")  # the project's own uv (a dependency)
UV_DEMO = [str(UV) if UV.exists() else "uv", "run", "posttrain-env", "demo"]
IMPORTS = (
    "import time; t = time.perf_counter(); "
    "from posttrain_server.demo import load_modules; load_modules(); "
    "print(time.perf_counter() - t)"
)


def job_phases(jobs_dir: Path) -> list[dict[str, Any]]:
    """Every local job's result (with its phases), in start order."""
    results = [json.loads(p.read_text()) for p in jobs_dir.glob("*/result.json")]
    return sorted(results, key=lambda r: r["started_at"])


def phase_time(job: dict[str, Any], name: str) -> float:
    return sum(p["ended"] - p["started"] for p in job["phases"] if p["name"] == name)


def breakdown(
    marks: dict[str, float], jobs: list[dict[str, Any]], imports_s: float
) -> dict[str, float]:
    m = marks
    agent, dev, grader = jobs  # the demo runs exactly these three, in this order
    agent_first = agent["phases"][0]["started"]
    return {
        "start-up (process start -> gateway up)": m["stack_ready"] - m["start"],
        "  the imports alone, in a fresh process": imports_s,
        "reset": m["reset"] - m["stack_ready"],
        "jobs_submit -> job starts": agent_first - m["reset"],
        "launcher install phase": phase_time(agent, "install"),
        "training script (run phase)": phase_time(agent, "run"),
        "job end -> client sees succeeded": m["succeeded"] - agent["finished_at"],
        "dev_evaluate call": m["dev_evaluated"] - m["succeeded"],
        "  of which evaluator job phases": phase_time(dev, "install") + phase_time(dev, "run"),
        "submit (grading) call": m["graded"] - m["dev_evaluated"],
        "  of which grader job phases": phase_time(grader, "install") + phase_time(grader, "run"),
        "shutdown (reward -> exit)": m["exited"] - m["graded"],
        "the whole command (start -> exit)": m["exited"] - m["start"],
    }


def one_run(keep: Path | None, command: list[str]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The demo in a process of its own: its marks (wall-clock) and its jobs. `keep`: where
    the generated model and the demo's uv cache are kept between runs (None: a cold run)."""
    with tempfile.TemporaryDirectory() as state:
        local = Path(state) / "demo" / "local"
        if keep is not None and keep.exists():  # the model and the uv cache of an earlier run
            shutil.copytree(keep, local, symlinks=True)
        env = {**os.environ, "POSTTRAIN_STATE_DIR": state, "PYTHONUNBUFFERED": "1"}
        marks = {"start": time.time()}
        with subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                for name, pattern in MARKS:
                    if name not in marks and pattern.search(line):
                        marks[name] = time.time()
            stderr = proc.stderr.read() if proc.stderr else ""
        marks["exited"] = time.time()
        if proc.returncode != 0 or "graded" not in marks:
            raise RuntimeError(f"the demo failed ({proc.returncode}):\n{stderr[-3000:]}")
        jobs = job_phases(local / "jobs")
        shutil.rmtree(local / "jobs")
        if keep is not None and not keep.exists():
            shutil.copytree(local, keep, symlinks=True)
        return marks, jobs


def import_time() -> float:
    """The gateway, the worker and the client imported in a fresh process, in seconds."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS], capture_output=True, text=True, check=True, timeout=120
    )
    return float(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="every run on an empty state dir")
    parser.add_argument("--venv", action="store_true", help="the venv's script, not `uv run`")
    args = parser.parse_args()
    command = VENV_DEMO if args.venv else UV_DEMO
    load_before = os.getloadavg()
    whole: list[float] = []
    with tempfile.TemporaryDirectory() as keep_root:
        keep = None if args.cold else Path(keep_root) / "local"
        if keep is not None:
            one_run(keep, command)  # warm-up: generates the base model, fills the uv cache
        rows: dict[str, list[float]] = {}
        totals: list[tuple[float, float]] = []
        for _ in range(args.runs):
            marks, jobs = one_run(keep, command)
            for name, seconds in breakdown(marks, jobs, import_time()).items():
                rows.setdefault(name, []).append(seconds)
            episode = marks["graded"] - marks["stack_ready"]
            work = sum(phase_time(j, "install") + phase_time(j, "run") for j in jobs)
            totals.append((episode, work))
            whole.append(marks["exited"] - marks["start"])
    load_after = os.getloadavg()
    shown = "posttrain-env demo (the venv script)" if args.venv else "uv run posttrain-env demo"
    print(f"command: {shown}")
    print(f"runs: {args.runs} {'cold (empty state dir each)' if args.cold else 'warm'}")
    print(
        f"cores: {os.cpu_count()}; load average before {load_before[0]:.2f}, after "
        f"{load_after[0]:.2f} (1 min)"
    )
    print(f"the whole command, each run (s): {', '.join(f'{w:.2f}' for w in whole)}")
    print(f"{'phase':<40} {'median s':>9}")
    for name, values in rows.items():
        print(f"{name:<40} {statistics.median(values):9.3f}")
    episode = statistics.median(t[0] for t in totals)
    work = statistics.median(t[1] for t in totals)
    machinery = episode - work
    print(f"{'episode wall (reset -> reward)':<40} {episode:9.3f}")
    print(f"{'work inside job phases':<40} {work:9.3f}")
    print(f"{'machinery':<40} {machinery:9.3f}  ({100 * machinery / episode:.0f}% of the episode)")
    print("target: the whole command under 10 s on 2 cores (issue 20); machinery at most 10% of")
    print("the episode's wall time (issue 5)")


if __name__ == "__main__":
    main()
