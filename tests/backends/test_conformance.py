"""What every jobs backend must do (activities/backends/interface.py `JobsBackend`), written once
and run over every registered backend (`activities.backends.registry.BACKENDS`) through its
harness (tests/backends/harnesses.py). A backend is registered only once it passes here."""

from __future__ import annotations

import math
import re
import sys

import pytest

from activities.backends.interface import JobRequest, TransientBackendError
from activities.backends.registry import BACKENDS
from job_launcher.trusted_lines import NONCE_ENV, read_score
from posttrain_common.contracts.episodes import JobLimits
from posttrain_common.contracts.jobs import BackendJob, JobRole, KeepOutputs
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import JobState
from tests.backends.harnesses import (
    ARTIFACT_BYTES,
    ARTIFACT_FILE,
    DATASET_FILES,
    DATASET_ID,
    HARNESSES,
    LINES,
    MISSING_DATASET_ID,
    Harness,
)
from workflows.episode.ledger import billed_minutes

COMMIT = re.compile(r"[0-9a-f]{40}")
# Valid from 3.12 on only: a `type` statement (PEP 695) and an f-string reusing its quotes.
PY312_ONLY = 'type Pair = tuple[int, int]\nprint(f"{"nested"}")\n'
# Valid from 3.11 on (the server's own version): an exception group handler (PEP 654).
PY311_ON = "try:\n    pass\nexcept* ValueError:\n    pass\n"


def version(python: str) -> tuple[int, int]:
    major, minor = python.split(".")
    return int(major), int(minor)


def test_every_registered_backend_has_a_harness_and_no_harness_is_unregistered() -> None:
    assert set(BACKENDS) == set(HARNESSES)


def assert_settled(job: BackendJob) -> None:
    """An ended job reports the running time it is billed for, consistent with its times."""
    assert job.state.terminal and job.finished_at is not None, job
    assert math.isfinite(job.running_s) and job.running_s >= 0, job
    if job.started_at is None:
        assert job.running_s == 0, job  # it never ran
        return
    ran = (job.finished_at - job.started_at).total_seconds()
    assert job.created_at <= job.started_at <= job.finished_at, job
    assert abs(job.running_s - ran) <= 1.0, (job.running_s, ran)
    billed_minutes(job.running_s)  # what the ledger settles: defined for every report


# -- submit and find_by_key --------------------------------------------------------------------


async def test_a_retried_submit_finds_the_job_of_its_key_and_starts_no_second_one(
    h: Harness,
) -> None:
    request = h.request("runs_long")
    assert await h.backend.find_by_key(request.key, h.now()) is None
    started = await h.backend.submit(request)
    assert started.key == request.key and not started.state.terminal
    # A retried submit looks first (as JobsActivities.submit_job does) and finds this job.
    again = request.model_copy(update={"now": h.now()})
    found = await h.backend.find_by_key(again.key, again.now)
    assert found is not None and found.ref == started.ref and found.key == request.key
    other = h.request("runs_long")
    assert (await h.backend.find_by_key(other.key, h.now())) is None
    await h.backend.cancel(started.ref, h.now())
    await h.wait_end(started.ref)


# -- a job's life: observe, settle ------------------------------------------------------------


async def test_a_job_that_succeeds_ends_succeeded_and_reports_its_running_time(
    h: Harness,
) -> None:
    job = await h.backend.submit(h.request("succeeds"))
    assert job.state in (JobState.queued, JobState.running), job
    ended = await h.wait_end(job.ref)
    assert ended.state is JobState.succeeded, (ended, await h.logs(job.ref))
    assert ended.ref == job.ref
    assert_settled(ended)
    assert ended.running_s > 0
    if h.succeeds_running_s is not None:  # simulated: exactly the time it was given to run
        assert ended.running_s == h.succeeds_running_s == 61
        assert billed_minutes(ended.running_s) == 2  # every started minute is billed
    # Its end stays as it was: a second look settles the same time.
    assert (await h.view(job.ref)).running_s == ended.running_s


async def test_a_job_that_fails_ends_failed_with_a_message(h: Harness) -> None:
    job = await h.backend.submit(h.request("fails"))
    ended = await h.wait_end(job.ref)
    assert ended.state is JobState.failed and ended.message, ended
    assert_settled(ended)


