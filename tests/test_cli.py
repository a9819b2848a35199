"""The `posttrain-env` command line: clear refusals with a real exit status."""

from __future__ import annotations

import os
import subprocess
import sys


def start_worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`posttrain-env worker` with `env`, as far as it gets (these tests expect a refusal)."""
    return subprocess.run(
        [sys.executable, "-m", "posttrain_server.cli", "worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_worker_refuses_a_bad_setting_with_a_clear_message_and_status() -> None:
    env = {**os.environ, "POSTTRAIN_BACKEND": "bogus"}
    done = start_worker(env)
    assert done.returncode == 2
    assert "invalid settings" in done.stderr and "backend" in done.stderr
    assert "Traceback" not in done.stderr
    # `hf` spends money: without the broker's token it must refuse to start, naming what is missing.
    env["POSTTRAIN_BACKEND"] = "hf"
    env.pop("HF_TOKEN", None)
    done = start_worker(env)
    assert done.returncode == 1 and "HF_TOKEN" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_worker_refuses_a_submitted_retention_shorter_than_the_job_retention() -> None:
    env = {
        **os.environ,
        "POSTTRAIN_BACKEND": "fake",
        "POSTTRAIN_JOB_RETENTION_DAYS": "30",
        "POSTTRAIN_SUBMITTED_RETENTION_DAYS": "7",
    }
    done = start_worker(env)
    assert done.returncode == 2 and "invalid settings" in done.stderr
    assert "POSTTRAIN_SUBMITTED_RETENTION_DAYS=7 is shorter" in done.stderr
    assert "Traceback" not in done.stderr
