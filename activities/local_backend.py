"""Jobs on this machine, each in a bubblewrap sandbox (DESIGN §9, local backend and hardening).

Every job is a folder under `<state>/local/jobs/` (see activities/local/jobfiles.py) and a
detached supervisor process (activities/local/job_runner.py) that runs its phases, enforces
its timeout, caps and cancellation, and records its end in files. This object only writes a
job's plan, starts its supervisor and reads files, so a new backend on the same state dir (a
restarted worker or server) sees every job exactly as the old one did.

Base models and datasets come from the local hub (`<state>/local/hub`, activities/local/hub.py);
installs share one uv cache (`<state>/local/uv-cache`). Prices are simulated (LOCAL_PRICES).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from activities.backend import BackendJob, JobRequest, JobRole
from activities.local import jobfiles as jf
from activities.local.hub import HubError, LocalHub
from activities.local.plan import Machine, plan_job
from activities.local.sandbox import find_bwrap
from posttrain_env.models import ErrorType, FlavorPrice, JobState, ToolError

if TYPE_CHECKING:
    from posttrain_env.settings import Settings

# Simulated prices: Hugging Face Jobs' own flavor names and list prices (hf.co/docs/hub/
# jobs-pricing: CPU Basic $0.01/h, CPU Upgrade $0.03/h), in micro-USD per minute, so that a local
# episode's budget behaves as it would there. Nothing is charged. No accelerator flavors: the
# local machine runs jobs on its CPUs.
LOCAL_PRICES: tuple[FlavorPrice, ...] = (
    FlavorPrice(name="cpu-basic", micro_usd_per_minute=167),
    FlavorPrice(name="cpu-upgrade", micro_usd_per_minute=500),
)

GIB = 1 << 30
# Job uids come from this range (above any account's and most containers' subordinate ids).
UID_BASE, UID_SPAN = 2_100_000_000, 40_000_000
# A job folder without a supervisor this long after its creation never started.
START_GRACE_S = 30.0
CANCEL_WAIT_S = 10.0
_REF = re.compile(r"local-[0-9a-f]{24}")


@dataclass(frozen=True)
class LocalLimits:
    """Per-job limits of this machine."""

    artifact_cap_bytes: int = 2 * GIB  # /data/outputs, unless the request carries a cap
    disk_cap_bytes: int = 8 * GIB  # /data, /tmp, /dev/shm and the log together
    max_files: int = 100_000  # entries under each watched folder
    nproc: int = 1024  # processes of the job's uid (RLIMIT_NPROC)
    memory_bytes: int | None = None  # RLIMIT_AS per process; None: this machine's memory
    file_bytes: int | None = None  # RLIMIT_FSIZE; None: the disk cap
    poll_s: float = 0.1
    size_every_s: float = 0.5


def job_ref(key: str) -> str:
    """The job's backend id, derived from its idempotency key (one folder per key)."""
    return "local-" + hashlib.sha256(key.encode()).hexdigest()[:24]


