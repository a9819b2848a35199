"""Fixtures for the local backend: real jobs in bubblewrap on this machine, driven through the
backend API (no Temporal). Agent scripts have no dependencies; packages come only from a wheel
the tests build (tests/launcher/conftest.py), never from live PyPI."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from activities.backends.interface import JobRequest
from activities.backends.local.backend import LocalBackend, LocalLimits
from activities.ports import JobToWatch
from job_launcher.trusted_lines import NONCE_ENV
from posttrain_common.contracts.jobs import BackendJob, JobRole, RepoRef
from tasks.registry import TASKS_DIR, evaluator_script, load_task
from tests.waiting import wait_until

JOB_PYTHON = "/usr/bin/python3"
# Another bwrap to run these tests with (e.g. Debian's 0.8.0); unset: the backend's own choice.
TEST_BWRAP = os.environ.get("POSTTRAIN_TEST_BWRAP") or None
SMALL = LocalLimits(
    artifact_cap_bytes=4 << 20,
    disk_cap_bytes=16 << 20,
    max_files=2000,
    nproc=64,
    memory_bytes=1 << 30,
    file_bytes=8 << 20,
    poll_s=0.05,
    size_every_s=0.1,
)


class NoWatch:
    """The jobs activities' watcher port for calls that must reach no watcher."""

    async def watch(self, job: JobToWatch) -> None:
        raise AssertionError("the activity registered a job with the watcher")


def now() -> datetime:
    return datetime.now(UTC)


class Jobs:
    """A backend with a small base model in its hub, and shortcuts to run jobs on it."""

    def __init__(self, backend: LocalBackend, model_dir: Path) -> None:
        self.backend = backend
        self.model = RepoRef(
            repo_id="test/base", revision=backend.hub.add_model("test/base", model_dir)
        )
        self.nonces: dict[str, str] = {}

    def request(self, script: str, **fields: Any) -> JobRequest:
        key = fields.pop("key", None) or f"test/job/{secrets.token_hex(6)}"
        nonce = secrets.token_hex(16)
        values: dict[str, Any] = {
            "role": JobRole.agent,
            "episode_id": "ep-test",
            "task_id": "t0_artifact",
            "job_id": "job-" + secrets.token_hex(6),
            "flavor": "cpu-basic",
            "timeout_s": 60,
            "script": textwrap.dedent(script),
            "base_model": self.model,
            "key": key,
            "env": {NONCE_ENV: nonce},
            "now": now(),
        }
        values.update(fields)
        return JobRequest(**values)

    def submit(self, script: str, **fields: Any) -> BackendJob:
        request = self.request(script, **fields)
        job = asyncio.run(self.backend.submit(request))
        self.nonces[job.ref] = request.env.get(NONCE_ENV, "")
        return job

    def view(self, ref: str) -> BackendJob:
        return asyncio.run(self.backend.observe([ref], now()))[ref]

    def wait_end(self, ref: str, timeout: float = 30.0) -> BackendJob:
        return wait_until(
            lambda: v if (v := self.view(ref)).state.terminal else None,
            timeout,
            f"job {ref} to end",
        )

    def logs(self, ref: str, tail: int = 200) -> list[str]:
        return asyncio.run(self.backend.logs(ref, tail, now()))

    def run(self, script: str, timeout: float = 30.0, **fields: Any) -> BackendJob:
        return self.wait_end(self.submit(script, **fields).ref, timeout)

    def report(self, ref: str) -> dict[str, Any]:
        """The JSON the job printed on its `REPORT ` line."""
        import json

        for line in self.logs(ref, 2000):
            if line.startswith("REPORT "):
                return json.loads(line[len("REPORT ") :])
        raise AssertionError("no REPORT line in the log:\n" + "\n".join(self.logs(ref)))

    def folder(self, ref: str) -> Path:
        return self.backend.jobs_dir / ref


# A process that submits one job on a local backend and dies as a killed worker would: right
# after the submit, or (before_secrets) after starting the job's supervisor but before handing
# it the secrets on stdin. Prints the job's ref.
_SUBMIT_AND_DIE = """
import asyncio, os, subprocess, sys
from pathlib import Path
from activities.backends.interface import JobRequest
from activities.backends.local.backend import LocalBackend
from activities.backends.local.store import job_ref
state, python, bwrap, before_secrets = sys.argv[1], sys.argv[2], sys.argv[3] or None, sys.argv[4]
backend = LocalBackend(Path(state), job_python=python, bwrap=bwrap)
request = JobRequest.model_validate_json(sys.stdin.read())
print(job_ref(request.key), flush=True)
if before_secrets == "1":
    subprocess.Popen.communicate = lambda *args, **kwargs: os._exit(0)
asyncio.run(backend.submit(request))
os._exit(0)
"""


def submit_and_die(state_dir: Path, request: JobRequest, *, before_secrets: bool = False) -> str:
    """Submit `request` from a process that then dies (see _SUBMIT_AND_DIE); the job's ref."""
    argv = [sys.executable, "-c", _SUBMIT_AND_DIE, str(state_dir), JOB_PYTHON, TEST_BWRAP or ""]
    proc = subprocess.run(
        [*argv, "1" if before_secrets else "0"],
        input=request.model_dump_json(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip()


def logged(jobs: Jobs, ref: str, text: str) -> bool:
    """The job's log (its last 2,000 lines) holds `text`."""
    return any(text in line for line in jobs.logs(ref, 2000))


def write_model(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "test"}')
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return folder


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        raise RuntimeError("the local backend tests run as root (CI does); see test_unprivileged")
    return tmp_path / "state" / "local"


@pytest.fixture
def jobs(state_dir: Path, tmp_path: Path) -> Jobs:
    backend = LocalBackend(state_dir, job_python=JOB_PYTHON, limits=SMALL, bwrap=TEST_BWRAP)
    return Jobs(backend, write_model(tmp_path / "model-src"))


def job_uid(jobs: Jobs, ref: str) -> int:
    import json

    return int(json.loads((jobs.folder(ref) / "job.json").read_text())["uid"])


def leftovers(jobs: Jobs, ref: str) -> list[str]:
    """Whatever of a finished job is still on this machine: its control groups, its parent
    group, its filesystem image, folders or mounts, a loop device on its image."""
    found = []
    for placement in jobs.backend.containment.placements:
        for path in (placement.job(ref), placement.parent):
            if os.path.exists(path):
                found.append(path)
    folder = jobs.folder(ref)
    for name in ("fs", "shm", "fs.img"):
        if (folder / name).exists():
            found.append(str(folder / name))
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if str(folder) in backing.read_text():
                found.append(str(backing))
        except OSError:
            continue
    for mountinfo in Path("/proc").glob("[0-9]*/mountinfo"):
        try:
            if str(folder) in mountinfo.read_text():
                found.append(str(mountinfo))
        except OSError:
            continue
    return found


def trained_t0_artifact(jobs: Jobs) -> tuple[RepoRef, BackendJob, str]:
    """t0_artifact's base model in the local hub, its reference solution run to success as an
    agent job on it, and the task's evaluator script: what a dev evaluation or a grading of
    that job needs."""
    task = load_task("t0_artifact")
    assert task.base_model.local is not None
    revision = asyncio.run(jobs.backend.resolve_model(task.base_model.local, "main"))
    model = RepoRef(repo_id=task.base_model.local, revision=revision)
    solution = (TASKS_DIR / "t0_artifact" / "reference_solution.py").read_text()
    agent = jobs.run(solution, base_model=model, timeout_s=120, timeout=60)
    assert agent.state.value == "succeeded", jobs.logs(agent.ref)
    return model, agent, evaluator_script(task)