async def test_observe_reports_many_jobs_at_once_and_leaves_unknown_refs_out(
    h: Harness,
) -> None:
    first = await h.backend.submit(h.request("runs_long"))
    second = await h.backend.submit(h.request("runs_long"))
    refs = [first.ref, "no-such-job", h.unknown_ref(), second.ref]
    seen = await h.backend.observe(refs, h.now())
    assert set(seen) == {first.ref, second.ref}
    # (No assertion on the `key` observe reports: Hugging Face reports its hashed key label,
    # interface.py says so; the watcher knows its jobs by ref.)
    assert all(seen[job.ref].created_at == job.created_at for job in (first, second))
    assert await h.backend.observe([], h.now()) == {}
    running = await h.wait_running(first.ref)
    assert running.started_at is not None and running.finished_at is None
    for ref in (first.ref, second.ref):
        await h.backend.cancel(ref, h.now())
        await h.wait_end(ref)


# -- logs ----------------------------------------------------------------------------------------


async def test_logs_are_the_jobs_output_and_a_tail_is_its_last_lines(h: Harness) -> None:
    job = await h.backend.submit(h.request("succeeds"))
    await h.wait_end(job.ref)
    full = await h.logs(job.ref, 1000)
    printed = [line for line in full if line in LINES]
    assert printed == LINES, full
    assert await h.logs(job.ref, 2) == full[-2:]
    assert await h.logs(job.ref, 0) == []


# -- cancel ----------------------------------------------------------------------------------------


async def test_a_cancelled_job_ends_cancelled_and_reports_what_it_ran(h: Harness) -> None:
    job = await h.backend.submit(h.request("runs_long"))
    await h.wait_running(job.ref)
    await h.advance()
    answered = await h.backend.cancel(job.ref, h.now())
    assert answered.ref == job.ref
    ended = answered if answered.state.terminal else await h.wait_end(job.ref)
    assert ended.state is JobState.cancelled, ended
    assert_settled(ended)
    assert 0 < ended.running_s < 600  # it ran, and was stopped long before its own end


async def test_cancelling_a_job_that_ended_returns_its_end(h: Harness) -> None:
    job = await h.backend.submit(h.request("fails"))
    ended = await h.wait_end(job.ref)
    answered = await h.backend.cancel(job.ref, h.now())
    assert answered.state is JobState.failed and answered.running_s == ended.running_s


async def test_a_cancellation_not_confirmed_leaves_the_job_live_until_it_is(
    h: Harness,
) -> None:
    job = await h.backend.submit(h.request("runs_long"))
    await h.wait_running(job.ref)
    await h.stick_cancellations(job.ref)
    # The backend says so: it answers the job still live, or raises TransientBackendError so
    # that the cancel activity asks again (interface.py, `cancel`). Never a `cancelled` it
    # has not seen.
    try:
        answered = await h.backend.cancel(job.ref, h.now())
    except TransientBackendError:
        pass
    else:
        assert not answered.state.terminal, answered
    await h.advance()
    await h.release_cancellations(job.ref)
    # Asked again (as the job workflow does), the cancellation is confirmed.
    try:
        await h.backend.cancel(job.ref, h.now())
    except TransientBackendError:
        pass
    ended = await h.wait_end(job.ref)
    assert ended.state is JobState.cancelled, ended
    assert_settled(ended)


# -- faults ----------------------------------------------------------------------------------------


async def test_a_transient_failure_of_each_operation_is_a_transient_backend_error(
    h: Harness,
) -> None:
    if not h.transient_faults:
        assert "transient" in h.cannot, f"{h.name} injects no transient fault and says not why"
        assert "TransientBackendError" in h.cannot["transient"]
        return
    assert set(h.transient_faults) == {"submit", "observe", "cancel", "logs"}
    h.inject("submit", None)  # the next job requested
    request = h.request("runs_long")
    with pytest.raises(TransientBackendError):
        await h.backend.submit(request)
    # The retry looks first, and starts the job only if the failed call did not.
    job = await h.backend.find_by_key(request.key, h.now()) or await h.backend.submit(request)
    await h.wait_running(job.ref)
    h.inject("logs", job.ref)
    with pytest.raises(TransientBackendError):
        await h.logs(job.ref)
    await h.logs(job.ref)
    h.inject("observe", job.ref)
    with pytest.raises(TransientBackendError):
        await h.view(job.ref)
    assert not (await h.view(job.ref)).state.terminal
    h.inject("cancel", job.ref)
    with pytest.raises(TransientBackendError):
        await h.backend.cancel(job.ref, h.now())
    await h.backend.cancel(job.ref, h.now())
    assert (await h.wait_end(job.ref)).state is JobState.cancelled


