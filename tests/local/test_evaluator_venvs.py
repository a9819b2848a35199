"""Warm grading on the local backend (issue 44): evaluations share one venv per evaluator,
built once under a lock by the first job of its key, mounted read-only into every evaluation
(activities/backends/local/evaluator_venvs.py). Asserted: four graders started at once build
it once (one "building" line, one install; the others wait and find it ready), every one
imports the pinned package from it; a later grading installs nothing; the venv is root's,
read-only in the job, compiled; another pin is another venv; a build that failed leaves no
venv marked done, and the next job builds it again; agent jobs keep their own venvs."""

from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path

import pytest

from activities.backends.local.backend import LocalBackend
from activities.backends.local.evaluator_venvs import EvaluatorVenvs
from activities.backends.local.plan import evaluator_key
from job_launcher.trusted_lines import NONCE_ENV
from posttrain_common.contracts.jobs import JobRole
from tests.launcher.conftest import make_wheel
from tests.local.conftest import JOB_PYTHON, SMALL, TEST_BWRAP, Jobs, write_model

EVALUATOR = """\
#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = ["pt-probe=={version}"]
# [tool.uv]
# exclude-newer = "2026-11-30T00:00:00Z"
# ///
import os, sys
import pt_probe
print("VALUE", pt_probe.VALUE, "FILE", pt_probe.__file__)
try:
    open(os.path.join(os.path.dirname(pt_probe.__file__), "written"), "w")
    print("WRITABLE")
except OSError as exc:
    print("READ-ONLY", exc.errno)
print("CACHED", os.path.exists(os.path.join(os.path.dirname(pt_probe.__file__), "__pycache__")))
"""


