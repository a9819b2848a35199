"""What this host lets the local backend enforce on a job, found out once at start.

Each limit is held by the kernel where the host allows it — a control group per controller
(activities/backends/local/cgroups.py), a filesystem per job (activities/backends/local/scratch.py)
— and
otherwise by a weaker stand-in, which `gaps` names so that the server can say so at start, in
its log and in `task_info` (never pretending):

| limit     | by the kernel                       | stand-in without it                        |
|-----------|-------------------------------------|--------------------------------------------|
| memory    | memory group, swap off              | RLIMIT_AS per process                      |
| processes | pids group                          | RLIMIT_NPROC on the job's uid              |
| CPU       | cpu group: weight and quota         | nice 10                                    |
| disk      | an ext4 image (/data, /tmp, venv)   | folders measured every `size_every_s`      |

Everything here needs root; without it every limit uses its stand-in.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from activities.backends.local.cgroups import Placement, check_placement, find_placements
from activities.backends.local.scratch import Tools, find_tools

# The folder that holds the `activities` package: as many levels up as this module is deep.
PROJECT_ROOT = Path(__file__).resolve().parents[len(__name__.split(".")) - 1]
# Niceness of a job's processes where there is no cpu group to weigh them.
FALLBACK_NICENESS = 10


@dataclass(frozen=True)
class Containment:
    """What holds each limit of this backend's jobs."""

    placements: tuple[Placement, ...]  # control groups, one per controller that works here
    filesystem: Tools | None  # the tools that make each job's filesystem, if that works here
    gaps: tuple[str, ...]  # limits held only by a stand-in here, and why

    @property
    def controllers(self) -> set[str]:
        return {p.controller for p in self.placements}


def jobs_group_name(state_dir: Path) -> str:
    """The name of this state dir's jobs' parent group (one per server, found again after a
    restart, distinct between servers on one machine)."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return f"posttrain-jobs-{digest}"


def find_containment(state_dir: Path, supervisor_python: str, size_every_s: float) -> Containment:
    """What this host gives the jobs of `state_dir` (see the table above)."""
    placements, missing = find_placements(jobs_group_name(state_dir))
    gaps: list[str] = []
    if os.geteuid() != 0:
        placements = []
        missing = {c: "the server does not run as root" for c in ("memory", "pids", "cpu")}
    else:
        working = []
        for placement in placements:
            reason = _placement_works(placement)
            if reason is None:
                working.append(placement)
            else:
                missing[placement.controller] = reason
        placements = working
    for controller, stand_in in (
        (
            "memory",
            "each process is limited to the job's memory in address space (RLIMIT_AS), "
            "so a job with several processes can use more",
        ),
        ("pids", "the job's uid is limited to its number of processes (RLIMIT_NPROC)"),
        (
            "cpu",
            f"jobs run at a lower priority (nice {FALLBACK_NICENESS}) instead of with a "
            "weight and a quota, so a busy job slows other jobs and the server (more so "
            "where the kernel groups processes by session: each session weighs as one user)",
        ),
    ):
        if controller in missing:
            gaps.append(
                f"{controller}: no {controller} control group ({missing[controller]}); {stand_in}"
            )
    filesystem, reason = _filesystem(state_dir, supervisor_python)
    if filesystem is None:
        gaps.append(
            f"disk: no filesystem of its own per job ({reason}); the job's folders are measured "
            f"every {size_every_s:g} s instead, which misses files it unlinked but keeps open"
        )
    return Containment(placements=tuple(placements), filesystem=filesystem, gaps=tuple(gaps))


@functools.cache
def _placement_works(placement: Placement) -> str | None:
    """Once per process and controller (a probe group of its own, made and removed)."""
    return check_placement(placement, f"posttrain-probe-{os.getpid()}-{secrets.token_hex(4)}")


def _filesystem(state_dir: Path, supervisor_python: str) -> tuple[Tools | None, str]:
    if os.geteuid() != 0:
        return None, "the server does not run as root"
    tools = find_tools()
    if tools is None:
        return None, "mkfs.ext4, mount or umount is not installed"
    reason = _filesystem_works(tools, str(state_dir), supervisor_python)
    return (tools, "") if reason is None else (None, reason)


@functools.cache
def _filesystem_works(tools: Tools, state_dir: str, python: str) -> str | None:
    """Make, mount, fill and remove a small job filesystem in a process of its own, as a
    supervisor does. Once per process and state dir. None when it works, else the reason."""
    os.makedirs(state_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fs-probe-", dir=state_dir) as folder:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": str(PROJECT_ROOT)}
        try:
            done = subprocess.run(
                [python, "-P", "-m", "activities.backends.local.scratch", folder],
                capture_output=True,
                env=env,
                timeout=60,
                cwd="/",
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the probe did not run: {exc}"
        if done.returncode != 0:
            return (done.stderr or done.stdout).decode(errors="replace").strip()[-500:]
    return None
