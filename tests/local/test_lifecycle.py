"""A local job's life: start, cancel, timeout, restarts of the backend, evaluations, inputs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from activities.backends.local.backend import LocalBackend, job_ref
from activities.jobs.activities import JobsActivities
from job_launcher.trusted_lines import read_score
from posttrain_common.contracts.jobs import JobLogs
from posttrain_common.keys import ServerKey
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import MAX_LOG_ANSWER_BYTES, MAX_LOG_LINE_BYTES, json_size
from tasks.registry import TASKS_DIR
from tests.local.conftest import (
    JOB_PYTHON,
    SMALL,
    TEST_BWRAP,
    Jobs,
    NoWatch,
    job_uid,
    leftovers,
    now,
    submit_and_die,
    write_model,
)
from tests.processes import live_pids_of_uid
from tests.waiting import wait_until

SLEEPER = """
import time
print("started", flush=True)
time.sleep(600)
"""


def started(jobs: Jobs, ref: str) -> bool:
    return "started" in jobs.logs(ref)


def test_cancelling_a_running_job_is_confirmed_and_reports_its_running_time(jobs: Jobs) -> None:
    job = jobs.submit(SLEEPER)
    assert job.state.value == "running"
    uid = job_uid(jobs, job.ref)
    wait_until(lambda: started(jobs, job.ref), 20, "the job to start")
    time.sleep(0.5)  # not a wait: the job runs 0.5 s, and its running time is checked below
    t0 = time.monotonic()
    cancelled = asyncio.run(jobs.backend.cancel(job.ref, now()))
    cancel_s = time.monotonic() - t0
    assert cancelled.state.value == "cancelled"
    assert cancelled.finished_at is not None and cancelled.started_at is not None
    assert 0.5 <= cancelled.running_s < 30
    assert cancel_s < 2, f"confirmation took {cancel_s:.2f} s"
    assert live_pids_of_uid(uid) == []
    # Cancelling again (a retried activity) changes nothing.
    again = asyncio.run(jobs.backend.cancel(job.ref, now()))
    assert again.state.value == "cancelled" and again.running_s == cancelled.running_s


def test_a_job_past_its_timeout_is_stopped_and_reported_timed_out(jobs: Jobs) -> None:
    job = jobs.submit(SLEEPER, timeout_s=2)
    uid = job_uid(jobs, job.ref)
    ended = jobs.wait_end(job.ref, timeout=20)
    assert ended.state.value == "timed_out"
    assert 2 <= ended.running_s < 4
    assert "timed out after 2 s" in "\n".join(jobs.logs(job.ref))
    assert live_pids_of_uid(uid) == []


def test_a_failing_script_is_failed_with_its_exit_status(jobs: Jobs) -> None:
    job = jobs.run("raise SystemExit(3)")
    assert job.state.value == "failed"
    assert job.message == "the job exited with status 3; see its log"


def test_a_restarted_backend_sees_a_running_job_and_a_retried_submit_starts_no_second_one(
    jobs: Jobs, state_dir: Path
) -> None:
    # The first submit happens in a process that then dies, as a worker killed mid-episode.
    request = jobs.request(
        """
        import os, time
        open(f"/data/outputs/run-{os.getpid()}", "w").close()
        print("started", flush=True)
        time.sleep(600)
        """,
        key="ep-x/job/1",
    )
    ref = submit_and_die(state_dir, request)
    assert ref == job_ref("ep-x/job/1")
    restarted = LocalBackend(state_dir, job_python=JOB_PYTHON, limits=SMALL, bwrap=TEST_BWRAP)
    wait_until(lambda: started(jobs, ref), 20, "the job to start")
    found = asyncio.run(restarted.find_by_key("ep-x/job/1", now()))
    assert found is not None and found.ref == ref and found.state.value == "running"
    resubmitted = asyncio.run(restarted.submit(request))
    assert resubmitted.ref == ref
    assert [p.name for p in restarted.jobs_dir.iterdir()] == [ref]
    assert jobs.logs(ref).count("started") == 1
    cancelled = asyncio.run(restarted.cancel(ref, now()))
    assert cancelled.state.value == "cancelled"
    outputs = list((restarted.jobs_dir / ref / "artifact").iterdir())
    assert len(outputs) == 1  # the script ran once


def test_a_job_whose_supervisor_was_killed_ends_failed_and_leaves_nothing_running(
    jobs: Jobs,
) -> None:
    job = jobs.submit(SLEEPER)
    uid = job_uid(jobs, job.ref)
    wait_until(lambda: started(jobs, job.ref), 20, "the job to start")
    supervisor = json.loads((jobs.folder(job.ref) / "supervisor.json").read_text())
    os.kill(supervisor["pid"], 9)
    ended = wait_until(
        lambda: v if (v := jobs.view(job.ref)).state.terminal else None, 20, "the job to end"
    )
    assert ended.state.value == "failed"
    assert ended.message == "the job's supervisor stopped"
    wait_until(lambda: live_pids_of_uid(uid) == [], 5, "the job's processes to be gone")
    # Its groups and folders are released by whoever recorded the end; its filesystems lived
    # only in the dead supervisor's mount namespace and went with it.
    wait_until(lambda: leftovers(jobs, job.ref) == [], 10, "the job's leftovers to be gone")


EVALUATOR = """
import json, os
nonce = os.environ["POSTTRAIN_NONCE"]
try:
    open("/model/new", "w")
    model_write = "written"