@pytest.fixture
def probes(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    os.chmod(folder, 0o755)
    for version in ("1.0", "2.0"):
        make_wheel(folder, "pt-probe", version, f"VALUE = 'probe-{version}'\n")
    return folder


def probe_jobs(state_dir: Path, tmp_path: Path, probes: Path, **options: bool) -> Jobs:
    """A local backend installing from the probe wheels only, with an artifact to grade."""
    backend = LocalBackend(
        state_dir,
        job_python=JOB_PYTHON,
        limits=SMALL,
        bwrap=TEST_BWRAP,
        find_links=[str(probes)],
        no_index=True,
        **options,
    )
    return with_artifact(Jobs(backend, write_model(tmp_path / "model-src")))


@pytest.fixture
def warm(state_dir: Path, tmp_path: Path, probes: Path) -> Jobs:
    return probe_jobs(state_dir, tmp_path, probes)


def with_artifact(jobs: Jobs) -> Jobs:
    """`jobs` with an agent job's artifact to grade (`jobs.artifact`)."""
    agent = jobs.run("open('/data/outputs/model.safetensors', 'wb').write(b'x')\n")
    assert agent.state.value == "succeeded", jobs.logs(agent.ref)
    jobs.artifact = agent.ref  # type: ignore[attr-defined]
    return jobs


def grade(jobs: Jobs, version: str = "1.0") -> str:
    """Submit a grader job of the probe evaluator; its ref."""
    job = jobs.submit(
        EVALUATOR.format(version=version),
        role=JobRole.grader,
        timeout_s=120,
        artifact_ref=jobs.artifact,  # type: ignore[attr-defined]
        env={NONCE_ENV: secrets.token_hex(16)},
    )
    return job.ref


def lines(jobs: Jobs, ref: str, start: str) -> list[str]:
    return [line for line in jobs.logs(ref, 2000) if line.startswith(start)]


def installed(jobs: Jobs, ref: str) -> bool:
    """The job's log holds the launcher's trusted line of an install."""
    return any('"stage":"installed"' in line.replace(" ", "") for line in jobs.logs(ref, 2000))


def test_four_graders_at_once_build_the_evaluators_venv_once_and_all_use_it(warm: Jobs) -> None:
    refs: list[str] = []
    lock = threading.Lock()

    def submit() -> None:
        ref = grade(warm)
        with lock:
            refs.append(ref)

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ended = [warm.wait_end(ref, timeout=120) for ref in refs]
    assert all(job.state.value == "succeeded" for job in ended), [
        warm.logs(ref, 40) for ref in refs
    ]
    built = [ref for ref in refs if lines(warm, ref, "building the evaluator's venv")]
    waited = [ref for ref in refs if lines(warm, ref, "the evaluator's venv is ready")]
    assert len(built) == 1 and len(waited) == 3, [warm.logs(ref, 40) for ref in refs]
    for ref in refs:
        (value,) = lines(warm, ref, "VALUE")
        assert value.split()[1] == "probe-1.0" and "/env/venv/" in value
        assert lines(warm, ref, "READ-ONLY") and not lines(warm, ref, "WRITABLE")
        assert lines(warm, ref, "CACHED True")  # compiled once, at the build
    venvs = EvaluatorVenvs(warm.backend.state_dir / "evaluator-venvs")
    key = evaluator_key(EVALUATOR.format(version="1.0"), warm.backend.machine)
    folder = venvs.folder(key)
    assert venvs.is_done(key) and (folder / "venv" / "bin" / "python").exists()
    site = next((folder / "venv" / "lib").glob("python*/site-packages"))
    assert (site / "pt_probe" / "__init__.py").stat().st_uid == 0
    assert (site / "pt_probe" / "__init__.py").stat().st_mode & 0o022 == 0
    # One install in all (the launcher's trusted "installed" line): none per job.
    assert [ref for ref in refs if installed(warm, ref)] == built

    started = time.monotonic()
    later = warm.wait_end(grade(warm), timeout=60)
    assert later.state.value == "succeeded"
    assert not lines(warm, later.ref, "building") and not installed(warm, later.ref)
    print(f"a grading with the venv ready: {time.monotonic() - started:.1f} s")


def test_another_pin_is_another_venv_and_agent_jobs_keep_their_own(warm: Jobs) -> None:
    one = warm.wait_end(grade(warm, "1.0"), timeout=120)
    two = warm.wait_end(grade(warm, "2.0"), timeout=120)
    assert lines(warm, one.ref, "VALUE")[0].split()[1] == "probe-1.0"
    assert lines(warm, two.ref, "VALUE")[0].split()[1] == "probe-2.0"
    assert lines(warm, two.ref, "building the evaluator's venv")
    keys = {
        evaluator_key(EVALUATOR.format(version=v), warm.backend.machine) for v in ("1.0", "2.0")
    }
    assert len(keys) == 2
    agent = warm.run(EVALUATOR.format(version="1.0"), timeout=120)
    assert agent.state.value == "succeeded", warm.logs(agent.ref, 40)
    assert not lines(warm, agent.ref, "building") and not lines(warm, agent.ref, "the evaluator")
    (value,) = lines(warm, agent.ref, "VALUE")
    assert value.split()[1] == "probe-1.0"
    assert installed(warm, agent.ref)  # its own venv


def test_a_failed_build_is_not_marked_done_and_the_next_job_builds_again(
    warm: Jobs, probes: Path
) -> None:
    missing = warm.wait_end(grade(warm, "3.0"), timeout=120)  # no such wheel
    assert missing.state.value == "failed"
    key = evaluator_key(EVALUATOR.format(version="3.0"), warm.backend.machine)
    venvs = EvaluatorVenvs(warm.backend.state_dir / "evaluator-venvs")
    assert not venvs.is_done(key)
    make_wheel(probes, "pt-probe", "3.0", "VALUE = 'probe-3.0'\n")
    again = warm.wait_end(grade(warm, "3.0"), timeout=120)
    assert again.state.value == "succeeded", warm.logs(again.ref, 40)
    assert lines(warm, again.ref, "building the evaluator's venv") and venvs.is_done(key)


def test_without_warm_evaluators_each_evaluation_installs_its_own(
    state_dir: Path, tmp_path: Path, probes: Path
) -> None:
    jobs = probe_jobs(state_dir, tmp_path, probes, warm_evaluators=False)
    job = jobs.wait_end(grade(jobs), timeout=120)
    assert job.state.value == "succeeded", jobs.logs(job.ref, 40)
    assert not lines(jobs, job.ref, "building") and lines(jobs, job.ref, "CACHED False")
    assert installed(jobs, job.ref)
    assert not (state_dir / "evaluator-venvs").exists()
