"""Wall time of the demo episode, split into phases, beside the work the jobs themselves did.

    uv run python bench/episode_wall.py [--runs 3]

Each run is `posttrain-env demo` in-process (embedded Temporal, a local-backend worker, the
gateway, `PostTrainEnv` playing the specification's flow with the t0_artifact reference
solution) on a fresh state dir, except that the generated base model and the uv cache are kept
between runs, as on a user's second run. The demo marks when each client call returned; every
local job records when each of its phases (install, run) started and ended. From those:

- start-up: Temporal, the worker and the gateway until the gateway answers;
- the agent job: from jobs_submit to its install phase (job start), the install phase
  (launcher: venv and packages), the run phase (the training script in its sandbox), and from
  its end to the client seeing `succeeded`;
- the dev evaluation and the grading: each call's wall time beside its evaluator job's phases.

"work" is the time inside the jobs' phases; "machinery" is everything else. Target (issue 5):
machinery at most 10% of the wall time of the episode (start-up shown apart).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from posttrain_env.entrypoints.demo import DemoRun, demo, demo_settings


def job_phases(jobs_dir: Path) -> list[dict[str, Any]]:
    """Every local job's result (with its phases), in start order."""
    results = [json.loads(p.read_text()) for p in jobs_dir.glob("*/result.json")]
    return sorted(results, key=lambda r: r["started_at"])


def phase_time(job: dict[str, Any], name: str) -> float:
    return sum(p["ended"] - p["started"] for p in job["phases"] if p["name"] == name)


def breakdown(run: DemoRun, jobs: list[dict[str, Any]]) -> dict[str, float]:
    m = run.marks
    agent, dev, grader = jobs  # the demo runs exactly these three, in this order
    agent_first = agent["phases"][0]["started"]
    return {
        "start-up (Temporal, worker, gateway)": m["stack_ready"] - m["start"],
        "reset": m["reset"] - m["stack_ready"],
        "jobs_submit -> job starts": agent_first - m["reset"],
        "launcher install phase": phase_time(agent, "install"),
        "training script (run phase)": phase_time(agent, "run"),
        "job end -> client sees succeeded": m["succeeded"] - agent["finished_at"],
        "dev_evaluate call": m["dev_evaluated"] - m["succeeded"],
        "  of which evaluator job phases": phase_time(dev, "install") + phase_time(dev, "run"),
        "submit (grading) call": m["graded"] - m["dev_evaluated"],
        "  of which grader job phases": phase_time(grader, "install") + phase_time(grader, "run"),
    }


def one_run(keep: Path) -> tuple[DemoRun, list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory() as state:
        settings = demo_settings().model_copy(update={"state_dir": Path(state)})
        local = Path(state) / "local"
        if keep.exists():  # the generated model and the uv cache of an earlier run
            shutil.copytree(keep, local, symlinks=True)
        run = asyncio.run(demo(settings, out=io.StringIO()))
        jobs = job_phases(local / "jobs")
        shutil.rmtree(local / "jobs")
        if not keep.exists():
            shutil.copytree(local, keep, symlinks=True)
        return run, jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as keep_root:
        keep = Path(keep_root) / "local"
        one_run(keep)  # warm-up: generates the base model, fills the uv cache
        rows: dict[str, list[float]] = {}
        totals: list[tuple[float, float]] = []
        for _ in range(args.runs):
            run, jobs = one_run(keep)
            assert run.reward == 1.0, run
            for name, seconds in breakdown(run, jobs).items():
                rows.setdefault(name, []).append(seconds)
            episode = run.marks["graded"] - run.marks["stack_ready"]
            work = sum(phase_time(j, "install") + phase_time(j, "run") for j in jobs)
            totals.append((episode, work))
    print(f"{'phase':<40} {'median s':>9}")
    for name, values in rows.items():
        print(f"{name:<40} {statistics.median(values):9.3f}")
    episode = statistics.median(t[0] for t in totals)
    work = statistics.median(t[1] for t in totals)
    machinery = episode - work
    print(f"{'episode wall (reset -> reward)':<40} {episode:9.3f}")
    print(f"{'work inside job phases':<40} {work:9.3f}")
    print(f"{'machinery':<40} {machinery:9.3f}  ({100 * machinery / episode:.0f}% of the episode)")
    print("target: machinery at most 10% of the episode's wall time")


if __name__ == "__main__":
    main()