except OSError as exc:
    model_write = exc.errno
details = {
    "uid": os.getuid(),
    "model": sorted(os.listdir("/model")),
    "weights": open("/model/model.safetensors").read(),
    "base": sorted(os.listdir("/base_model")),
    "model_write": model_write,
    "seed": os.environ.get("POSTTRAIN_HIDDEN_SPLIT_SEED"),
    "env": sorted(os.environ),
}
print("POSTTRAIN_SCORE " + nonce + " " + json.dumps({"score": 0.75, "details": details}))
"""


def test_an_evaluation_reads_the_artifact_read_only_and_gets_its_secret_only_when_graded(
    jobs: Jobs,
) -> None:
    agent = jobs.run("open('/data/outputs/model.safetensors', 'w').write('trained')")
    assert agent.state.value == "succeeded"
    seen = {}
    for role, secrets in (("dev", {}), ("grader", {"POSTTRAIN_HIDDEN_SPLIT_SEED": "s3cret"})):
        job = jobs.run(EVALUATOR, role=role, artifact_ref=agent.ref, secrets=secrets)
        assert job.state.value == "succeeded", jobs.logs(job.ref)
        reading = read_score(jobs.logs(job.ref, 10_000), jobs.nonces[job.ref])
        assert reading.valid, reading.reason
        assert reading.score == 0.75
        seen[role] = reading.details["details"]
        assert seen[role]["uid"] == job_uid(jobs, job.ref) != job_uid(jobs, agent.ref)
    for details in seen.values():
        assert details["model"] == ["model.safetensors"]
        assert details["weights"] == "trained"
        assert details["base"] == ["config.json", "model.safetensors"]
        assert details["model_write"] == 30  # EROFS
    assert seen["dev"]["seed"] is None
    assert seen["grader"]["seed"] == "s3cret"
    assert "POSTTRAIN_HIDDEN_SPLIT_SEED" not in seen["dev"]["env"]
    # The agent's job never had the secret or the evaluator's nonce anywhere on disk.
    for ref in list(jobs.nonces):
        job_json = (jobs.folder(ref) / "job.json").read_text()
        assert "s3cret" not in job_json and jobs.nonces[ref] not in job_json


def test_an_evaluation_of_a_job_without_an_artifact_is_not_ready(jobs: Jobs) -> None:
    running = jobs.submit(SLEEPER)
    with pytest.raises(ToolError) as err:
        jobs.submit(EVALUATOR, role="dev", artifact_ref=running.ref)
    assert err.value.type is ErrorType.not_ready
    asyncio.run(jobs.backend.cancel(running.ref, now()))


def jobs_with_a_probe_wheel(state_dir: Path, tmp_path: Path) -> Jobs:
    """A backend whose only package index is a folder with the wheel of `pt-probe` 1.0."""
    from tests.launcher.conftest import make_wheel
    from tests.local.conftest import write_model

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "pt-probe", "1.0", "VALUE = 'probe-1.0'\n")
    backend = LocalBackend(
        state_dir,
        job_python=JOB_PYTHON,
        limits=SMALL,
        find_links=[str(wheels)],
        no_index=True,
        bwrap=TEST_BWRAP,
    )
    return Jobs(backend, write_model(tmp_path / "model"))


def test_an_evaluators_declared_dependencies_are_installed_from_wheels_first(
    state_dir: Path, tmp_path: Path
) -> None:
    jobs = jobs_with_a_probe_wheel(state_dir, tmp_path)
    agent = jobs.run("print('ok')")
    script = (
        "# /// script\n# dependencies = ['pt-probe==1.0']\n# ///\n"
        "import os, pt_probe, sys\n"
        "print('POSTTRAIN_SCORE', os.environ['POSTTRAIN_NONCE'],"
        ' \'{"score": 1.0, "probe": "\' + pt_probe.VALUE + \'", "py": "\' + sys.prefix + \'"}\')\n'
    )
    job = jobs.run(script, role="dev", artifact_ref=agent.ref)
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    reading = read_score(jobs.logs(job.ref), jobs.nonces[job.ref])
    assert reading.valid and reading.details["probe"] == "probe-1.0"
    assert reading.details["py"] == "/env/venv"


def test_an_agent_jobs_packages_come_from_wheels_in_the_install_phase(
    state_dir: Path, tmp_path: Path
) -> None:
    jobs = jobs_with_a_probe_wheel(state_dir, tmp_path)
    job = jobs.run(
        "import pt_probe\nprint('REPORT', '{\"v\": \"' + pt_probe.VALUE + '\"}')\n",
        dependencies=["pt-probe==1.0"],
    )
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    assert jobs.report(job.ref) == {"v": "probe-1.0"}
    assert not any("hardlink" in line for line in jobs.logs(job.ref))
    missing = jobs.run("print('never')", dependencies=["pt-absent==1.0"])
    assert missing.state.value == "failed"
    assert missing.message.startswith("installing the job's packages failed")
    assert "never" not in jobs.logs(missing.ref)


def test_datasets_resolve_against_the_hub_and_the_denylist(jobs: Jobs, tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    revision = jobs.backend.hub.add_dataset("org/data", folder)
    backend = jobs.backend
    assert asyncio.run(backend.resolve_dataset("org/data", [])) == revision
    for repo_id, denylist, words in (
        ("org/data", ["ORG/data"], "denylist"),
        ("org/missing", [], "has no dataset"),
        ("../etc", [], "not a repo id"),
    ):
        with pytest.raises(ToolError) as err:
            asyncio.run(backend.resolve_dataset(repo_id, denylist))
        assert err.value.type is ErrorType.dataset_not_allowed
        assert words in err.value.message


def test_models_resolve_main_to_the_latest_import_and_pinned_revisions_stay(
    jobs: Jobs, tmp_path: Path
) -> None:
    backend = jobs.backend
    first = jobs.model.revision
    folder = tmp_path / "v2"
    folder.mkdir()
    (folder / "config.json").write_text('{"v": 2}')
    second = backend.hub.add_model("test/base", folder)
    assert second != first
    assert asyncio.run(backend.resolve_model("test/base", "main")) == second
    assert asyncio.run(backend.resolve_model("test/base", first)) == first
    with pytest.raises(ToolError) as err:
        asyncio.run(backend.resolve_model("test/absent", "main"))
    assert "hub add-model" in err.value.message


def test_the_generated_tiny_model_is_imported_on_first_use(jobs: Jobs, tmp_path: Path) -> None:
    revision = asyncio.run(jobs.backend.resolve_model("tiny-causal-lm", "main"))
    folder = jobs.backend.hub.path("models", "tiny-causal-lm", revision)
    names = {p.name for p in folder.iterdir()}
    assert "config.json" in names and any(n.endswith(".safetensors") for n in names)
    # Generated deterministically: a backend on a fresh state dir gets the same revision.
    other = LocalBackend(tmp_path / "other", job_python=JOB_PYTHON)
    assert asyncio.run(other.resolve_model("tiny-causal-lm", "main")) == revision


def test_logs_of_an_unknown_job_are_an_error(jobs: Jobs) -> None:
    with pytest.raises(ToolError):
        asyncio.run(jobs.backend.logs("local-" + "0" * 24, 10, now()))
    assert asyncio.run(jobs.backend.observe(["local-" + "0" * 24, "../x"], now())) == {}


def test_a_loud_jobs_logs_are_answered_within_the_log_limits(
    state_dir: Path, tmp_path: Path
) -> None:
    """One 5 MB line, then 2,000 lines of 4 KB: `jobs_logs` (the activity, which cuts before
    anything crosses Temporal) answers the newest lines within its limits and says what it cut."""
    roomy = dataclasses.replace(SMALL, file_bytes=32 << 20, disk_cap_bytes=64 << 20)
    backend = LocalBackend(state_dir, job_python=JOB_PYTHON, limits=roomy, bwrap=TEST_BWRAP)
    jobs = Jobs(backend, write_model(tmp_path / "model-src"))
    loud = (
        "import sys\n"
        "sys.stdout.write('L' * 5_000_000 + '\\n')\n"
        "for i in range(2000):\n"
        "    sys.stdout.write(f'{i:04d} ' + 'y' * 4000 + '\\n')\n"
    )
    job = jobs.run(loud, timeout=60)
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    activities = JobsActivities(jobs.backend, ServerKey(b"k" * 32), NoWatch(), TASKS_DIR)
    answer = asyncio.run(
        activities.job_logs(JobLogs(ref=job.ref, key="test/job", tail=2000, now=now()))
    )
    assert len(json.dumps(answer.lines, ensure_ascii=False).encode()) <= MAX_LOG_ANSWER_BYTES
    assert all(json_size(line) <= MAX_LOG_LINE_BYTES for line in answer.lines)
    # The newest lines are kept (the launcher's and the backend's own lines follow the job's).
    printed = [line for line in answer.lines if line[:4].isdigit()]
    assert printed[-1].startswith("1999 ")
    assert answer.dropped_lines == 2000 - len(answer.lines) > 0