class LocalBackend:
    """Implements activities.backend.JobsBackend with jobs on this machine."""

    name = "local"
    prices_simulated = True
    uses_local_models = True

    def __init__(
        self,
        state_dir: Path,
        *,
        job_python: str = "/usr/bin/python3",
        limits: LocalLimits | None = None,
        bwrap: str | None = None,
        uv: str | None = None,
        find_links: Sequence[str] = (),
        no_index: bool = False,
        supervisor_python: str | None = None,
    ) -> None:
        """`state_dir` is the backend's own folder (`<POSTTRAIN_STATE_DIR>/local`).
        `find_links`/`no_index`: test-only package sources, never anything an agent sets."""
        self.state_dir = state_dir
        self.jobs_dir = state_dir / "jobs"
        self.hub = LocalHub(state_dir / "hub")
        self.limits = limits or LocalLimits()
        self.supervisor_python = supervisor_python or sys.executable
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        uv_cache = state_dir / "uv-cache"
        uv_cache.mkdir(exist_ok=True)
        os.chmod(uv_cache, 0o700)  # root's (or the server user's) alone; jobs never mount it
        self.machine = Machine(
            bwrap=bwrap or find_bwrap(),
            job_python=job_python,
            uv=uv or _find_uv(),
            uv_cache=uv_cache,
            privileged=os.geteuid() == 0,
            find_links=tuple(find_links),
            no_index=no_index,
            host_env=dict(os.environ),
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalBackend:
        """The backend for `POSTTRAIN_BACKEND=local`; SystemExit with a message when this
        machine cannot run it."""
        python = settings.job_python
        if not os.access(python, os.X_OK):
            raise SystemExit(
                f"POSTTRAIN_JOB_PYTHON={python} is not an executable interpreter; local jobs "
                "need one that their unprivileged uid can run (e.g. /usr/bin/python3)"
            )
        try:
            return cls(settings.state_dir / "local", job_python=python)
        except (RuntimeError, FileNotFoundError) as exc:
            raise SystemExit(f"the local backend cannot run here: {exc}") from None

    # -- JobsBackend ---------------------------------------------------------------------------

    async def submit(self, request: JobRequest) -> BackendJob:
        return await asyncio.to_thread(self._submit, request)

    async def find_by_key(self, key: str, now: datetime) -> BackendJob | None:
        return await asyncio.to_thread(self._view, job_ref(key))

    async def observe(self, refs: Sequence[str], now: datetime) -> dict[str, BackendJob]:
        def views() -> dict[str, BackendJob]:
            found = {ref: self._view(ref) for ref in refs}
            return {ref: view for ref, view in found.items() if view is not None}

        return await asyncio.to_thread(views)

    async def cancel(self, ref: str, now: datetime) -> BackendJob:
        return await asyncio.to_thread(self._cancel, ref)

    async def logs(self, ref: str, tail: int, now: datetime) -> list[str]:
        self._known(ref)
        return await asyncio.to_thread(jf.tail_lines, self.jobs_dir / ref / jf.LOG, tail)

    async def hardware(self) -> list[FlavorPrice]:
        return list(LOCAL_PRICES)

    async def resolve_model(self, repo_id: str, revision: str) -> str:
        def resolve() -> str:
            self.hub.ensure_generated(repo_id)
            return self.hub.resolve("models", repo_id, revision)

        try:
            return await asyncio.to_thread(resolve)
        except HubError as exc:
            raise ToolError(
                ErrorType.not_allowed,
                f"{exc}; import it with `posttrain-env hub add-model {repo_id} <folder>`",
            ) from None

    async def resolve_dataset(self, repo_id: str, denylist: Sequence[str]) -> str:
        if repo_id.lower() in {name.lower() for name in denylist}:
            raise ToolError(
                ErrorType.dataset_not_allowed,
                f"dataset {repo_id!r} is on this task's denylist",
                dataset=repo_id,
            )
        try:
            return self.hub.resolve("datasets", repo_id)
        except HubError as exc:
            raise ToolError(ErrorType.dataset_not_allowed, str(exc), dataset=repo_id) from None

    # -- submit ----------------------------------------------------------------------------------

    def _submit(self, request: JobRequest) -> BackendJob:
        ref = job_ref(request.key)
        existing = self._view(ref)
        if existing is not None:
            return existing  # the same key again: the job it started, never a second one
        if request.role is JobRole.agent and request.secrets:
            raise ValueError("agent jobs get no secrets (DESIGN §6)")
        base_model, datasets, artifact = self._inputs(request)
        folder = self.jobs_dir / ref
        uid = self._allocate_uid()
        plan = plan_job(request, folder, self.machine, uid, base_model, datasets, artifact)
        staging = Path(tempfile.mkdtemp(prefix=".new-", dir=self.jobs_dir))
        os.chmod(staging, 0o700)
        for name, mode in (("job", 0o755), ("data", 0o755), ("env", 0o755)):
            (staging / name).mkdir(mode=mode)
        for name in ("tmp", "shm"):
            (staging / name).mkdir()
            os.chmod(staging / name, 0o1777)
        if plan.data_owner is not None:
            os.chown(staging / "data", plan.data_owner, plan.data_owner)
        for name, (content, mode) in plan.files.items():
            path = staging / name
            path.write_bytes(content)
            os.chmod(path, mode)
        limits = self.limits
        artifact_cap = request.artifact_cap_bytes or limits.artifact_cap_bytes
        jf.write_json(
            staging / jf.JOB,
            {
                "ref": ref,
                "key": request.key,
                "role": request.role.value,
                "job_id": request.job_id,
                "created_at": time.time(),
                "timeout_s": request.timeout_s,
                "uid": uid,
                "privileged": self.machine.privileged,
                "phases": plan.phases,
                "collect": plan.collect,
                "cleanup": ["env", "tmp", "shm", "data"],
                "poll_s": limits.poll_s,
                "size_every_s": limits.size_every_s,
                "limits": {
                    "nproc": limits.nproc,
                    "memory_bytes": limits.memory_bytes or _physical_memory(),
                    "file_bytes": limits.file_bytes or limits.disk_cap_bytes,
                },
                "watch": {
                    "artifact_cap_bytes": artifact_cap,
                    "disk_cap_bytes": max(limits.disk_cap_bytes, artifact_cap),
                    "max_files": limits.max_files,
                    "scratch": ["data", "tmp", "shm"],
                },
            },
        )
        try:
            os.rename(staging, folder)
        except OSError:  # a concurrent submit of the same key won
            shutil.rmtree(staging, ignore_errors=True)
            view = self._view(ref)
            if view is None:
                raise
            return view
        os.chmod(folder, 0o755)
        self._start_supervisor(folder, plan.secret_env)
        view = self._view(ref)
        assert view is not None
        return view

    def _inputs(self, request: JobRequest) -> tuple[Path, list[tuple[str, Path]], Path | None]:
        try:
            base = self.hub.path("models", request.base_model.repo_id, request.base_model.revision)
            datasets = [
                (d.repo_id, self.hub.path("datasets", d.repo_id, d.revision))
                for d in request.datasets
            ]
        except HubError as exc:
            raise ToolError(ErrorType.hf_error, str(exc)) from None
        artifact = None
        if request.role is not JobRole.agent:
            ref = request.artifact_ref or ""
            artifact = self.jobs_dir / ref / jf.ARTIFACT
            if not _REF.fullmatch(ref) or not artifact.is_dir():
                raise ToolError(
                    ErrorType.not_ready, "the job to evaluate has no artifact (it has not ended)"
                )
        return base, datasets, artifact

    def _allocate_uid(self) -> int:
        """A uid that no process on this machine and no live job of ours uses.

        Drawn at random from a 40-million-id range and checked against /proc and our live
        jobs, so concurrent jobs (also of other state dirs) practically never share one.
        """
        used = _uids_in_use()
        for folder in self.jobs_dir.iterdir():
            spec = jf.read_json(folder / jf.JOB)
            if spec and not (folder / jf.RESULT).exists():
                used.add(int(spec.get("uid", 0)))
        rng = random.SystemRandom()
        while True:
            uid = UID_BASE + rng.randrange(UID_SPAN)
            if uid not in used:
                return uid

    def _start_supervisor(self, folder: Path, secret_env: dict[str, dict[str, str]]) -> None:
        project = str(Path(__file__).resolve().parent.parent)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": project}
        env.update({k: os.environ[k] for k in ("TZ",) if k in os.environ})
        proc = subprocess.Popen(
            [self.supervisor_python, "-P", "-m", "activities.local.job_runner", str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd="/",
            env=env,
            start_new_session=True,  # no terminal signal or process-group kill reaches it
        )
        _, err = proc.communicate(json.dumps(secret_env).encode(), timeout=60)
        if proc.returncode != 0:
            now = time.time()
            jf.create_json(
                folder / jf.RESULT,
                {
                    "state": "failed",
                    "exit_code": proc.returncode,
                    "started_at": now,
                    "finished_at": now,
                    "running_s": 0.0,
                    "message": "the job's supervisor did not start: "
                    + err.decode(errors="replace")[-500:],
                },
            )

    # -- reading and cancelling ------------------------------------------------------------------

    def _known(self, ref: str) -> Path:
        folder = self.jobs_dir / ref
        if not _REF.fullmatch(ref) or not (folder / jf.JOB).exists():
            raise ToolError(ErrorType.hf_error, f"the local backend knows no job {ref!r}")
        return folder

    def _view(self, ref: str) -> BackendJob | None:
        folder = self.jobs_dir / ref
        spec = jf.read_json(folder / jf.JOB) if _REF.fullmatch(ref) else None
        if spec is None:
            return None
        job = BackendJob(
            ref=ref, key=spec["key"], state=JobState.queued, created_at=_time(spec["created_at"])
        )
        result = jf.read_json(folder / jf.RESULT) or self._reconcile(folder, spec)
        if result is not None:
            return job.model_copy(
                update={
                    "state": JobState(result["state"]),
                    "started_at": _time(result["started_at"]),
                    "finished_at": _time(result["finished_at"]),
                    "running_s": float(result["running_s"]),
                    "message": result["message"],
                }
            )
        status = jf.read_json(folder / jf.STATUS)
        if status is None:
            return job
        started = float(status["started_at"])
        return job.model_copy(
            update={
                "state": JobState.running,
                "started_at": _time(started),
                "running_s": max(0.0, time.time() - started),
            }
        )

    def _reconcile(self, folder: Path, spec: dict[str, Any]) -> dict[str, Any] | None:
        """A job whose supervisor is gone without a result (killed, or the machine rebooted)
        ends here: its sandbox is killed and it is recorded as failed (or cancelled)."""
        supervisor = jf.read_json(folder / jf.SUPERVISOR)
        if jf.is_alive(supervisor):
            return None
        if supervisor is None and time.time() - spec["created_at"] < START_GRACE_S:
            return None  # still starting
        result = jf.read_json(folder / jf.RESULT)  # it may have finished since we looked
        if result is not None:
            return result
        jf.kill(jf.read_json(folder / jf.SANDBOX))
        status = jf.read_json(folder / jf.STATUS) or {}
        now = time.time()
        started = float(status.get("started_at", now))
        cancelled = (folder / jf.CANCEL).exists()
        jf.create_json(
            folder / jf.RESULT,
            {
                "state": "cancelled" if cancelled else "failed",
                "exit_code": -1,
                "started_at": started,
                "finished_at": now,
                "running_s": now - started,
                "message": "cancelled" if cancelled else "the job's supervisor stopped",
            },
        )
        return jf.read_json(folder / jf.RESULT)

    def _cancel(self, ref: str) -> BackendJob:
        folder = self._known(ref)
        view = self._view(ref)
        assert view is not None
        if view.state.terminal:
            return view
        (folder / jf.CANCEL).touch()
        # Kill the sandbox here too, so a cancellation does not wait for the supervisor's poll.
        jf.kill(jf.read_json(folder / jf.SANDBOX))
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            view = self._view(ref)
            assert view is not None
            if view.state.terminal:
                return view
            time.sleep(0.02)
        return view


def _time(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _find_uv() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise FileNotFoundError("uv is not installed; local jobs install with it") from None
        return found


def _physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _uids_in_use() -> set[int]:
    used: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        used.update(int(x) for x in line.split()[1:])
                        break
        except (OSError, ValueError):
            continue
    return used
