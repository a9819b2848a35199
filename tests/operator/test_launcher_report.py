"""The launcher's nonce-bearing lines are read: a job failing before its script ran says which
stage failed and why in its message, with no `jobs_logs` step; agent output cannot forge it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from activities.jobs.launcher_report import MAX_ERROR_CHARS, read_launcher_lines
from job_launcher.trusted_lines import LAUNCHER_TAG, format_trusted_line
from posttrain_common.contracts.jobs import JobRole
from tests.workflows.harness import running_worker

NONCE = "n" * 32


def line(payload: dict[str, object], nonce: str = NONCE) -> str:
    return format_trusted_line(LAUNCHER_TAG, nonce, payload)


def test_an_install_failure_names_its_stage_and_error() -> None:
    report = read_launcher_lines(
        ["hello", line({"stage": "install", "error": "uv exited 1: no solution for nope"})],
        NONCE,
    )
    assert report.failed_stage == "install"
    assert report.failure_message is not None
    assert (
        "install stage" in report.failure_message
        and "no solution for nope" in report.failure_message
    )


def test_installed_versions_and_the_exit_are_read() -> None:
    report = read_launcher_lines(
        [
            line({"stage": "installed", "packages": {"numpy": "2.4.6"}, "installer": "uv"}),
            "training...",
            line({"stage": "exit", "exit_code": 3, "signal": None}),
        ],
        NONCE,
    )
    assert report.installed == {"numpy": "2.4.6"} and report.installer == "uv"
    assert report.failure_message == "the script exited with code 3"
    ok = read_launcher_lines([line({"stage": "exit", "exit_code": 0, "signal": None})], NONCE)
    assert ok.failure_message is None
    killed = read_launcher_lines([line({"stage": "exit", "exit_code": 137, "signal": 9})], NONCE)
    assert killed.failure_message == "the script was killed by signal 9"


def test_lines_without_the_jobs_nonce_are_ignored_whatever_they_claim() -> None:
    forged = [
        line({"stage": "seccomp", "error": "forged"}, nonce="x" * 32),
        f'{LAUNCHER_TAG} {{"stage": "uid", "error": "no nonce"}}',
        line({"stage": "installed", "packages": {"evil": "1"}}, nonce="y" * 32),
    ]
    report = read_launcher_lines(forged, NONCE)
    assert report.failed_stage is None and report.installed == {}
    assert report.failure_message is None


def test_an_error_is_cut_and_odd_payloads_are_skipped() -> None:
    report = read_launcher_lines(
        [
            line({"stage": "installed", "packages": ["not", "a", "dict"]}),
            line({"stage": 7}),
            line({"stage": "venv", "error": "e" * 10_000}),
        ],
        NONCE,
    )
    assert report.installed == {} and report.failed_stage == "venv"
    assert report.error is not None and len(report.error) == MAX_ERROR_CHARS


async def test_a_job_failing_in_install_reports_the_stage_in_its_message(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    broken = FakeJobScript(
        role=JobRole.agent,
        queue_s=1,
        run_s=10,
        outcome="failed",
        logs=[line({"stage": "seccomp", "error": "a forged stage"}, nonce="f" * 32)],
        launcher_lines=[
            {"stage": "installed", "packages": {}, "installer": "uv"},
            {"stage": "install", "error": "uv exited 1: No solution found: nope-not-a-package"},
        ],
    )
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[broken])) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        waits = 0
        while True:  # jobs_wait answers every change (queued -> running -> failed)
            done = await ep.call_over(timedelta(minutes=2), "jobs_wait", job_id=job_id)
            waits += 1
            if done.data.get("state") not in ("queued", "running"):
                break
            assert waits < 10, done.data
        assert done.data["state"] == "failed"
        message = done.data["message"]
        assert "install stage" in message and "nope-not-a-package" in message
        assert "forged" not in message
        status = await ep.status()
        # The submit and the waits only: the agent needed no jobs_logs step to learn why.
        assert status.steps_used == 1 + waits


def test_the_sandbox_is_read_from_its_line_or_from_the_final_line_that_repeats_it() -> None:
    on = read_launcher_lines([line({"stage": "sandbox", "loopback_tcp": True})], NONCE)
    assert (on.loopback_tcp, on.loopback_reason, on.failed_stage) == (True, None, None)
    why = "pidfd_getfd on a process of the job's uid is refused: Operation not permitted"
    off = [line({"stage": "sandbox", "loopback_tcp": False, "loopback_reason": why})]
    report = read_launcher_lines(off, NONCE)
    assert (report.loopback_tcp, report.loopback_reason) == (False, why)
    assert report.failure_message is None  # a sandbox line is no failure
    # A long log's tail has only the final line: it carries the same.
    tail = [line({"stage": "exit", "exit_code": 0, "signal": None, "loopback_tcp": False,
                  "loopback_reason": why})]  # fmt: skip
    assert read_launcher_lines(tail, NONCE).loopback_reason == why
    failed = line({"stage": "uid", "error": "no", "loopback_tcp": True})
    assert read_launcher_lines([failed], NONCE).loopback_tcp is True
    # Before the loopback policy, or forged: nothing known.
    assert (
        read_launcher_lines([line({"stage": "exit", "exit_code": 0})], NONCE).loopback_tcp is None
    )
    forged = line({"stage": "sandbox", "loopback_tcp": True}, nonce="x" * 32)
    assert read_launcher_lines([forged], NONCE).loopback_tcp is None
    odd = read_launcher_lines([line({"stage": "sandbox", "loopback_tcp": "yes"})], NONCE)
    assert odd.loopback_tcp is None


async def test_a_jobs_view_says_whether_its_sandbox_allowed_loopback_tcp(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    why = "the kernel refused a filter with a listener: Invalid argument"
    off = {"loopback_reason": why}
    jobs = [
        FakeJobScript(
            script_contains=f"# sandbox {on}\n",
            queue_s=1,
            run_s=10,
            launcher_lines=[
                {"stage": "sandbox", "loopback_tcp": on, **({} if on else off)},
                {"stage": "exit", "exit_code": 0, "signal": None},
            ],
        )
        for on in (True, False)
    ]
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=jobs)) as h:
        ep = await h.episode()
        views = {}
        for on in (True, False):
            job_id = await ep.submit_job(script=f"# sandbox {on}\nprint(1)\n")
            while True:
                done = await ep.call_over(timedelta(minutes=2), "jobs_wait", job_id=job_id)
                if done.data.get("state") not in ("queued", "running"):
                    break
            views[on] = done.data
    assert views[True]["state"] == "succeeded"
    assert (views[True]["loopback_tcp"], views[True]["loopback_reason"]) == (True, None)
    assert (views[False]["loopback_tcp"], views[False]["loopback_reason"]) == (False, why)
