"""Host disk admission that is honest across episodes (issue 30, tracked as 41): a local job
starts only when the host holds its disk and the artifact it may keep beside what running jobs
may still take, and a refusal says what holds the space (running jobs, artifacts of live
episodes, artifacts kept for retention) and when the first of those frees.

Run on folders made here (the supervisor's own function); the real jobs' side is in
tests/local/test_containment.py.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from activities.backends.local.scratch import HostDiskError, Retention, claim_host_disk

MIB = 1 << 20


def job_folder(jobs: Path, name: str, episode: str, *, running: bool = False) -> Path:
    folder = jobs / name
    folder.mkdir(parents=True)
    spec = {
        "key": f"episode-{episode}/job/1",
        "role": "agent",
        "watch": {"artifact_cap_bytes": 4 * MIB, "storage_bytes": 3 * MIB},
    }
    (folder / "job.json").write_text(json.dumps(spec))
    if running:
        with open(folder / "fs.img", "wb") as fh:
            fh.truncate(16 * MIB)  # sparse: 16 MiB it may still grow into
    return folder


def artifact(folder: Path, size: int) -> None:
    (folder / "artifact").mkdir()
    (folder / "artifact" / "model.bin").write_bytes(os.urandom(size))


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_refusal_says_what_holds_the_disk_and_when_retention_frees_it(tmp_path: Path) -> None:
    jobs, audit = tmp_path / "jobs", tmp_path / "audit"
    audit.mkdir()
    job_folder(jobs, "local-running", "ep-running", running=True)
    artifact(job_folder(jobs, "local-live", "ep-live"), 2 * MIB)
    artifact(job_folder(jobs, "local-ended", "ep-ended"), 1 * MIB)
    ended = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    (audit / "ep-ended.json").write_text(json.dumps({"ended_at": ended.isoformat()}))
    new = job_folder(jobs, "local-new", "ep-new")
    with pytest.raises(HostDiskError) as refused:
        claim_host_disk(
            new,
            disk_bytes=8 * MIB,
            reserve_bytes=free_bytes(jobs),  # more than is free: refused whatever the disk
            image=True,
            artifact_bytes=2 * MIB,
            holders=Retention(audit_dir=str(audit), job_days=14),
        )
    message = str(refused.value)
    assert "this job's disk of 8 MiB (/data, /tmp and its packages) and its artifact of up to" in (
        message
    )
    # The running job may still grow into its image and write its artifact (3 MiB left).
    assert "19 MiB may still be taken by 1 running job(s)" in message
    assert "2 MiB is held by the artifacts of 1 live episode(s)" in message
    assert "1 MiB by the artifacts of 1 ended episode(s) kept for retention" in message
    due = (ended + timedelta(days=14)).strftime("%Y-%m-%d %H:%M UTC")
    assert f"the first is due for deletion at {due}" in message
    assert not (new / "fs.img").exists()  # nothing made for a job that does not start
    assert str(tmp_path) not in message  # no host path in what the agent reads


def test_a_job_that_fits_beside_the_others_gets_its_image(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    job_folder(jobs, "local-running", "ep-a", running=True)
    new = job_folder(jobs, "local-new", "ep-b")
    claim_host_disk(new, disk_bytes=8 * MIB, reserve_bytes=0, image=True, artifact_bytes=MIB)
    image = new / "fs.img"
    assert image.stat().st_size == 8 * MIB and image.stat().st_blocks == 0  # sparse


def test_what_running_jobs_may_still_write_counts_against_a_new_job(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    job_folder(jobs, "local-running", "ep-a", running=True)  # 16 MiB image + 3 MiB artifact
    new = job_folder(jobs, "local-new", "ep-b")
    free = free_bytes(jobs)
    # What is left once the running job's 19 MiB are counted (less a margin) fits...
    claim_host_disk(new, disk_bytes=free - 19 * MIB - 64 * MIB, reserve_bytes=0, image=False)
    # ...and 64 MiB more than that does not (margins: other work moves the disk meanwhile).
    with pytest.raises(HostDiskError):
        claim_host_disk(new, disk_bytes=free - 19 * MIB + 64 * MIB, reserve_bytes=0, image=False)


async def test_the_worker_metric_counts_what_live_and_ended_episodes_artifacts_hold(
    tmp_path: Path,
) -> None:
    import asyncio

    from activities.backends.local.storage import LocalJobStorage
    from posttrain_common import metrics
    from posttrain_server.worker_metrics import count_stored_bytes

    jobs, audit = tmp_path / "jobs", tmp_path / "audit"
    audit.mkdir()
    artifact(job_folder(jobs, "local-live", "ep-live"), 2 * MIB)
    artifact(job_folder(jobs, "local-ended", "ep-ended"), 1 * MIB)
    (audit / "ep-ended.json").write_text(json.dumps({"ended_at": "2026-12-01T00:00:00+00:00"}))

    class Store:  # what LocalJobStorage reads of its store: the jobs folder
        jobs_dir = jobs

    storage = LocalJobStorage(Store(), Retention(audit_dir=str(audit), job_days=14))  # type: ignore[arg-type]
    counting = asyncio.create_task(count_stored_bytes(storage, every_s=0.05))
    try:
        for _ in range(200):
            await asyncio.sleep(0.05)
            if metrics.STORED_BYTES.labels("retained")._value.get() > 0:
                break
    finally:
        counting.cancel()
    assert metrics.STORED_BYTES.labels("live")._value.get() >= 2 * MIB
    assert 1 * MIB <= metrics.STORED_BYTES.labels("retained")._value.get() < 2 * MIB
