"""The benchmark and the live smoke script run here without a token or the network (tiny sizes;
the smoke script only as far as it can without HF_TOKEN)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    done = run("bench/hub_api_load.py", "--jobs", "3", "--run-minutes", "2")
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