# -- storage: what an agent job's artifact keeps (issue 41) -------------------------------------


async def measured(h: Harness, job: BackendJob, caps: KeepOutputs) -> BackendJob:
    """The ended job as the episode gets it: its view, or (a backend that measures outputs
    after the end) what keep_outputs answers, as the job's workflow asks it."""
    ended = await h.wait_end(job.ref)
    if ended.stored_bytes is not None:
        return ended
    return await h.backend.keep_outputs(caps.model_copy(update={"ref": job.ref, "now": h.now()}))


def caps_of(request: JobRequest) -> KeepOutputs:
    assert request.storage_allowance_bytes is not None
    return KeepOutputs(
        ref="",
        key=request.key,
        now=request.now,
        artifact_cap_bytes=request.artifact_cap_bytes or request.storage_allowance_bytes,
        storage_allowance_bytes=request.storage_allowance_bytes,
        storage_cap_bytes=request.storage_cap_bytes,
    )


async def test_an_ended_agent_job_says_what_its_artifact_keeps_against_the_episodes_storage(
    h: Harness,
) -> None:
    request = h.request(
        "writes_artifact",
        artifact_cap_bytes=1000 * ARTIFACT_BYTES,
        storage_allowance_bytes=10 * ARTIFACT_BYTES,
        storage_cap_bytes=100 * ARTIFACT_BYTES,
    )
    job = await measured(h, await h.backend.submit(request), caps_of(request))
    assert job.state is JobState.succeeded, job
    assert job.stored_bytes == ARTIFACT_BYTES and job.outputs_refused is None
    # Asked again (a retried activity), the answer is the same.
    caps = caps_of(request).model_copy(update={"ref": job.ref, "now": h.now()})
    again = await h.backend.keep_outputs(caps)
    assert again.stored_bytes == ARTIFACT_BYTES


async def test_outputs_over_what_the_episode_may_keep_are_refused_whole_and_typed(
    h: Harness,
) -> None:
    request = h.request(
        "writes_artifact",
        artifact_cap_bytes=1000 * ARTIFACT_BYTES,
        storage_allowance_bytes=ARTIFACT_BYTES - 1,
        storage_cap_bytes=100 * ARTIFACT_BYTES,
    )
    job = await measured(h, await h.backend.submit(request), caps_of(request))
    assert job.state is JobState.failed and job.stored_bytes == 0, job
    refused = job.outputs_refused
    assert refused is not None and refused.type is ErrorType.limit_reached
    assert (refused.cap, refused.cap_bytes, refused.over_by_bytes) == (
        "storage",
        100 * ARTIFACT_BYTES,
        1,
    )
    assert "nothing was kept" in job.message
    caps = caps_of(request).model_copy(update={"ref": job.ref, "now": h.now()})
    again = await h.backend.keep_outputs(caps)
    assert again.outputs_refused == refused and again.stored_bytes == 0  # idempotent
    if "artifact_bytes" not in h.cannot:
        assert await h.backend.storage().artifact_bytes(job.ref) in (0, None)


# -- the artifact and its evaluation --------------------------------------------------------------


async def test_an_evaluation_reads_the_agents_artifact_at_model_and_prints_its_score(
    h: Harness,
) -> None:
    agent = await h.backend.submit(h.request("writes_artifact"))
    ended = await h.wait_end(agent.ref)
    assert ended.state is JobState.succeeded, (ended, await h.logs(agent.ref))
    size = await h.backend.storage().artifact_bytes(agent.ref)
    if "artifact_bytes" in h.cannot:
        assert size is None, h.cannot["artifact_bytes"]
    else:
        assert size == ARTIFACT_BYTES
    scores = {}
    for role in (JobRole.dev, JobRole.grader):
        request = h.request("evaluates", role=role, artifact_ref=agent.ref)
        evaluation = await h.backend.submit(request)
        done = await h.wait_end(evaluation.ref)
        assert done.state is JobState.succeeded, (done, await h.logs(evaluation.ref))
        reading = read_score(await h.logs(evaluation.ref, 10_000), request.env[NONCE_ENV])
        assert reading.valid, (reading, await h.logs(evaluation.ref))
        scores[role] = reading.score
    # 1.0: the evaluator found exactly the agent's artifact mounted at /model.
    assert scores == {JobRole.dev: 1.0, JobRole.grader: 1.0}, h.cannot.get("real_evaluation")


