"""The prepared GPU command (scripts/gpu_check.py, docs/development.md "What needs a GPU") runs
here with --cpu: the real members' tiny twins graded under the launcher with its loopback
policy, and its DDP job with gloo on two CPU processes (slow: the jobs install torch's CPU build
from this machine's wheels and transformers). On a GPU machine the same code grades the real
members with both engines and runs NCCL across two GPUs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_the_gpu_command_grades_both_members_and_runs_ddp_on_the_cpu() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1700,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    lines = done.stdout.splitlines()
    graded = [line for line in lines if " engine transformers " in line]
    assert [line.split()[0] for line in graded] == ["t1_tool_call_tiny", "math_word_problems_tiny"]
    for line in graded:
        assert "ran transformers" in line and "tokens/s" in line, line
        assert line.endswith("loopback_tcp True"), line
    ddp = next(line for line in lines if line.startswith("DDP, 2 processes on cpu, cpu:"))
    assert "steps/s" in ddp and "GB/s" in ddp and ddp.endswith("loopback_tcp True"), ddp
