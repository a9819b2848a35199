"""Warm grading, measured (issue 44): a `_tiny` member's hidden-split grading as local grader jobs.

    uv run python bench/grading.py [--task math_word_problems_tiny] [--at-once 4] [--quick]

As root (the local backend's sandbox). Grader jobs of the task's own evaluator (assembled as a
grader uploads it) on the unchanged generated base model (an agent job copies its weights into
its outputs: the artifact), on a local backend with this machine's wheel folders
(POSTTRAIN_LOCAL_FIND_LINKS or pip's find-links: the CPU build of torch), in order:

1. cold: the first grading ever on this state dir, which builds the evaluator's shared venv
   (activities/backends/local/evaluator_venvs.py): once per deployment and pin, not a target;
2. first after a start: a new backend (a restarted worker) on the same state dir; target 30 s;
3. alone: the next one; target 20 s;
4. `--at-once` gradings submitted together; target 60 s each;

each as its wall time from submit to its end, and where it goes: waiting to start (submit to
the first phase), the install phase (the venv's build, or the check that it is done), the run
phase split into the evaluator's own time (`elapsed_s` of its score line: the artifact checks,
loading the model, `generation_s` of decoding) and the rest (the sandbox, the launcher, Python
and the evaluator's imports, the job's end). Prints the machine's load (`uptime`) first: the
figures are only comparable at the same load. `--quick` (tests): one grading at once, and
the state dir's venv reused when it is there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from activities.backends.interface import JobRequest  # noqa: E402
from activities.backends.local.backend import LocalBackend  # noqa: E402
from activities.backends.local.resources import LocalLimits  # noqa: E402
from activities.jobs.activities import HIDDEN_SEED_SECRET, TASK_PARAMS_ENV  # noqa: E402
from job_launcher.trusted_lines import NONCE_ENV, read_score  # noqa: E402
from posttrain_common.contracts.jobs import JobRole, RepoRef  # noqa: E402
from posttrain_common.settings import Settings  # noqa: E402
from tasks.registry import evaluator_script, generated_model, load_task  # noqa: E402

TARGETS = {"first after a start": 30.0, "alone": 20.0, "at once": 60.0}
# Room for torch (its own limits are the backend's defaults but memory and files).
LIMITS = LocalLimits(memory_bytes=None, file_bytes=256 << 20, max_files=100_000, nproc=512)
JOB_PYTHON = "/usr/bin/python3"


class Bench:
    def __init__(self, state: Path, task_id: str, find_links: list[str]) -> None:
        self.state = state
        self.spec = load_task(task_id)
        self.script = evaluator_script(self.spec)
        self.find_links = find_links
        self.backend = self.start()
        base = state.parent / "base-model"
        if not base.exists():
            generate = generated_model(self.spec.base_model.local or "")
            assert generate is not None, f"{task_id} has no generated local model"
            generate(base)
        self.model = RepoRef(
            repo_id="bench/base", revision=self.backend.hub.add_model("bench/base", base)
        )
        copy = "import shutil\nshutil.copy('/base_model/model.safetensors', '/data/outputs/')\n"
        agent = self.run(JobRole.agent, copy)
        assert agent["state"] == "succeeded", agent
        self.artifact = agent["ref"]

    def start(self) -> LocalBackend:
        """A backend on the state dir, as a (re)started worker builds it."""
        return LocalBackend(
            self.state, job_python=JOB_PYTHON, limits=LIMITS, find_links=self.find_links
        )

    def request(self, role: JobRole, script: str, nonce: str) -> JobRequest:
        grader = role is JobRole.grader
        return JobRequest(
            role=role,
            episode_id="ep-bench",
            task_id=self.spec.id,
            job_id="job-" + secrets.token_hex(6),
            flavor=self.spec.eval_flavor,
            timeout_s=self.spec.score_timeout_s,
            script=script,
            base_model=self.model,
            artifact_ref=self.artifact if grader else None,
            key=f"bench/{secrets.token_hex(8)}",
            env={
                NONCE_ENV: nonce,
                **({TASK_PARAMS_ENV: json.dumps(self.spec.evaluation)} if grader else {}),
            },
            secrets={HIDDEN_SEED_SECRET: "bench-seed"} if grader else {},
            now=datetime.now(UTC),
        )

    def run(self, role: JobRole, script: str) -> dict[str, Any]:
        """One job, submit to end: its wall time, phases and (a grader's) score line."""
        nonce = secrets.token_hex(16)
        started = time.time()
        job = asyncio.run(self.backend.submit(self.request(role, script, nonce)))
        while not (
            view := asyncio.run(self.backend.observe([job.ref], datetime.now(UTC)))[job.ref]
        ).state.terminal:
            time.sleep(0.1)
        ended = time.time()
        logs = asyncio.run(self.backend.logs(job.ref, 5000, datetime.now(UTC)))
        result = json.loads((self.backend.jobs_dir / job.ref / "result.json").read_text())
        reading = read_score(logs, nonce) if role is JobRole.grader else None
        return {
            "ref": job.ref,
            "state": view.state.value,
            "wall_s": ended - started,
            "submitted": started,
            "phases": result.get("phases", []),
            "details": reading.details if reading else {},
            "built": any("building the evaluator's venv" in line for line in logs),
        }

    def grade(self) -> dict[str, Any]:
        return self.run(JobRole.grader, self.script)


def where(run: dict[str, Any]) -> str:
    phases = {p["name"]: p["ended"] - p["started"] for p in run["phases"]}
    first = min((p["started"] for p in run["phases"]), default=run["submitted"])
    evaluator = float(run["details"].get("elapsed_s") or 0.0)
    decoding = float(run["details"].get("generation_s") or 0.0)
    run_s = phases.get("run", 0.0)
    return (
        f"{run['wall_s']:6.1f} s  (start {first - run['submitted']:4.1f}, "
        f"install {phases.get('install', 0.0):5.1f}{' [built the venv]' if run['built'] else ''}, "
        f"run {run_s:5.1f} = evaluator {evaluator:5.1f} [decoding {decoding:4.1f}] "
        f"+ sandbox/launcher/imports {run_s - evaluator:4.1f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--task", default="math_word_problems_tiny")
    parser.add_argument("--at-once", type=int, default=4)
    parser.add_argument("--state", type=Path, default=None, help="keep the state dir here")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/grading.py runs as root (the local backend's sandbox)")
    print("load:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    folder = args.state or Path(tempfile.mkdtemp(prefix="bench-grading-"))
    state = folder / "local"
    reused = (state / "evaluator-venvs").is_dir()
    bench = Bench(state, args.task, Settings().local_find_link_list)
    runs: dict[str, list[dict[str, Any]]] = {}
    runs["cold" + (" (venv from an earlier run)" if reused else "")] = [bench.grade()]
    bench.backend = bench.start()  # a restarted worker: the venv cache is on disk
    runs["first after a start"] = [bench.grade()]
    if not args.quick:
        runs["alone"] = [bench.grade()]
    at_once: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=lambda: at_once.append(bench.grade()))
        for _ in range(1 if args.quick else args.at_once)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    runs["at once"] = at_once
    print(f"{args.task}: hidden-split gradings (grader jobs, the unchanged base model)")
    for name, measured in runs.items():
        for run in measured:
            assert run["state"] == "succeeded", run
            details = run["details"]
            target = TARGETS.get(name)
            verdict = (
                ""
                if target is None
                else f"  target {target:.0f} s: " + ("met" if run["wall_s"] <= target else "MISSED")
            )
            print(f"  {name:32} {where(run)}  n={details.get('n')}{verdict}")
    if args.state is None:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
