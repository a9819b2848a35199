"""Building the local backend from the settings (`BACKEND.build`): SystemExit with a message
when this machine cannot run local jobs; logs what holds each job's limits here."""

from __future__ import annotations

import logging
import os

from activities.backends.local.backend import LocalBackend
from activities.backends.local.resources import LimitsError, LocalLimits, describe_bytes
from activities.backends.local.scratch import Retention
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_env.limits import GIB

log = logging.getLogger(__name__)


def build(settings: Settings, key: ServerKey) -> LocalBackend:
    """SystemExit with a message when this machine cannot run local jobs. Logs what holds each
    job's limits here, and warns about each limit only a weaker stand-in holds."""
    del key  # local jobs carry no deployment label
    python = settings.job_python
    if not os.access(python, os.X_OK):
        raise SystemExit(
            f"POSTTRAIN_JOB_PYTHON={python} is not an executable interpreter; local jobs "
            "need one that their unprivileged uid can run (e.g. /usr/bin/python3)"
        )
    try:
        limits = LocalLimits(
            disk_cap_bytes=round(settings.local_job_disk_gib * GIB),
            max_files=settings.local_job_files,
            nproc=settings.local_job_processes,
            memory_share=settings.local_memory_share,
            cpu_share=settings.local_cpu_share,
        )
        backend = LocalBackend(
            settings.state_dir / "local",
            job_python=python,
            limits=limits,
            find_links=settings.local_find_link_list,
            retention=Retention(
                audit_dir=str(settings.audit_folder),
                job_days=settings.job_retention_days or None,
            ),
        )
    except LimitsError as exc:
        raise SystemExit(f"POSTTRAIN_LOCAL_*: {exc}") from None
    except (RuntimeError, FileNotFoundError) as exc:
        raise SystemExit(f"the local backend cannot run here: {exc}") from None
    containment = backend.containment
    for flavor, size in backend.job_limits().flavors.items():
        log.info(
            "local jobs (%s): %g CPUs, %s memory, %d processes, %s disk, %d files",
            flavor,
            size.vcpus,
            describe_bytes(size.memory_bytes),
            size.processes,
            describe_bytes(size.disk_bytes),
            size.files,
        )
    held = [f"{p.controller} (cgroup v{p.version})" for p in containment.placements]
    if containment.filesystem is not None:
        held.append("disk and files (a filesystem per job)")
    log.info("local job limits held by the kernel: %s", ", ".join(held) or "none")
    for gap in containment.gaps:
        log.warning("local job limit not enforced here: %s", gap)
    return backend
