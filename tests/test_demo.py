"""The README's first command: `posttrain-env demo`, as a user runs it (real Temporal dev server,
real gateway over HTTP, real local jobs in bubblewrap), with a hostile environment around it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_plays_a_whole_episode_on_the_local_backend_and_exits_0(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("posttrain-env")
    env = {
        **os.environ,
        "POSTTRAIN_STATE_DIR": str(tmp_path / "state"),
        # The demo must never spend money or reach another server, whatever the environment says.
        "POSTTRAIN_BACKEND": "hf",
        "TEMPORAL_ADDRESS": "192.0.2.1:7233",
        "HF_TOKEN": "hf_not_a_real_token_but_it_must_not_leak",
    }
    done = subprocess.run(
        [str(exe), "demo"], env=env, capture_output=True, text=True, timeout=240, check=False
    )
    out = done.stdout
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Produce a checkpoint derived from the base model" in out
    assert re.search(r"job job-[0-9a-f]{12}: running", out) or "succeeded" in out
    assert re.search(r"job job-[0-9a-f]{12}: succeeded", out)
    assert "dev score: 1.0" in out
    assert "done: True, reward: 1.0" in out
    spend = re.search(r"spend: \$(\d+\.\d+) settled for 1 job\(s\) and 1 dev evaluation", out)
    assert spend is not None and float(spend.group(1)) > 0
    # It ran on this machine: the local backend's job folders are there, and the token is
    # nowhere in the state dir (jobs, logs, Temporal's database).
    state = tmp_path / "state" / "demo"
    assert len(list((state / "local" / "jobs").iterdir())) == 3  # agent job, dev, grader
    assert (state / "temporal.db").is_file()
    # The audit record measured the agent's artifact in its job folder (a real checkpoint).
    (audit,) = (state / "audit").glob("*.json")
    agent = next(job for job in json.loads(audit.read_text())["jobs"] if job["role"] == "agent")
    assert agent["artifact_bytes"] > 0
    for path in state.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert b"hf_not_a_real_token" not in path.read_bytes(), path


def test_the_demo_plays_any_task_with_its_familys_reference_solution() -> None:
    from posttrain_server.demo import demo_plan
    from tasks.registry import TASKS_DIR

    plan = demo_plan("math_word_problems_tiny")
    reference = TASKS_DIR / "math_word_problems" / "reference_solution.py"
    assert plan.script == reference.read_text()
    assert (plan.flavor, plan.timeout_minutes) == ("cpu-basic", 30)  # the task's first, longest
    default = demo_plan()
    assert (default.task_id, default.timeout_minutes) == ("t0_artifact", 5)


def test_the_demo_refuses_an_unknown_task_or_an_unreadable_script_with_status_2(
    tmp_path: Path,
) -> None:
    exe = Path(sys.executable).with_name("posttrain-env")
    env = {**os.environ, "POSTTRAIN_STATE_DIR": str(tmp_path / "state")}
    for args, needle in (
        (["--task", "no_such_task"], "no_such_task"),
        (["--task", "t0_artifact", "--script", str(tmp_path / "missing.py")], "--script"),
    ):
        done = subprocess.run(
            [str(exe), "demo", *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2, done.stderr
        assert "posttrain-env demo:" in done.stderr and needle in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    # Nothing was started: no Temporal state, no job folder.
    assert not (tmp_path / "state" / "demo").exists()