async def test_every_role_runs_under_the_job_launcher(h: Harness) -> None:
    """Agent jobs, dev evaluations and graders alike (DESIGN §6 item 4): the launcher's
    supervisor ran the script with the loopback-only TCP policy on (local: its own nonce-bearing
    sandbox and exit lines), or the one file the job was started with is the launcher with the
    script embedded and the policy asked for, passing an evaluation its inputs by name (hf)."""
    agent = h.request("writes_artifact")
    agent_ref = (await h.backend.submit(agent)).ref
    await h.wait_end(agent_ref)
    for role in (JobRole.agent, JobRole.dev, JobRole.grader):
        request = agent if role is JobRole.agent else h.request("evaluates", role=role)
        if role is not JobRole.agent:
            request = request.model_copy(update={"artifact_ref": agent_ref})
            ref = (await h.backend.submit(request)).ref
            await h.wait_end(ref)
        else:
            ref = agent_ref
        seen = await h.launched(ref, request)
        if "launcher" in h.cannot:
            assert seen is None, h.cannot["launcher"]
        elif h.name == "local":
            expected = {"exit_code": 0, "failed_stage": None, "loopback_tcp": True}
            assert seen == expected, (role, await h.logs(ref))
        else:
            assert seen is not None and seen["script"] == request.script, role
            assert seen["command"].endswith("/launcher.py"), seen["command"]
            passed = [] if role is JobRole.agent else sorted({*request.env, *request.secrets})
            assert seen["pass_env"] == passed, role
            assert seen["loopback_tcp"] is True, role


async def test_an_agent_jobs_outputs_read_back_as_written_up_to_a_cap(h: Harness) -> None:
    """What the contamination check reads of a job (`read_outputs`): its files under
    /data/outputs/, cut at the cap it is given; a job the backend does not know is a ToolError
    (the check lists that source as not read), never another exception (retried forever)."""
    job = await h.backend.submit(h.request("writes_artifact"))
    ended = await h.wait_end(job.ref)
    assert ended.state is JobState.succeeded, (ended, await h.logs(job.ref))
    if "read_outputs" in h.cannot:
        with pytest.raises(ToolError) as refused:
            await h.backend.read_outputs(job.ref, 10_000)
        assert refused.value.type is ErrorType.not_recorded, h.cannot["read_outputs"]
    else:
        whole = await h.backend.read_outputs(job.ref, 10_000)
        assert whole.files == [(ARTIFACT_FILE, b"w" * ARTIFACT_BYTES)] and not whole.cut
        cut = await h.backend.read_outputs(job.ref, 1_000)
        assert cut.cut and [path for path, _ in cut.files] == [ARTIFACT_FILE]
        assert 0 < sum(len(data) for _, data in cut.files) <= 1_000
    with pytest.raises(ToolError):
        await h.backend.read_outputs(h.unknown_ref(), 1_000)


async def test_storage_names_its_backend_and_deletes_a_folder_once(h: Harness) -> None:
    storage = h.backend.storage()
    assert storage.name == h.backend.name
    job = await h.backend.submit(h.request("writes_artifact"))
    await h.wait_end(job.ref)
    kept = await storage.delete(job.ref, keep_artifact=True)
    assert kept >= 0
    if "artifact_bytes" in h.cannot:
        assert await storage.artifact_bytes(job.ref) is None, h.cannot["artifact_bytes"]
    else:
        assert await storage.artifact_bytes(job.ref) == ARTIFACT_BYTES  # kept
    assert await storage.delete(job.ref, keep_artifact=False) >= 0
    # Gone: None, or 0 where outputs that are not there cannot be told from empty ones (the
    # Hub has no empty folders).
    assert not await storage.artifact_bytes(job.ref)
    assert await storage.delete(job.ref, keep_artifact=False) == 0  # idempotent


# -- the script check: the job's Python, not the server's ---------------------------------------


