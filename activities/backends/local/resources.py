"""What one local job may use, by flavor, on this machine (docs/backends.md, "Local backend", the
table).

A job gets its Hugging Face flavor's size (`posttrain_env.limits.HF_CPU_FLAVORS`), scaled down
to what this machine can give: never more CPUs than the jobs' share of the machine's, never
more memory than all jobs together may hold. "The machine" is what this server may itself use:
its CPU affinity and memory, lowered by the quota and limit of the control groups it runs in
(a container or a systemd service), so a server in a 4 GiB container never promises 16 GiB.
Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from posttrain_env.limits import (
    DEFAULT_FLAVOR,
    GIB,
    HF_CPU_FLAVORS,
    LOCAL_ARTIFACT_CAP_BYTES,
    LOCAL_BUSY_JOB_AFTER_CPU_S,
    LOCAL_CPU_SHARE,
    LOCAL_JOB_DISK_BYTES,
    LOCAL_JOB_FILES,
    LOCAL_JOB_LOG_BYTES,
    LOCAL_JOB_PROCESSES,
    LOCAL_MEMORY_SHARE,
    MIB,
)

# Bytes of ext4 metadata per inode (the inode itself; mkfs.ext4's default inode size): a job's
# filesystem must hold its inode tables and still leave room for data.
INODE_BYTES = 256
# At least this much of a job's disk must be left for data once its inodes are counted.
MIN_DATA_BYTES = 4 * MIB
# The host disk that jobs never take (docs/backends.md, "Local backend"): a job starts only if the
# free
# space on the state dir, less what the other running jobs' disks may still grow into, holds
# its own disk and this much more, for the server's state, Temporal, logs and the system.
HOST_DISK_RESERVE_BYTES = 2 * GIB


class LimitsError(ValueError):
    """Local limits that cannot work together (raised when the backend is built)."""


@dataclass(frozen=True)
class LocalLimits:
    """The local backend's limits (defaults: posttrain_env/limits.py, "local jobs").

    Per job, whatever its flavor: artifact, disk, files, processes, log. Per flavor (scaled to
    this machine): CPUs and memory. `memory_bytes` caps every job's memory further (tests);
    `file_bytes` is RLIMIT_FSIZE (None: the disk size). `host_disk_reserve_bytes`: the host
    disk kept free of jobs (see HOST_DISK_RESERVE_BYTES).
    """

    artifact_cap_bytes: int = LOCAL_ARTIFACT_CAP_BYTES
    disk_cap_bytes: int = LOCAL_JOB_DISK_BYTES
    max_files: int = LOCAL_JOB_FILES
    nproc: int = LOCAL_JOB_PROCESSES
    log_cap_bytes: int = LOCAL_JOB_LOG_BYTES
    memory_bytes: int | None = None
    file_bytes: int | None = None
    memory_share: float = LOCAL_MEMORY_SHARE
    cpu_share: float = LOCAL_CPU_SHARE
    poll_s: float = 0.1
    size_every_s: float = 0.5
    host_disk_reserve_bytes: int = HOST_DISK_RESERVE_BYTES
    # A job weighs less once it used this much CPU (posttrain_env/limits.py).
    busy_job_after_cpu_s: float = LOCAL_BUSY_JOB_AFTER_CPU_S

    def __post_init__(self) -> None:
        for name in ("artifact_cap_bytes", "disk_cap_bytes", "max_files", "nproc"):
            if getattr(self, name) <= 0:
                raise LimitsError(f"local limits: {name} must be positive")
        if self.host_disk_reserve_bytes < 0:
            raise LimitsError("local limits: the host disk reserve cannot be negative")
        if self.log_cap_bytes < MIB:
            raise LimitsError("local limits: the log cap must be at least 1 MiB")
        for name in ("memory_share", "cpu_share"):
            share = getattr(self, name)
            if not 0 < share <= 1:
                raise LimitsError(f"local limits: {name} must be in (0, 1], not {share}")
        if self.memory_bytes is not None and self.memory_bytes < 64 * MIB:
            raise LimitsError("local limits: a job needs at least 64 MiB of memory")
        data = self.disk_cap_bytes - self.max_files * INODE_BYTES
        if data < max(MIN_DATA_BYTES, self.disk_cap_bytes // 2):
            raise LimitsError(
                f"local limits: {self.max_files} files take {self.max_files * INODE_BYTES} "
                f"bytes of inode tables, more than half of the {self.disk_cap_bytes}-byte disk; "
                "give jobs more disk or fewer files"
            )


@dataclass(frozen=True)
class Capacity:
    """What this machine can give jobs: CPUs and memory the server itself may use."""

    cpus: float
    memory_bytes: int


@dataclass(frozen=True)
class JobResources:
    """One job's limits."""

    flavor: str
    vcpus: float
    memory_bytes: int
    processes: int
    disk_bytes: int
    files: int
    log_bytes: int


