"""Retention tests' world on disk: local job folders laid out as the local backend lays them out
(activities/backends/local/jobfiles.py), and audit records that name them."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path

from activities.backends.local import jobfiles as jf
from activities.backends.local.store import job_ref
from activities.records.audit import write_record
from posttrain_common.contracts.audit import AuditCall, AuditJob, AuditRecord


def job_folder(
    jobs_dir: Path,
    key: str,
    *,
    ended: bool = True,
    artifact: int = 1000,
    log: int = 300,
    role: str = "agent",
    ended_days_ago: float = 0.0,
) -> Path:
    """A local job's folder: its spec, log, script, and (once ended) its result and artifact.
    A job that has not ended has a live supervisor (this test process)."""
    folder = jobs_dir / job_ref(key)
    (folder / "job").mkdir(parents=True)
    (folder / "job" / "launcher.py").write_text("print('hi')\n")
    (folder / jf.LOG).write_bytes(b"x" * log)
    now = time.time() - ended_days_ago * 86400
    job_id = f"job-{key.rsplit('/', 1)[-1]}"
    jf.write_json(
        folder / jf.JOB, {"key": key, "created_at": now - 600, "role": role, "job_id": job_id}
    )
    if not ended:
        jf.write_json(folder / jf.SUPERVISOR, jf.identity(os.getpid()))
        jf.write_json(folder / jf.STATUS, {"started_at": now - 500})
        return folder
    jf.write_json(
        folder / jf.RESULT,
        {
            "state": "succeeded",
            "exit_code": 0,
            "started_at": now - 500,
            "finished_at": now - 400,
            "running_s": 100.0,
            "message": "",
        },
    )
    (folder / jf.ARTIFACT).mkdir()
    (folder / jf.ARTIFACT / "model.safetensors").write_bytes(b"w" * artifact)
    return folder


def record(
    audit_dir: Path,
    episode_id: str,
    ended_at: datetime | None,
    jobs: dict[str, tuple[str, str]],
    *,
    submitted: str | None = None,
    backend: str = "local",
) -> AuditRecord:
    """Write the audit record of an episode whose `jobs` are job id -> (role, ref); a grader
    job evaluates `submitted`, and the episode's last call submitted it."""
    audit_jobs = [
        AuditJob(
            job_id=job_id,
            workflow_id=f"episode-{episode_id}/job/{n}",
            role=role,
            flavor="cpu-basic",
            timeout_s=600,
            base_model="m",
            base_model_revision="r" * 40,
            backend_job_id=ref,
            evaluated_job_id=submitted if role == "grader" else None,
        )
        for n, (job_id, (role, ref)) in enumerate(jobs.items(), start=1)
    ]
    calls = []
    if submitted is not None:
        calls.append(
            AuditCall(request_id="r1", tool="submit", path="step", arguments={"job_id": submitted})
        )
    rec = AuditRecord(
        episode_id=episode_id,
        task_id="t_test",
        base_model="m",
        base_model_revision="r" * 40,
        backend=backend,
        ended_at=ended_at,
        jobs=audit_jobs,
        calls=calls,
    )
    write_record(audit_dir, rec)
    return rec


def tree(folder: Path) -> list[str]:
    """Every path under `folder` (links not followed), relative, sorted."""
    found = []
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            found.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(found)


def sidecar(audit_dir: Path, episode_id: str) -> dict:
    return json.loads((audit_dir / "retention" / f"{episode_id}.json").read_text())
