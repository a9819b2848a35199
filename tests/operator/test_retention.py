"""Retention: the job folders of episodes that ended longer ago than POSTTRAIN_JOB_RETENTION_DAYS
are deleted, submitted artifacts kept until POSTTRAIN_SUBMITTED_RETENTION_DAYS; nothing of a
running or ending episode, nothing outside the job root, no link followed. Local job folders
are laid out with real files; the sweep runs as RetentionWorkflow on the time-skipping server
(the Schedule itself is tested on the dev server in tests/hf/test_retention.py)."""

from __future__ import annotations

import sys
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.backends.local.storage import LocalJobStorage
from activities.backends.local.store import JobStore, job_ref
from activities.backends.storage import StorageRefused
from activities.records.retention import RetentionActivities
from activities.records.retention_plan import due, entry_of, submitted_job_ids
from posttrain_common.contracts.retention import RetentionPolicy, SweepRetention
from posttrain_common.settings import Settings
from posttrain_server.wiring import TemporalEpisodeLiveness
from tests.hf.stand_in import StandInEpisode
from tests.operator.retention_files import job_folder, record, sidecar, tree
from workflows.ids import episode_workflow_id
from workflows.operations.retention import RetentionInput, RetentionWorkflow

OLD, RECENT, ENDING, RUNNING, OTHER = (f"ep-{c * 16}" for c in "abcde")
DAY = timedelta(days=1)
POLICY = RetentionPolicy(job_after=14 * DAY, submitted_after=90 * DAY)


class World:
    """Folders and records of five episodes, `now` being the test server's time:
    OLD ended 20 days ago (agent job A submitted, agent B with a link to outside, grader G,
    agent C whose job still runs, and a ref L whose folder is a link to outside); RECENT ended 2
    days ago; ENDING ended 20 days ago by its record but its workflow still runs; RUNNING has
    no record yet; OTHER's record is another backend's."""

    def __init__(self, tmp_path: Path, now: datetime) -> None:
        self.jobs_dir = tmp_path / "state" / "local" / "jobs"
        self.audit_dir = tmp_path / "state" / "audit"
        self.outside = tmp_path / "outside"
        self.outside.mkdir()
        (self.outside / "precious.txt").write_text("not the sweep's")
        self.store = JobStore(self.jobs_dir, sys.executable)
        jobs = self.jobs_dir
        self.a = job_folder(jobs, f"episode-{OLD}/job/1", artifact=4096)
        self.b = job_folder(jobs, f"episode-{OLD}/job/2", artifact=2048)
        self.g = job_folder(jobs, f"episode-{OLD}/job/3")
        self.c = job_folder(jobs, f"episode-{OLD}/job/4", ended=False)
        (self.b / "escape").symlink_to(self.outside, target_is_directory=True)
        (self.a / "artifact" / "escape").symlink_to(self.outside, target_is_directory=True)
        self.link = jobs / job_ref(f"episode-{OLD}/job/5")
        self.link.symlink_to(self.outside, target_is_directory=True)
        record(
            self.audit_dir,
            OLD,
            now - 20 * DAY,
            {
                "job-a": ("agent", self.a.name),
                "job-b": ("agent", self.b.name),
                "job-g": ("grader", self.g.name),
                "job-c": ("agent", self.c.name),
                "job-l": ("agent", self.link.name),
            },
            submitted="job-a",
        )
        self.r = job_folder(jobs, f"episode-{RECENT}/job/1")
        record(self.audit_dir, RECENT, now - 2 * DAY, {"job-r": ("agent", self.r.name)})
        self.e = job_folder(jobs, f"episode-{ENDING}/job/1")
        record(self.audit_dir, ENDING, now - 20 * DAY, {"job-e": ("agent", self.e.name)})
        self.x = job_folder(jobs, f"episode-{RUNNING}/job/1", ended=False)
        self.o = job_folder(jobs, f"episode-{OTHER}/job/1")
        record(
            self.audit_dir, OTHER, now - 20 * DAY, {"job-o": ("agent", self.o.name)}, backend="hf"
        )

    def activities(
        self, env: WorkflowEnvironment, policy: RetentionPolicy = POLICY
    ) -> RetentionActivities:
        return RetentionActivities(
            LocalJobStorage(self.store),
            TemporalEpisodeLiveness(env.client),
            self.audit_dir,
            policy,
        )

    def outside_intact(self) -> bool:
        return (self.outside / "precious.txt").read_text() == "not the sweep's"


