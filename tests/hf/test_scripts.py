"""The benchmark and the live smoke script run here without a token or the network (tiny sizes;
the smoke script only as far as it can without HF_TOKEN)."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

from huggingface_hub import JobInfo

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )


def test_the_hub_api_load_benchmark_runs_and_meets_its_targets_tiny() -> None:
    # More jobs than watcher shards, so that a Hub listing serves several jobs as it does at
    # scale: with 3 jobs, each in a shard of its own, one listing per job per look is ~1 call
    # per job per 30 s by construction, and a look retried under load passed the target.
    done = run("bench/hub_api_load.py", "--jobs", "40", "--run-minutes", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "status calls per job per 30 s of running" in done.stdout
    assert "history events per job workflow" in done.stdout
    assert "MISSED" not in done.stdout, done.stdout


def test_the_smoke_script_explains_itself() -> None:
    done = run("scripts/hf_smoke.py", "--help")
    assert done.returncode == 0, done.stderr
    assert "HF_TOKEN" in done.stdout and "$0.01" in done.stdout


def test_the_smoke_script_refuses_to_start_without_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    done = run("scripts/hf_smoke.py", env=env)
    assert done.returncode == 2 and "HF_TOKEN" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_smoke_script_imports_cleanly() -> None:
    done = run("-c", "import runpy; runpy.run_path('scripts/hf_smoke.py', run_name='smoke')")
    assert done.returncode == 0, done.stderr


def test_the_smoke_script_offers_the_billing_check_and_says_it_needs_a_token() -> None:
    done = run("scripts/hf_smoke.py", "--help")
    assert "--check-billing" in done.stdout and "HF_TOKEN" in done.stdout
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    refused = run("scripts/hf_smoke.py", "--check-billing", env=env)
    assert refused.returncode == 2 and "HF_TOKEN" in refused.stderr


def billing_job(stage: str, message: str | None, running: int, total: int) -> JobInfo:
    return JobInfo(
        id="68780d00bbe36d38803f645f",
        createdAt="2026-03-02T09:00:00.000Z",
        startedAt="2026-03-02T09:00:05.000Z",
        finishedAt="2026-03-02T09:01:05.000Z",
        dockerImage="ghcr.io/astral-sh/uv:python3.12-bookworm",
        command=["uv", "run", "/data/launcher.py"],
        flavor="cpu-basic",
        labels={"posttrain-timeout-s": "60"},
        status={"stage": stage, "message": message},
        durations={"schedulingSecs": total - running, "runningSecs": running, "totalSecs": total},
        owner={"id": "5e9ecfc04957053f60648a3e", "name": "alice", "type": "user"},
    )


def test_the_billing_report_puts_the_hubs_durations_beside_our_settlement() -> None:
    report = runpy.run_path(str(ROOT / "scripts/hf_smoke.py"), run_name="smoke")["billing_report"]
    view = {"state": "timed_out", "running_s": 61.0, "cost_usd": 334 / 1e6}
    lines = "\n".join(report(view, billing_job("ERROR", "Job timeout", 61, 66), 167))
    assert "scheduling 5 s, running 61 s, total 66 s" in lines
    assert "stage ERROR" in lines and "'Job timeout'" in lines
    assert "2 min billed" in lines and "$0.000334" in lines
    assert "running time only" in lines and "settings/billing" in lines
    assert "not recognised as timed out" not in lines
    # A Hub whose timeout clock includes scheduling, and a timeout we failed to recognise.
    other = "\n".join(report({"state": "failed"}, billing_job("ERROR", None, 48, 61), 167))
    assert "scheduling is inside the timeout clock" in other
    assert "not recognised as timed out" in other
