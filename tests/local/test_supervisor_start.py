"""A local job's supervisor starts once, with its secrets, whoever starts it.

A worker killed between writing a job's folder and handing its supervisor the secrets on stdin
used to leave a supervisor that read an empty stdin as "no secrets" and ran the job without its
nonce and grader seed (an evaluation then failed as the grader's fault: CI's slow set saw one in
the SIGKILLed-workers campaign). Now the secrets must arrive whole, supervisors claim a job
exclusively, and the retried submit of the restarted worker starts the job itself."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from activities.backends.interface import JobRequest
from activities.backends.local import jobfiles as jf
from activities.backends.local import store
from activities.backends.local.backend import LocalBackend
from activities.backends.local.job_runner import ALREADY_SUPERVISED
from job_launcher.trusted_lines import NONCE_ENV, read_score
from tests.local.conftest import JOB_PYTHON, SMALL, TEST_BWRAP, Jobs, submit_and_die
from tests.local.test_lifecycle import EVALUATOR, SLEEPER, started
from tests.waiting import wait_until

NOTHING = "print('ran', flush=True)"


def start_supervisor(folder: Path, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    """What the backend runs to start a job's supervisor, with `stdin` as what it was sent."""
    return subprocess.run(
        [JOB_PYTHON, "-P", "-m", "activities.backends.local.job_runner", str(folder)],
        input=stdin,
        capture_output=True,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(store.PROJECT_ROOT)},
        timeout=60,
    )


def resubmit(state_dir: Path, request: JobRequest) -> str:
    """The retried submit of a restarted worker (a backend of its own): the job's ref."""
    backend = LocalBackend(state_dir, job_python=JOB_PYTHON, limits=SMALL, bwrap=TEST_BWRAP)
    return asyncio.run(backend.submit(request)).ref


def test_a_submit_killed_before_handing_over_the_secrets_is_started_whole_by_its_retry(
    jobs: Jobs, state_dir: Path
) -> None:
    agent = jobs.run("open('/data/outputs/model.safetensors', 'w').write('trained')")
    assert agent.state.value == "succeeded"
    grader = {"role": "grader", "artifact_ref": agent.ref, "key": "ep-s/job/1"}
    request = jobs.request(EVALUATOR, **grader, secrets={"POSTTRAIN_HIDDEN_SPLIT_SEED": "s3cret"})
    ref = submit_and_die(state_dir, request, before_secrets=True)
    folder = jobs.folder(ref)
    assert (folder / jf.JOB).exists()
    # A supervisor whose stdin ends before the secrets do starts nothing and claims nothing.
    for cut in (b"", b'{"run": {"POSTTRAIN_NON'):
        refused = start_supervisor(folder, cut)
        assert refused.returncode == 1
        assert b"secrets did not arrive whole" in refused.stderr
    assert not (folder / jf.SUPERVISOR).exists() and not (folder / jf.STATUS).exists()

    assert resubmit(state_dir, request) == ref  # the restarted worker's retried submit
    ended = jobs.wait_end(ref)
    assert ended.state.value == "succeeded", jobs.logs(ref)
    reading = read_score(jobs.logs(ref, 10_000), request.env[NONCE_ENV])
    assert reading.valid, reading.reason
    assert reading.details["details"]["seed"] == "s3cret"
    assert sum(line.startswith("POSTTRAIN_SCORE ") for line in jobs.logs(ref)) == 1


def test_a_second_supervisor_of_a_running_job_steps_aside(jobs: Jobs) -> None:
    job = jobs.submit(SLEEPER)
    wait_until(lambda: started(jobs, job.ref), 20, "the job to start")
    claim = (jobs.folder(job.ref) / jf.SUPERVISOR).read_text()
    second = start_supervisor(jobs.folder(job.ref), json.dumps({}).encode())
    assert second.returncode == ALREADY_SUPERVISED, second
    assert (jobs.folder(job.ref) / jf.SUPERVISOR).read_text() == claim
    assert jobs.view(job.ref).state.value == "running"
    assert jobs.logs(job.ref).count("started") == 1


def test_a_job_no_supervisor_claimed_in_time_ends_failed_and_no_late_submit_starts_it(
    jobs: Jobs, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = jobs.request(NOTHING, key="ep-s/job/2")
    ref = submit_and_die(state_dir, request, before_secrets=True)
    monkeypatch.setattr(store, "START_GRACE_S", 0.0)  # instead of waiting out 30 s
    ended = jobs.view(ref)
    assert ended.state.value == "failed"
    assert ended.message == "the job never started: its supervisor did not come within 0 s"
    assert jf.read_json(jobs.folder(ref) / jf.SUPERVISOR) == store.NEVER_SUPERVISED
    assert resubmit(state_dir, request) == ref
    assert jobs.view(ref).state.value == "failed"
    assert not (jobs.folder(ref) / jf.LOG).exists()  # nothing ran
    late_claim = start_supervisor(jobs.folder(ref), b"{}")
    assert late_claim.returncode == ALREADY_SUPERVISED