async def test_retention_deletes_old_job_folders_and_keeps_submitted_artifacts(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    env, client = time_skipping_env, time_skipping_env.client
    world = World(tmp_path, await env.get_current_time())
    queue = f"tq-{uuid.uuid4().hex[:8]}"
    retention = world.activities(env)
    async with Worker(
        client,
        task_queue=queue,
        workflows=[RetentionWorkflow, StandInEpisode],
        activities=[retention.sweep_retention],
    ):
        ending = await client.start_workflow(
            StandInEpisode.run, False, id=episode_workflow_id(ENDING), task_queue=queue
        )
        # Without time skipping while the stand-in episode runs: a skip would run it into the
        # end of time (it waits on nothing but the signal).
        with env.auto_time_skipping_disabled():
            first = await client.execute_workflow(
                RetentionWorkflow.run, RetentionInput(), id=f"ret-1-{queue}", task_queue=queue
            )
            await ending.signal(StandInEpisode.finish)
            await ending.result()

        # OLD's unsubmitted folders are gone; the submitted job keeps its artifact only.
        assert not world.b.exists() and not world.g.exists()
        assert tree(world.a) == ["artifact", "artifact/escape", "artifact/model.safetensors"]
        assert world.outside_intact() and world.link.is_symlink()
        deleted = {d.job_id: d for d in first.deleted}
        assert set(deleted) == {"job-a", "job-b", "job-g"}
        assert deleted["job-a"].artifact_kept and not deleted["job-b"].artifact_kept
        assert deleted["job-b"].bytes >= 2048 + 300
        assert first.bytes_deleted == sum(d.bytes for d in first.deleted)
        # A job still running, an ending episode, a recent one, one not ended: all kept.
        assert world.c.exists() and "has not ended" in first.failed[world.c.name]
        assert "link" in first.refused[world.link.name]
        assert first.running == [ENDING] and world.e.exists()
        assert world.r.exists() and world.x.exists() and world.o.exists()
        assert first.done and not first.more
        entry = sidecar(world.audit_dir, OLD)
        folders = {f["job_id"]: f for f in entry["folders"]}
        assert folders["job-a"]["submitted"] and folders["job-a"]["rest_deleted_at"]
        assert folders["job-a"]["deleted_at"] is None
        assert folders["job-b"]["deleted_at"] and folders["job-b"]["bytes_deleted"] >= 2048
        assert folders["job-l"]["refused"] and folders["job-c"]["deleted_at"] is None

        await env.sleep(75 * DAY)  # OLD ended 95 days ago: past the submitted artifact's time
        second = await client.execute_workflow(
            RetentionWorkflow.run, RetentionInput(), id=f"ret-2-{queue}", task_queue=queue
        )
        assert {d.job_id for d in second.deleted} == {"job-a", "job-e", "job-r"}
        assert not world.a.exists() and not world.e.exists() and not world.r.exists()
        assert world.outside_intact() and world.link.is_symlink()
        assert world.c.exists() and world.x.exists() and world.o.exists()
        assert not second.refused  # refused for good: not tried again
        assert sidecar(world.audit_dir, OLD)["folders"][0]["deleted_at"]

        third = await client.execute_workflow(
            RetentionWorkflow.run, RetentionInput(), id=f"ret-3-{queue}", task_queue=queue
        )
        assert third.deleted == [] and list(third.failed) == [world.c.name]


async def test_a_sweep_acts_on_at_most_its_cap_and_the_next_one_goes_on(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    now = await time_skipping_env.get_current_time()
    jobs_dir, audit_dir = tmp_path / "jobs", tmp_path / "audit"
    folders = []
    for n in range(3):
        episode = f"ep-{n:016x}"
        folder = job_folder(jobs_dir, f"episode-{episode}/job/1")
        record(audit_dir, episode, now - 15 * DAY, {"job-1": ("agent", folder.name)})
        folders.append(folder)
    retention = RetentionActivities(
        LocalJobStorage(JobStore(jobs_dir, sys.executable)),
        TemporalEpisodeLiveness(time_skipping_env.client),
        audit_dir,
        POLICY.model_copy(update={"max_folders": 2}),
    )
    dry = await retention.sweep_retention(SweepRetention(now=now, dry_run=True))
    assert len(dry.deleted) == 2 and dry.more
    assert all(f.exists() for f in folders) and not (audit_dir / "retention").exists()

    first = await retention.sweep_retention(SweepRetention(now=now))
    assert len(first.deleted) == 2 and first.more
    assert [f.exists() for f in folders] == [False, False, True]
    second = await retention.sweep_retention(SweepRetention(now=now))
    assert len(second.deleted) == 1 and not second.more and not folders[2].exists()
    again = await retention.sweep_retention(SweepRetention(now=now))
    assert again.deleted == [] and again.examined == 0  # finished episodes are skipped


async def test_keeping_forever_deletes_nothing(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    world = World(tmp_path, await time_skipping_env.get_current_time())
    forever = RetentionPolicy(job_after=None, submitted_after=None)
    report = await world.activities(time_skipping_env, forever).sweep_retention(
        SweepRetention(now=await time_skipping_env.get_current_time() + 3650 * DAY)
    )
    assert report.deleted == [] and report.done
    assert world.a.exists() and world.b.exists() and world.g.exists()


async def test_folders_of_episodes_without_a_record_are_deleted_by_their_own_metadata(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Episodes that left no audit record: their local job folders are found by the episode
    their `job.json` names. An evaluation's folder goes once its job ended longer ago than the
    job retention, an agent's only after the submitted retention (it may hold the submitted
    artifact); never while the episode's workflow is open, nor a recent one, a folder naming no
    episode, a link, or a folder whose metadata is a link. A record that turns up later takes
    over, keeping what was deleted."""
    env, client = time_skipping_env, time_skipping_env.client
    now = await env.get_current_time()
    jobs_dir, audit_dir = tmp_path / "jobs", tmp_path / "audit"
    outside = tmp_path / "outside"
    outside.mkdir()
    gone, open_, recent, recorded = (f"ep-{c * 16}" for c in "1234")
    agent = job_folder(jobs_dir, f"episode-{gone}/job/1", ended_days_ago=20)
    grader = job_folder(jobs_dir, f"episode-{gone}/job/2", role="grader", ended_days_ago=20)
    running = job_folder(jobs_dir, f"episode-{open_}/job/1", role="grader", ended_days_ago=20)
    fresh = job_folder(jobs_dir, f"episode-{recent}/job/1", role="grader", ended_days_ago=2)
    nameless = job_folder(jobs_dir, "not-an-episode/1", role="grader", ended_days_ago=200)
    kept = job_folder(jobs_dir, f"episode-{recorded}/job/1", role="grader", ended_days_ago=20)
    record(audit_dir, recorded, now - 2 * DAY, {"job-1": ("grader", kept.name)})
    # A link named like a job folder, to a folder whose metadata names an old episode.
    decoy = job_folder(outside, f"episode-{gone}/job/9", role="grader", ended_days_ago=200)
    link = jobs_dir / job_ref("episode-ep-5555555555555555/job/1")
    link.symlink_to(decoy, target_is_directory=True)
    # A folder whose job.json is a link to such metadata.
    linked_meta = jobs_dir / job_ref("elsewhere/1")
    linked_meta.mkdir()
    (linked_meta / "job.json").symlink_to(decoy / "job.json")
    (linked_meta / "result.json").symlink_to(decoy / "result.json")

    retention = RetentionActivities(
        LocalJobStorage(JobStore(jobs_dir, sys.executable)),
        TemporalEpisodeLiveness(client),
        audit_dir,
        POLICY,
    )
    queue = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[StandInEpisode]):
        episode = await client.start_workflow(
            StandInEpisode.run, False, id=episode_workflow_id(open_), task_queue=queue
        )
        with env.auto_time_skipping_disabled():
            first = await retention.sweep_retention(SweepRetention(now=now))
            await episode.signal(StandInEpisode.finish)
            await episode.result()

    assert [(d.episode_id, d.job_id, d.unrecorded) for d in first.deleted] == [
        (gone, "job-2", True)
    ]
    assert not grader.exists() and agent.exists()  # the agent's waits for 90 days
    assert first.running == [open_] and running.exists()
    assert fresh.exists() and nameless.exists() and kept.exists()
    assert link.is_symlink() and decoy.exists() and linked_meta.exists()
    entry = sidecar(audit_dir, gone)
    assert entry["unrecorded"] and [f["ref"] for f in entry["folders"]] == [grader.name]
    assert entry["folders"][0]["deleted_at"] and entry["folders"][0]["bytes_deleted"] >= 1300

    # 75 days on: the agent's folder is past the submitted retention, the others past theirs
    # (the recorded episode's by its record).
    later = await retention.sweep_retention(SweepRetention(now=now + 75 * DAY))
    assert {(d.episode_id, d.unrecorded) for d in later.deleted} == {
        (gone, True),
        (open_, True),
        (recent, True),
        (recorded, False),
    }
    assert not agent.exists() and not running.exists() and not fresh.exists()
    assert nameless.exists() and decoy.exists() and link.is_symlink() and linked_meta.exists()
    assert {f["ref"] for f in sidecar(audit_dir, gone)["folders"]} == {grader.name, agent.name}

    # The record turns up: it decides from now on, and what was deleted stays deleted.
    record(
        audit_dir,
        gone,
        now - 20 * DAY,
        {"job-1": ("agent", agent.name), "job-2": ("grader", grader.name)},
    )
    after = await retention.sweep_retention(SweepRetention(now=now + 76 * DAY))
    assert after.deleted == []
    entry = sidecar(audit_dir, gone)
    assert not entry["unrecorded"] and all(f["deleted_at"] for f in entry["folders"])


# -- the local storage's guards ------------------------------------------------------------------


async def test_the_local_storage_refuses_what_is_not_a_job_folder_and_follows_no_link(
    tmp_path: Path,
) -> None:
    jobs_dir, outside = tmp_path / "jobs", tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("x" * 10)
    storage = LocalJobStorage(JobStore(jobs_dir, sys.executable))
    for ref in ("../outside", "local-../../x", "/etc", str(outside)):
        with pytest.raises(StorageRefused) as refused:
            await storage.delete(ref, keep_artifact=False)
        assert refused.value.lasting
    linked = jobs_dir / job_ref("k/1")
    linked.symlink_to(outside, target_is_directory=True)
    with pytest.raises(StorageRefused, match="link"):
        await storage.delete(linked.name, keep_artifact=False)
    assert await storage.artifact_bytes(linked.name) is None
    assert (outside / "f").exists() and linked.is_symlink()

    folder = job_folder(jobs_dir, "k/2", artifact=777)
    (folder / "artifact" / "out").symlink_to(outside, target_is_directory=True)
    assert await storage.artifact_bytes(folder.name) == 777  # the link is not counted
    assert await storage.delete(folder.name, keep_artifact=False) >= 777
    assert not folder.exists() and (outside / "f").exists()
    assert await storage.delete(folder.name, keep_artifact=False) == 0  # idempotent


# -- the decision ---------------------------------------------------------------------------------


def test_what_is_due_follows_the_episode_end_and_each_setting(tmp_path: Path) -> None:
    ended = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
    rec = record(
        tmp_path,
        OLD,
        ended,
        {"a": ("agent", "r-a"), "b": ("agent", "r-b"), "g": ("grader", "r-g")},
        submitted="a",
    )
    assert submitted_job_ids(rec) == {"a"}
    entry = entry_of(rec)

    def plan(days: float, policy: RetentionPolicy = POLICY) -> set[tuple[str, bool]]:
        return {(d.folder.job_id, d.keep_artifact) for d in due(entry, ended + days * DAY, policy)}

    assert plan(13.9) == set()
    assert plan(14) == {("a", True), ("b", False), ("g", False)}
    assert plan(90) == {("a", False), ("b", False), ("g", False)}
    kept = RetentionPolicy(job_after=14 * DAY, submitted_after=None)
    assert plan(10_000, kept) == {("a", True), ("b", False), ("g", False)}
    entry.folders[0].rest_deleted_at = ended
    assert plan(10_000, kept) == {("b", False), ("g", False)}
    entry.ended_at = None
    assert plan(10_000) == set()  # no end time: never due


def test_a_refused_submit_submits_nothing(tmp_path: Path) -> None:
    rec = record(tmp_path, OLD, None, {"a": ("agent", "r-a")}, submitted="a")
    rec.calls[0].error_type = "episode_over"
    assert submitted_job_ids(rec) == set()


# -- settings -------------------------------------------------------------------------------------


def test_retention_settings_default_to_14_and_90_days_and_zero_or_empty_keeps_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("POSTTRAIN_JOB_RETENTION_DAYS", "POSTTRAIN_SUBMITTED_RETENTION_DAYS"):
        monkeypatch.delenv(name, raising=False)
    policy = Settings().retention_policy
    assert (policy.job_after, policy.submitted_after) == (14 * DAY, 90 * DAY)
    monkeypatch.setenv("POSTTRAIN_JOB_RETENTION_DAYS", "0.5")
    monkeypatch.setenv("POSTTRAIN_SUBMITTED_RETENTION_DAYS", "")
    policy = Settings().retention_policy
    assert (policy.job_after, policy.submitted_after) == (DAY / 2, None)
    monkeypatch.setenv("POSTTRAIN_JOB_RETENTION_DAYS", "0")
    assert not Settings().retention_policy.deletes_anything


@pytest.mark.parametrize(
    ("job", "submitted", "says"),
    [
        ("-1", "90", "job_retention_days"),
        ("two weeks", "90", "job_retention_days"),
        ("nan", "90", "finite"),
        ("14", "-3", "submitted_retention_days"),
        ("14", "7", "SUBMITTED_RETENTION_DAYS=7 is shorter"),
        ("0", "90", "is shorter"),  # job folders kept forever, submitted ones deleted: refused
        ("40000", "0", "job_retention_days"),
    ],
)
def test_bad_retention_settings_are_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, job: str, submitted: str, says: str
) -> None:
    monkeypatch.setenv("POSTTRAIN_JOB_RETENTION_DAYS", job)
    monkeypatch.setenv("POSTTRAIN_SUBMITTED_RETENTION_DAYS", submitted)
    with pytest.raises(ValidationError, match=says):
        Settings()