def jobs_memory_bytes(capacity: Capacity, limits: LocalLimits) -> int:
    """All local jobs together: their parent group's memory limit."""
    return int(capacity.memory_bytes * limits.memory_share)


def jobs_cpus(capacity: Capacity, limits: LocalLimits) -> float:
    """All local jobs together: their parent group's CPU quota (in CPUs)."""
    return capacity.cpus * limits.cpu_share


def job_resources(
    flavor: str, capacity: Capacity, limits: LocalLimits, artifact_cap: int | None = None
) -> JobResources:
    """A job of `flavor` on this machine. Its disk holds at least its artifact cap."""
    size = HF_CPU_FLAVORS.get(flavor) or HF_CPU_FLAVORS[DEFAULT_FLAVOR]
    memory = min(size.memory_bytes, jobs_memory_bytes(capacity, limits))
    if limits.memory_bytes is not None:
        memory = min(memory, limits.memory_bytes)
    vcpus = min(size.vcpus, jobs_cpus(capacity, limits))
    disk = max(limits.disk_cap_bytes, artifact_cap or limits.artifact_cap_bytes)
    return JobResources(
        flavor=flavor,
        vcpus=round(vcpus, 2),
        memory_bytes=memory,
        processes=limits.nproc,
        disk_bytes=disk,
        files=limits.max_files,
        log_bytes=limits.log_cap_bytes,
    )


def machine_capacity(cgroup_root: Path = Path("/sys/fs/cgroup")) -> Capacity:
    """This server's CPUs (affinity, lowered by its CPU quota) and memory (RAM, lowered by its
    memory limit), read from /proc and its control groups."""
    cpus = float(len(os.sched_getaffinity(0)))
    memory = _mem_total()
    for version, folder in _own_groups(cgroup_root):
        for group in _ancestry(folder):
            quota = _cpu_quota(group, version)
            if quota is not None:
                cpus = min(cpus, quota)
            limit = _memory_limit(group, version)
            if limit is not None:
                memory = min(memory, limit)
    return Capacity(cpus=max(cpus, 0.1), memory_bytes=memory)


def describe_bytes(size: int) -> str:
    """`16.0 GiB`, `512 MiB`: sizes as people read them in messages."""
    if size >= GIB:
        return f"{size / GIB:.1f} GiB"
    return f"{size // MIB} MiB" if size >= MIB else f"{size} bytes"


# -- reading this process's own limits -----------------------------------------------------------


def _mem_total() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _own_groups(root: Path) -> list[tuple[int, Path]]:
    """(version, folder) of each control group this process is in, where it is mounted."""
    groups: list[tuple[int, Path]] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return groups
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            groups.append((2, root / "unified" / path.lstrip("/")))
            groups.append((2, root / path.lstrip("/")))
        else:
            for name in controllers.split(","):
                if name in ("memory", "cpu"):
                    groups.append((1, root / name / path.lstrip("/")))
    return [(v, folder) for v, folder in groups if folder.is_dir()]


def _ancestry(folder: Path) -> list[Path]:
    """The folder and its parents up to the hierarchy's root (the first without limits files)."""
    chain = []
    while True:
        chain.append(folder)
        if folder.parent == folder or not (folder.parent / "cgroup.procs").exists():
            return chain
        folder = folder.parent


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpu_quota(group: Path, version: int) -> float | None:
    if version == 2:
        text = _read(group / "cpu.max")
        if not text or text.startswith("max"):
            return None
        quota, period = text.split()
        return int(quota) / int(period)
    quota_text, period_text = _read(group / "cpu.cfs_quota_us"), _read(group / "cpu.cfs_period_us")
    if not quota_text or not period_text or int(quota_text) <= 0:
        return None
    return int(quota_text) / int(period_text)


def _memory_limit(group: Path, version: int) -> int | None:
    text = _read(group / ("memory.max" if version == 2 else "memory.limit_in_bytes"))
    if not text or text == "max":
        return None
    limit = int(text)
    return limit if limit < (1 << 60) else None  # v1 writes "no limit" as a huge number