@pytest.mark.parametrize(
    ("script", "since"),
    [(PY312_ONLY, "3.12"), (PY311_ON, "3.11")],
    ids=["type-statement-3.12", "except-star-3.11"],
)
async def test_an_agent_script_is_checked_with_the_grammar_of_the_jobs_python(
    h: Harness, script: str, since: str
) -> None:
    assert sys.version_info[:2] == (3, 11)  # the server's: PY312_ONLY does not compile here
    request = h.request("succeeds", script=script)
    if version(h.backend.job_python_version) >= version(since):
        job = await h.backend.submit(request)
        assert job.key == request.key
        await h.backend.cancel(job.ref, h.now())
        await h.wait_end(job.ref)
    else:
        with pytest.raises(ToolError) as refused:
            await h.backend.submit(request)
        assert refused.value.type is ErrorType.invalid_script
        assert await h.backend.find_by_key(request.key, h.now()) is None


async def test_a_job_declared_older_than_the_server_refuses_newer_syntax(h: Harness) -> None:
    if "declared_python" in h.cannot:
        # Its version is its interpreter's: the case is the one above with that version.
        assert h.backend.job_python_version == "3.11", h.cannot["declared_python"]
        return
    older = h.declaring("3.10")
    assert older.job_python_version == "3.10"
    request = h.request("succeeds", script=PY311_ON)
    with pytest.raises(ToolError) as refused:
        await older.submit(request)
    assert refused.value.type is ErrorType.invalid_script and "3.10" in refused.value.message
    assert await older.find_by_key(request.key, h.now()) is None


async def test_an_invalid_script_or_dependency_starts_no_job(h: Harness) -> None:
    broken = h.request("succeeds", script="def broken(:\n    pass\n")
    with pytest.raises(ToolError) as refused:
        await h.backend.submit(broken)
    assert refused.value.type is ErrorType.invalid_script
    url = h.request("succeeds", dependencies=["evil @ https://evil.example/evil.whl"])
    with pytest.raises(ToolError) as refused:
        await h.backend.submit(url)
    assert refused.value.type is ErrorType.invalid_dependency
    for request in (broken, url):
        assert await h.backend.find_by_key(request.key, h.now()) is None


# -- prices, limits, inputs ----------------------------------------------------------------------


async def test_hardware_lists_priced_flavors_and_job_limits_name_only_those(h: Harness) -> None:
    prices = await h.backend.hardware()
    names = [price.name for price in prices]
    assert "cpu-basic" in names and len(names) == len(set(names))
    assert all(price.micro_usd_per_minute > 0 for price in prices)
    assert isinstance(h.backend.prices_simulated, bool)
    limits = h.backend.job_limits()
    if limits is not None:
        assert isinstance(limits, JobLimits) and limits.flavors
        assert set(limits.flavors) <= set(names)
        for flavor in limits.flavors.values():
            assert flavor.vcpus > 0 and flavor.memory_bytes > 0


async def test_a_model_resolves_to_a_commit_and_an_unknown_one_is_refused(h: Harness) -> None:
    commit = await h.backend.resolve_model(h.model.repo_id, "main")
    assert COMMIT.fullmatch(commit) and commit == h.model.revision
    assert await h.backend.resolve_model(h.model.repo_id, commit) == commit
    if "unknown_model" in h.cannot:
        unknown = await h.backend.resolve_model("conformance/no-such-model", "main")
        assert COMMIT.fullmatch(unknown), h.cannot["unknown_model"]
        return
    with pytest.raises(ToolError):
        await h.backend.resolve_model("conformance/no-such-model", "main")


async def test_a_dataset_resolves_unless_denied_or_missing(h: Harness) -> None:
    assert await h.backend.resolve_dataset(DATASET_ID, []) == h.dataset_revision
    for repo_id, denylist in ((DATASET_ID, [DATASET_ID]), (MISSING_DATASET_ID, [])):
        with pytest.raises(ToolError) as refused:
            await h.backend.resolve_dataset(repo_id, denylist)
        assert refused.value.type is ErrorType.dataset_not_allowed, refused.value
        assert refused.value.details.get("dataset") == repo_id


async def test_a_dataset_reads_as_a_job_mounting_it_sees_it_up_to_a_cap(h: Harness) -> None:
    read = await h.backend.read_dataset(DATASET_ID, h.dataset_revision, 1 << 20)
    assert read.files == sorted(DATASET_FILES.items()) and not read.cut
    cut = await h.backend.read_dataset(DATASET_ID, h.dataset_revision, 20)
    assert cut.cut and sum(len(data) for _, data in cut.files) == 20
    with pytest.raises(ToolError):
        await h.backend.read_dataset(MISSING_DATASET_ID, h.dataset_revision, 100)
