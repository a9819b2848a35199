"""Retention on Hugging Face: a job's folder in the `jobs-artifacts` bucket (its script, its
outputs) deleted through the Hub calls the backend already makes, the submitted job's outputs
kept until their own time, nothing outside a job's own folder touched (the fake Hub behind the
real backend). The sweep's Schedule, created by the worker, is triggered on the dev server (the
test server implements no Schedules)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from huggingface_hub import constants
from temporalio.testing import WorkflowEnvironment

from activities.backends.hf.backend import HfBackend
from activities.backends.hf.labels import HfRef
from activities.backends.storage import StorageRefused
from activities.records.retention import RetentionActivities
from posttrain_common.contracts.retention import RetentionPolicy, RetentionReport, SweepRetention
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_server.wiring import TemporalEpisodeLiveness, retention_schedule_id
from posttrain_server.worker import build_worker
from tests.hf.conftest import TOKEN, request
from tests.hf.fake_hub import T0, FakeHub, JobPlan
from tests.hf.schedules import dev_server, first_run, once_it_answers
from tests.operator.retention_files import record, sidecar

OLD, RECENT = "ep-aaaaaaaaaaaaaaaa", "ep-bbbbbbbbbbbbbbbb"
DAY = timedelta(days=1)
POLICY = RetentionPolicy(job_after=14 * DAY, submitted_after=90 * DAY)


def bucket(hub: FakeHub) -> dict[str, int]:
    return hub.buckets[f"{hub.namespace}/{constants.HF_JOBS_ARTIFACTS_BUCKET_NAME}"]


def under(hub: FakeHub, ref: str) -> list[str]:
    folder = HfRef.decode(ref).folder
    return sorted(path for path in bucket(hub) if path.startswith(f"{folder}/"))


async def finished_jobs(hub: FakeHub, backend: HfBackend, episode: str, n: int) -> list[str]:
    """`n` agent jobs of `episode` that ran and left a 5,000-byte checkpoint; their refs."""
    hub.plan = JobPlan(scheduling_s=0, running_s=1, outputs={"model.safetensors": 5000})
    refs = []
    for i in range(n):
        job = await backend.submit(
            request(n=len(hub.jobs) + 1, episode_id=episode, key=f"episode-{episode}/job/{i}")
        )
        refs.append(job.ref)
    hub.advance(30)
    for ref in refs:
        hub.info(HfRef.decode(ref).job_id)  # the fake Hub writes outputs once a job is seen done
    return refs


async def test_retention_deletes_old_bucket_folders_and_keeps_the_submitted_outputs(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, hub: FakeHub, backend: HfBackend
) -> None:
    audit_dir = tmp_path / "audit"
    submitted, other = await finished_jobs(hub, backend, OLD, 2)
    (recent,) = await finished_jobs(hub, backend, RECENT, 1)
    # A neighbour whose name starts with the job's folder: the Hub matches prefixes
    # character by character, so only the slash keeps it out.
    neighbour = f"{HfRef.decode(other).folder}x/outputs/model.safetensors"
    bucket(hub)[neighbour] = 7
    no_folder = HfRef(job_id="68780d00bbe36d38803f00ff", namespace=hub.namespace).encode()
    ended = T0 + timedelta(minutes=5)
    record(
        audit_dir,
        OLD,
        ended,
        {"job-s": ("agent", submitted), "job-o": ("agent", other), "job-n": ("agent", no_folder)},
        submitted="job-s",
        backend="hf",
    )
    record(audit_dir, RECENT, ended + 10 * DAY, {"job-r": ("agent", recent)}, backend="hf")
    storage = backend.storage()
    assert await storage.artifact_bytes(submitted) == 5000
    retention = RetentionActivities(
        storage, TemporalEpisodeLiveness(time_skipping_env.client), audit_dir, POLICY
    )
    folder = HfRef.decode(submitted).folder
    before = dict(bucket(hub))

    def size(ref: str, but_outputs: bool = False) -> int:
        prefix = f"{HfRef.decode(ref).folder}/"
        kept = f"{prefix}outputs/" if but_outputs else None
        return sum(
            n
            for p, n in before.items()
            if p.startswith(prefix) and not (kept and p.startswith(kept))
        )

    report = await retention.sweep_retention(SweepRetention(now=ended + 20 * DAY))
    assert under(hub, other) == []
    assert under(hub, submitted) == [f"{folder}/outputs/model.safetensors"]
    assert len(under(hub, recent)) == 2 and bucket(hub)[neighbour] == 7
    assert {d.job_id: d.bytes for d in report.deleted} == {
        "job-o": size(other),
        "job-s": size(submitted, but_outputs=True),
    }
    assert size(other) > 5000 and report.bytes_deleted == size(submitted) + size(other) - 5000
    assert "names no folder" in report.refused[no_folder]
    deletes = hub.calls_to("batch_bucket_files")
    assert deletes and all(c.token == TOKEN for c in deletes)  # the broker's api
    folders = {HfRef.decode(ref).folder for ref in (submitted, other)}
    for call in deletes:
        assert {path.split("/")[0] for path in call.args["delete"]} <= folders

    later = await retention.sweep_retention(SweepRetention(now=ended + 91 * DAY))
    assert under(hub, submitted) == [] and under(hub, recent) == []
    assert {d.job_id for d in later.deleted} == {"job-s", "job-r"} and not later.refused
    assert bucket(hub)[neighbour] == 7
    assert sidecar(audit_dir, OLD)["folders"][0]["bytes_deleted"] == size(submitted)
    again = await retention.sweep_retention(SweepRetention(now=ended + 91 * DAY))
    assert again.deleted == [] and again.examined == 0


async def test_a_ref_of_another_backend_or_a_dot_folder_is_refused(backend: HfBackend) -> None:
    storage = backend.storage()
    for ref in ("local-0123456789abcdef01234567", "alice/68780d00bbe36d38803f00ff:..", "../x"):
        with pytest.raises(StorageRefused):
            await storage.delete(ref, keep_artifact=False)


async def test_the_worker_schedules_the_retention_sweep_for_the_hf_backend(
    tmp_path: Path, hub: FakeHub, backend: HfBackend
) -> None:
    (old,) = await finished_jobs(hub, backend, OLD, 1)
    settings = Settings(state_dir=tmp_path / "state", backend="fake")
    audit_dir = settings.state_dir / "audit"
    # The dev server's clock is the real one: this episode ended 20 days before it.
    record(audit_dir, OLD, datetime.now(UTC) - 20 * DAY, {"j": ("agent", old)}, backend="hf")
    env = await dev_server()
    try:
        client = env.client
        queue = f"tq-{uuid.uuid4().hex[:8]}"
        key = ServerKey.load_or_create(settings.server_key_path)
        worker = build_worker(
            client, settings, backend, key=key, task_queue=queue, tasks_dir=tmp_path
        )
        async with worker:
            schedule = client.get_schedule_handle(retention_schedule_id(client.namespace, queue))
            described = await once_it_answers(schedule.describe)
            assert described.schedule.spec.intervals[0].every == timedelta(hours=1)
            await schedule.trigger()
            report = await first_run(client, schedule, RetentionReport)
            await schedule.delete()
        assert [d.ref for d in report.deleted] == [old] and under(hub, old) == []
    finally:
        await env.shutdown()
