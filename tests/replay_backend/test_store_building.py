"""Building a replay store from audit records (`posttrain-env replay-store build|list`), and
the replay backend's settings (`POSTTRAIN_REPLAY_*`)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from activities.backends.registry import backend_info
from activities.backends.replay.backend import ReplayBackend
from activities.backends.replay.from_audit import build_store
from activities.backends.replay.recording import JobInputs, sha256_text
from activities.backends.replay.store import ReplayStore
from posttrain_common.contracts.audit import (
    AuditEnd,
    AuditEvaluation,
    AuditJob,
    AuditRecord,
    AuditStateChange,
)
from posttrain_common.contracts.jobs import JobRole, RepoRef
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from tests.workflows.harness import write_task

T0 = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
SCRIPT = "print('fit')\n"


def job(job_id: str, role: str, state: str, **fields: object) -> AuditJob:
    values: dict[str, object] = {
        "job_id": job_id,
        "workflow_id": f"episode-e/job/{job_id}",
        "role": role,
        "flavor": "cpu-basic",
        "timeout_s": 600,
        "base_model": "test-org/tiny-model",
        "base_model_revision": "c" * 40,
        "state_changes": [
            AuditStateChange(state="queued", at=T0),
            AuditStateChange(state=state, at=T0 + timedelta(seconds=90), message=f"{state}!"),
        ],
        "started_at": T0 + timedelta(seconds=7),
        "finished_at": T0 + timedelta(seconds=90),
        "running_s": 83.0,
        "final_state": state,
        "backend_job_id": f"fake-{job_id}",
    }
    values.update(fields)
    return AuditJob.model_validate(values)


def episode_record(episode_id: str, **fields: Any) -> AuditRecord:
    """An episode of t_test on the tiny model, with `fields` (its jobs, evaluations, ...)."""
    return AuditRecord(
        episode_id=episode_id,
        task_id="t_test",
        base_model="test-org/tiny-model",
        base_model_revision="c" * 40,
        **fields,
    )


def record(episode_id: str, campaign_id: str | None = None) -> AuditRecord:
    digest = sha256_text(SCRIPT)
    return episode_record(
        episode_id,
        campaign_id=campaign_id,
        jobs=[
            job("job-1", "agent", "succeeded", script_sha256=digest, dependencies=["numpy"]),
            job("job-2", "agent", "cancelled", script_sha256=digest),
            job("eval-1", "dev", "succeeded", evaluated_job_id="job-1"),
            job("eval-2", "grader", "succeeded", evaluated_job_id="job-1"),
        ],
        evaluations=[
            AuditEvaluation(job_id="eval-1", role="dev", split="dev", valid=True, score=0.25),
            AuditEvaluation(
                job_id="eval-2",
                role="grader",
                split="hidden",
                valid=False,
                score=0.0,
                reason="the evaluator printed 2 score lines",
            ),
        ],
        scripts={digest: SCRIPT},
        end=AuditEnd(reason="submitted", reward=0.0),
    )


def write_records(audit: Path, *records: AuditRecord) -> None:
    audit.mkdir(parents=True, exist_ok=True)
    for rec in records:
        (audit / f"{rec.episode_id}.json").write_text(rec.model_dump_json())


def cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real `posttrain-env replay-store ...` process."""
    env = {**os.environ, "POSTTRAIN_STATE_DIR": str(state)}
    return subprocess.run(
        [sys.executable, "-m", "posttrain_server.cli", "replay-store", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_replay_build_records_a_deployments_ended_jobs_once_and_list_shows_them(
    tmp_path: Path,
) -> None:
    state, tasks, store = tmp_path / "state", tmp_path / "tasks", tmp_path / "store"
    write_task(tasks)
    write_records(state / "audit", record("ep-1", "camp-1"), record("ep-2"))
    args = ["--tasks-dir", str(tasks), "--store", str(store)]
    built = cli(state, "build", *args)
    assert built.returncode == 0, built.stderr
    # The same jobs in both episodes: one recording each (the first stays).
    assert "2 episodes: 3 recordings written, 3 already in" in built.stdout
    assert "skipped 2: agent job ended cancelled" in built.stdout
    # Each job not recorded is named, with why.
    assert "not recorded: ep-1/job-2 (agent): agent job ended cancelled" in built.stdout
    assert "not recorded: ep-2/job-2 (agent): agent job ended cancelled" in built.stdout
    again = cli(state, "build", *args, "--campaign", "camp-1")
    assert "1 episodes: 0 recordings written, 3 already in" in again.stdout
    listed = cli(state, "list", "--store", str(store))
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 3
    assert "agent  t_test  succeeded 83 s  audit:ep-1/job-1" in listed.stdout
    missing = cli(state, "build", "--audit-dir", str(tmp_path / "nowhere"), *args)
    assert missing.returncode == 1 and "no audit folder" in missing.stderr


def test_a_store_built_from_audit_records_answers_the_jobs_they_record(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    write_task(tasks)
    write_records(tmp_path / "audit", record("ep-1"))
    store = ReplayStore(tmp_path / "store")
    report = build_store(tmp_path / "audit", tasks, store)
    assert (report.recorded, report.skipped) == (3, {"agent job ended cancelled": 1})
    agent = JobInputs(
        role=JobRole.agent,
        task_id="t_test",
        script_sha256=sha256_text(SCRIPT),
        dependencies=["numpy"],
        flavor="cpu-basic",
        base_model=RepoRef(repo_id="test-org/tiny-model", revision="c" * 40),
    )
    recorded = store.get(agent.key())
    assert recorded is not None and recorded.script == SCRIPT
    assert (recorded.state, recorded.queue_s, recorded.running_s) == ("succeeded", 7, 83)
    assert recorded.message == "succeeded!" and recorded.log_synthesized
    evaluations = [store.get(k) for k in store.keys() if k != agent.key()]
    lines = {r.inputs.role: r.lines for r in evaluations if r is not None}
    assert lines[JobRole.dev][0].startswith("POSTTRAIN_SCORE <nonce> ")
    # An invalid score is replayed as a log without a score line (invalid, score 0).
    assert lines[JobRole.grader] == [
        "replayed evaluation: the recorded score was invalid: the evaluator printed 2 score lines"
    ]


def test_the_settings_choose_the_store_scale_inner_backend_and_fall_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSTTRAIN_REPLAY_STORE", str(tmp_path / "mine"))
    monkeypatch.setenv("POSTTRAIN_REPLAY_TIME_SCALE", "0.01")
    monkeypatch.setenv("POSTTRAIN_REPLAY_INNER", "fake")
    monkeypatch.setenv("POSTTRAIN_REPLAY_FALL_THROUGH", "true")
    settings = Settings(state_dir=tmp_path / "state", backend="replay")
    key = ServerKey.load_or_create(settings.server_key_path)
    backend = backend_info("replay").build(settings, key)
    assert isinstance(backend, ReplayBackend)
    assert backend.store.root == tmp_path / "mine" and backend.time_scale == 0.01
    assert backend.fall_through and backend.inner.name == "fake"
    assert backend.inner_look_s == 0.0  # the fake bills nothing: looked at at the replay's pace
    monkeypatch.setenv("POSTTRAIN_REPLAY_INNER", "docker")  # no such backend to stand on
    with pytest.raises(SystemExit, match="POSTTRAIN_REPLAY_"):
        backend_info("replay").build(settings, key)
    monkeypatch.setenv("POSTTRAIN_REPLAY_INNER", "fake")
    monkeypatch.setenv("POSTTRAIN_REPLAY_TIME_SCALE", "-0.5")
    with pytest.raises(SystemExit, match="time_scale"):
        backend_info("replay").build(settings, key)
    # 0: a replayed job ends the moment it starts (a trainer's rollouts wait for no job).
    monkeypatch.setenv("POSTTRAIN_REPLAY_TIME_SCALE", "0")
    instant = backend_info("replay").build(settings, key)
    assert isinstance(instant, ReplayBackend) and instant.time_scale == 0


def test_every_outcome_a_record_holds_is_recorded_or_named_with_why_not(tmp_path: Path) -> None:
    """A grader that timed out and one that failed (a grader fault: no score) are recorded as
    they ended, with no score line, so that they replay unscored as they were; a cancelled
    job, a job whose start was refused and an evaluation whose score was never read are not,
    and the build names each of them with why."""
    tasks = tmp_path / "tasks"
    write_task(tasks)
    digest = sha256_text(SCRIPT)
    other = "print('other')\n"
    timed_out = episode_record(
        "ep-timeout",
        jobs=[
            job("job-1", "agent", "succeeded", script_sha256=digest),
            job("eval-1", "grader", "timed_out", evaluated_job_id="job-1", running_s=600.0),
            job("job-2", "agent", "cancelled", script_sha256=digest),
            job("job-3", "agent", "failed", script_sha256=digest, backend_job_id=None),
        ],
        evaluations=[AuditEvaluation(job_id="eval-1", role="grader", split="hidden")],
        scripts={digest: SCRIPT},
        end=AuditEnd(reason="score_failed"),
    )
    other_digest = sha256_text(other)
    faulted = episode_record(
        "ep-fault",
        jobs=[
            job("job-1", "agent", "succeeded", script_sha256=other_digest, flavor="t4-small"),
            job("eval-1", "dev", "succeeded", evaluated_job_id="job-1"),
            job("eval-2", "grader", "failed", evaluated_job_id="job-1"),
        ],
        evaluations=[
            AuditEvaluation(job_id="eval-1", role="dev", split="dev"),  # its log unreadable
            AuditEvaluation(job_id="eval-2", role="grader", split="hidden"),
        ],
        scripts={other_digest: other},
        end=AuditEnd(reason="score_failed"),
    )
    write_records(tmp_path / "audit", timed_out, faulted)
    store = ReplayStore(tmp_path / "store")
    report = build_store(tmp_path / "audit", tasks, store)
    assert report.recorded == 4  # two agent jobs, the grader that timed out, the one that failed
    graders = [r for k in store.keys() if (r := store.get(k)) and r.inputs.role is JobRole.grader]
    assert sorted((r.state, r.running_s, r.lines) for r in graders) == [
        ("failed", 83.0, []),
        ("timed_out", 600.0, []),
    ]
    assert [(j.episode_id, j.job_id, j.role) for j in report.not_recorded] == [
        ("ep-fault", "eval-1", "dev"),
        ("ep-timeout", "job-2", "agent"),
        ("ep-timeout", "job-3", "agent"),
    ]
    whys = [j.why for j in report.not_recorded]
    assert whys[0] == "evaluation that succeeded but whose score was never read"
    assert whys[1] == "agent job ended cancelled"
    assert whys[2].startswith("agent job never ran (its start was refused")
