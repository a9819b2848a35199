"""Jobs on this machine, each in a bubblewrap sandbox (DESIGN §9, local backend and hardening).

Every job is a folder under `<state>/local/jobs/` (see activities/backends/local/jobfiles.py) and a
detached supervisor process (activities/backends/local/job_runner.py) that runs its phases, enforces
its timeout, caps and cancellation, and records its end in files. This object only writes a
job's plan, starts its supervisor and reads files, so a new backend on the same state dir (a
restarted worker or server) sees every job exactly as the old one did.

Base models and datasets come from the local hub (`<state>/local/hub`,
activities/backends/local/hub.py);
installs share one uv cache (`<state>/local/uv-cache`). Prices are simulated (LOCAL_PRICES).

What a job may use (CPUs, memory, processes, disk, files) follows its flavor, scaled to this
machine (activities/backends/local/resources.py); what holds each limit is found out when the
backend is
built (activities/backends/local/containment.py) and reported by `job_limits`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from activities.backends.interface import DatasetBytes, JobRequest
from activities.backends.local import jobfiles as jf
from activities.backends.local.containment import FALLBACK_NICENESS, Containment, find_containment
from activities.backends.local.hub import HubError, LocalHub
from activities.backends.local.plan import Machine, plan_job, secret_env
from activities.backends.local.resources import (
    Capacity,
    JobResources,
    LocalLimits,
    job_resources,
    jobs_cpus,
    jobs_memory_bytes,
    machine_capacity,
)
from activities.backends.local.sandbox import find_bwrap
from activities.backends.local.scratch import Retention
from activities.backends.local.storage import LocalJobStorage
from activities.backends.local.store import JobStore, job_ref
from activities.backends.storage import StorageRefused
from activities.contamination.dataset_bytes import read_folder
from posttrain_common.contracts.episodes import FlavorLimits, JobLimits
from posttrain_common.contracts.jobs import BackendJob, JobRole, KeepOutputs
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import (
    LOCAL_BUSY_JOB_CPU_WEIGHT,
    LOCAL_EPISODE_STORAGE_BYTES,
    LOCAL_JOB_CPU_WEIGHT,
    LOCAL_JOB_DISK_BYTES_PER_S,
    LOCAL_JOB_DISK_IOPS,
    LOCAL_JOBS_CPU_WEIGHT,
)
from posttrain_env.models import FlavorPrice

__all__ = ["LOCAL_PRICES", "LocalBackend", "LocalLimits", "job_ref"]

# Simulated prices: Hugging Face Jobs' own flavor names and list prices (hf.co/docs/hub/
# jobs-pricing: CPU Basic $0.01/h, CPU Upgrade $0.03/h), in micro-USD per minute, so that a local
# episode's budget behaves as it would there. Nothing is charged. No accelerator flavors: the
# local machine runs jobs on its CPUs.
LOCAL_PRICES: tuple[FlavorPrice, ...] = (
    FlavorPrice(name="cpu-basic", micro_usd_per_minute=167),
    FlavorPrice(name="cpu-upgrade", micro_usd_per_minute=500),
)

# Job uids come from this range (above any account's and most containers' subordinate ids).
UID_BASE, UID_SPAN = 2_100_000_000, 40_000_000


def python_version(python: str) -> str:
    """The "major.minor" version of the interpreter at `python` (its jobs' scripts are checked
    for it). Raises RuntimeError when it does not run."""
    try:
        done = subprocess.run(
            [python, "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"the job interpreter {python} does not run: {exc}") from None
    return done.stdout.strip()


class LocalBackend:
    """Implements activities.backends.interface.JobsBackend with jobs on this machine."""

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
        capacity: Capacity | None = None,
        warm_evaluators: bool = True,
        retention: Retention | None = None,
    ) -> None:
        """`state_dir` is the backend's own folder (`<POSTTRAIN_STATE_DIR>/local`).
        `warm_evaluators`: evaluations share one venv per evaluator, built once
        (activities/backends/local/evaluator_venvs.py); False: each installs its own.
        `find_links`: folders of wheels that installs use besides PyPI (the server's
        POSTTRAIN_LOCAL_FIND_LINKS); `no_index`: those folders only (tests). Never anything
        an agent sets. `capacity`: what jobs may share (default: what this server may use
        of the machine). `retention`: where ended episodes' records are and how long their job
        folders are kept, so that a job refused for host disk is told what holds it."""
        self.state_dir = state_dir
        self.retention = retention
        self.jobs_dir = state_dir / "jobs"
        self.hub = LocalHub(state_dir / "hub")
        self.limits = limits or LocalLimits()
        self.default_artifact_cap_bytes = self.limits.artifact_cap_bytes
        self.default_storage_cap_bytes = LOCAL_EPISODE_STORAGE_BYTES
        self.store = JobStore(self.jobs_dir, supervisor_python or sys.executable)
        self.job_python_version = python_version(job_python)
        self.capacity = capacity or machine_capacity()
        self.containment: Containment = find_containment(
            state_dir, supervisor_python or sys.executable, self.limits.size_every_s
        )
        # What jobs of an earlier server left behind, if anything (a supervisor killed with it).
        self.store.sweep(self.containment.placements)
        uv_cache = state_dir / "uv-cache"
        uv_cache.mkdir(exist_ok=True)
        os.chmod(uv_cache, 0o700)  # root's (or the server user's) alone; jobs never mount it
        self.machine = Machine(
            bwrap=bwrap or find_bwrap(),
            job_python=job_python,
            job_python_version=self.job_python_version,
            uv=uv or _find_uv(),
            uv_cache=uv_cache,
            privileged=os.geteuid() == 0,
            find_links=tuple(find_links),
            no_index=no_index,
            host_env=dict(os.environ),
            evaluator_venvs=state_dir / "evaluator-venvs" if warm_evaluators else None,
        )

    # -- JobsBackend ---------------------------------------------------------------------------

    async def submit(self, request: JobRequest) -> BackendJob:
        return await asyncio.to_thread(self._submit, request)

    async def find_by_key(self, key: str, now: datetime) -> BackendJob | None:
        return await asyncio.to_thread(self.store.view, job_ref(key))

    async def observe(self, refs: Sequence[str], now: datetime) -> dict[str, BackendJob]:
        def views() -> dict[str, BackendJob]:
            found = {ref: self.store.view(ref) for ref in refs}
            return {ref: view for ref, view in found.items() if view is not None}

        return await asyncio.to_thread(views)

    async def cancel(self, ref: str, now: datetime) -> BackendJob:
        return await asyncio.to_thread(self.store.cancel, ref)

    async def keep_outputs(self, job: KeepOutputs) -> BackendJob:
        """The supervisor measured and kept (or refused) the outputs as the job ended."""
        view = await asyncio.to_thread(self.store.view, job.ref)
        if view is None:
            raise ToolError(ErrorType.hf_error, f"no local job {job.ref!r}")
        return view

    async def logs(self, ref: str, tail: int, now: datetime) -> list[str]:
        folder = self.store.known(ref)
        return await asyncio.to_thread(jf.tail_lines, folder / jf.LOG, tail)

    async def hardware(self) -> list[FlavorPrice]:
        return list(LOCAL_PRICES)

    def job_limits(self) -> JobLimits:
        """What one job of each flavor may use here, and which limits only a stand-in holds."""
        flavors = {}
        for price in LOCAL_PRICES:
            res = self.resources(price.name)
            flavors[price.name] = FlavorLimits(
                vcpus=res.vcpus,
                memory_bytes=res.memory_bytes,
                processes=res.processes,
                disk_bytes=res.disk_bytes,
                files=res.files,
            )
        return JobLimits(flavors=flavors, not_enforced=list(self.containment.gaps))

    def resources(self, flavor: str, artifact_cap: int | None = None) -> JobResources:
        return job_resources(flavor, self.capacity, self.limits, artifact_cap)

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

    def storage(self) -> LocalJobStorage:
        return LocalJobStorage(self.store, self.retention)

    async def read_dataset(self, repo_id: str, revision: str, max_bytes: int) -> DatasetBytes:
        try:
            folder = self.hub.path("datasets", repo_id, revision)
        except HubError as exc:
            raise ToolError(ErrorType.not_allowed, str(exc)) from None
        return await asyncio.to_thread(read_folder, folder, max_bytes)

    async def read_outputs(self, ref: str, max_bytes: int) -> DatasetBytes:
        try:
            folder = self.storage().artifact_folder(ref)
        except StorageRefused as exc:
            raise ToolError(ErrorType.not_allowed, str(exc)) from None
        if folder is None:
            raise ToolError(ErrorType.not_allowed, f"the outputs of local job {ref} are gone")
        return await asyncio.to_thread(read_folder, folder, max_bytes, outputs=True)

    # -- submit ----------------------------------------------------------------------------------

    def _submit(self, request: JobRequest) -> BackendJob:
        ref = job_ref(request.key)
        existing = self.store.view(ref)
        if existing is not None:
            # The same key again: the job it started, never a second one; started now if the
            # first submit died before its supervisor got the secrets.
            return self.store.start_unclaimed(ref, secret_env(request)) or existing
        if request.role is JobRole.agent and request.secrets:
            raise ValueError("agent jobs get no secrets (DESIGN §6)")
        base_model, datasets, artifact = self._inputs(request)
        uid = self._allocate_uid()
        folder = self.jobs_dir / ref
        plan = plan_job(request, folder, self.machine, uid, base_model, datasets, artifact)
        limits = self.limits
        artifact_cap = request.artifact_cap_bytes or limits.artifact_cap_bytes
        resources = self.resources(request.flavor, artifact_cap)
        contained = self.containment.controllers
        spec = {
            "key": request.key,
            "role": request.role.value,
            "job_id": request.job_id,
            "timeout_s": request.timeout_s,
            "uid": uid,
            "privileged": self.machine.privileged,
            "phases": plan.phases,
            "collect": plan.collect,
            "data_owner": plan.data_owner,
            "poll_s": limits.poll_s,
            "size_every_s": limits.size_every_s,
            "resources": dataclasses.asdict(resources),
            # Control groups: the jobs' parent (all jobs of this server) and the job's own.
            "cgroups": [dataclasses.asdict(p) for p in self.containment.placements],
            "jobs_limits": {
                "memory_bytes": jobs_memory_bytes(self.capacity, limits),
                "cpus": None if limits.cpu_share >= 1 else jobs_cpus(self.capacity, limits),
                "cpu_weight": LOCAL_JOBS_CPU_WEIGHT,
            },
            "job_cpu_weight": LOCAL_JOB_CPU_WEIGHT,
            "disk_io": {"bytes_per_s": LOCAL_JOB_DISK_BYTES_PER_S, "iops": LOCAL_JOB_DISK_IOPS},
            "busy_job": {
                "after_cpu_s": limits.busy_job_after_cpu_s,
                "cpu_weight": LOCAL_BUSY_JOB_CPU_WEIGHT,
            },
            "filesystem": (
                dataclasses.asdict(self.containment.filesystem)
                if self.containment.filesystem
                else None
            ),
            "niceness": 0 if "cpu" in contained else FALLBACK_NICENESS,
            # The host disk jobs never take: checked by the supervisor before the job starts.
            "host_disk_reserve_bytes": limits.host_disk_reserve_bytes,
            "retention": dataclasses.asdict(self.retention) if self.retention else None,
            # rlimits: memory and processes only where no control group holds them.
            "limits": {
                "nproc": None if "pids" in contained else resources.processes,
                "memory_bytes": None if "memory" in contained else resources.memory_bytes,
                "file_bytes": limits.file_bytes or resources.disk_bytes,
            },
            "watch": {
                "artifact_cap_bytes": artifact_cap,
                # What its episode may still keep, and the episode's whole storage cap.
                "storage_bytes": request.storage_allowance_bytes,
                "storage_cap_bytes": request.storage_cap_bytes,
                "disk_cap_bytes": resources.disk_bytes,
                "max_files": resources.files,
            },
        }
        return self.store.create(ref, plan, spec)

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
            artifact = self.store.artifact(request.artifact_ref)
            if artifact is None:
                raise ToolError(
                    ErrorType.not_ready, "the job to evaluate has no artifact (it has not ended)"
                )
        return base, datasets, artifact

    def _allocate_uid(self) -> int:
        """A uid that no process on this machine and no live job of ours uses.

        Drawn at random from a 40-million-id range and checked against /proc and our live
        jobs, so concurrent jobs (also of other state dirs) practically never share one.
        """
        used = _uids_in_use() | self.store.live_uids()
        rng = random.SystemRandom()
        while True:
            uid = UID_BASE + rng.randrange(UID_SPAN)
            if uid not in used:
                return uid


def _find_uv() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise FileNotFoundError("uv is not installed; local jobs install with it") from None
        return found


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
