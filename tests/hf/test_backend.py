"""HfBackend against the recording fake: exactly-once submits, stages and settlement, watching
cost, cancel-and-confirm, errors, inputs and prices."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import JobInfo, set_client_factory
from huggingface_hub.utils import get_session
from huggingface_hub.utils._http import default_client_factory
from pydantic import SecretStr
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.backends.hf.backend import HfBackend
from activities.backends.hf.factory import build as hf_backend
from activities.backends.hf.http import BoundedTransport
from activities.backends.hf.labels import HfRef
from activities.backends.hf.stages import backend_job
from activities.backends.interface import ArtifactRejected, TransientBackendError
from activities.jobs.activities import JobsActivities
from activities.ports import JobToWatch
from posttrain_common.contracts.jobs import JobRef, JobRole, SubmitJob
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import JobState
from tests.hf.conftest import DATASET, MODEL, make_backend, request
from tests.hf.fake_hub import ENDPOINT, T0, FakeHub, JobPlan, dataset_json
from workflows.episode.ledger import billed_minutes


class RecordingWatch:
    """Stands in for the watcher (activities.ports.JobWatch): submit_job registers the job."""

    def __init__(self) -> None:
        self.watched: list[JobToWatch] = []

    async def watch(self, job: JobToWatch) -> None:
        self.watched.append(job)


def activities(backend: HfBackend, tmp_path: Path) -> JobsActivities:
    return JobsActivities(backend, ServerKey(b"k" * 32), RecordingWatch(), tmp_path)


def submit_job(n: int = 1) -> SubmitJob:
    fields = request(JobRole.agent, n=n).model_dump(exclude={"env", "secrets"})
    return SubmitJob(**fields)


# -- exactly once ------------------------------------------------------------------------------


async def test_a_submit_that_fails_after_creating_the_job_is_retried_into_that_job(
    hub: FakeHub, backend: HfBackend, tmp_path: Path
) -> None:
    acts = activities(backend, tmp_path)
    env = ActivityEnvironment()
    hub.fail("run_uv_job", 503, after=True)  # the job exists, the answer is lost
    with pytest.raises(TransientBackendError):
        await env.run(acts.submit_job, submit_job())
    assert len(hub.jobs) == 1
    again = await env.run(acts.submit_job, submit_job())  # the activity's retry
    assert len(hub.jobs) == 1 and len(hub.calls_to("run_uv_job")) == 1
    assert HfRef.decode(again.ref).job_id == next(iter(hub.jobs))
    # find_by_key asked by this deployment's label and the hashed key, before creating.
    labels = hub.calls_to("list_jobs")[-1].args["labels"]
    assert set(labels) == {"posttrain-deployment", "posttrain-key"}


async def test_another_deployments_job_with_the_same_workflow_id_is_not_adopted(
    hub: FakeHub, backend: HfBackend
) -> None:
    other = HfBackend(
        hub.api("other-token"),  # type: ignore[arg-type]
        hub.api(False),  # type: ignore[arg-type]
        deployment="dother",
        namespace="alice",
    )
    await other.submit(request())
    assert await backend.find_by_key(request().key, T0) is None
    assert await other.find_by_key(request().key, T0) is not None


# -- stages and settlement ------------------------------------------------------------------------


def job_json(stage: str, **fields: Any) -> dict[str, Any]:
    """A job as `GET /api/jobs/<ns>/<id>` answers (the shape JobInfo parses)."""
    return {
        "id": "687fb701029421ae5549d998",
        "createdAt": "2026-03-02T09:00:00.000Z",
        "startedAt": "2026-03-02T09:00:05.000Z",
        "finishedAt": "2026-03-02T09:01:06.000Z",
        "dockerImage": "ghcr.io/astral-sh/uv:python3.12-bookworm",
        "command": ["uv", "run", "--python", "3.12", "/data/launcher.py"],
        "arguments": [],
        "environment": {},
        "secrets": {},
        "flavor": "cpu-basic",
        "labels": {"posttrain-timeout-s": "600", "posttrain-key": "kabc"},
        "volumes": [
            {
                "type": "bucket",
                "source": "alice/jobs-artifacts",
                "mountPath": "/data",
                "path": "20260302T090000-a1b2c3",
                "readOnly": False,
            }
        ],
        "status": {"stage": stage, "message": None},
        "durations": {"schedulingSecs": 5, "runningSecs": 61, "totalSecs": 66},
        "owner": {"id": "5e9ecfc04957053f60648a3e", "name": "alice", "type": "user"},
        **fields,
    }


@pytest.mark.parametrize(
    ("stage", "state"),
    [
        ("SCHEDULING", JobState.queued),
        ("RUNNING", JobState.running),
        ("COMPLETED", JobState.succeeded),
        ("ERROR", JobState.failed),
        ("CANCELED", JobState.cancelled),
        ("DELETED", JobState.cancelled),
    ],
)
def test_each_hub_stage_maps_to_a_job_state(stage: str, state: JobState) -> None:
    info = JobInfo(**job_json(stage), endpoint=ENDPOINT)
    assert backend_job(info, ref="r", key="k", now=T0).state is state


def test_61_seconds_of_running_settle_as_2_minutes() -> None:
    job = backend_job(JobInfo(**job_json("COMPLETED"), endpoint=ENDPOINT), ref="r", key="k", now=T0)
    assert job.running_s == 61.0 and billed_minutes(job.running_s) == 2
    assert job.finished_at is not None and job.finished_at.second == 6
    ref = HfRef.of(JobInfo(**job_json("COMPLETED"), endpoint=ENDPOINT), "alice")
    assert ref.folder == "20260302T090000-a1b2c3" and ref.namespace == "alice"


def test_running_time_falls_back_to_started_and_finished_when_durations_are_missing() -> None:
    info = JobInfo(**job_json("COMPLETED", durations=None), endpoint=ENDPOINT)
    assert backend_job(info, ref="r", key="k", now=T0).running_s == 61.0
    running = JobInfo(**job_json("RUNNING", durations=None, finishedAt=None), endpoint=ENDPOINT)
    now = T0 + timedelta(seconds=35)
    assert backend_job(running, ref="r", key="k", now=now).running_s == 30.0


def test_an_error_at_the_timeout_is_timed_out_and_an_early_one_failed() -> None:
    at_timeout = job_json("ERROR", durations={"runningSecs": 600})
    assert backend_job(JobInfo(**at_timeout), ref="r", key="k", now=T0).state is JobState.timed_out
    early = job_json("ERROR", durations={"runningSecs": 12})
    assert backend_job(JobInfo(**early), ref="r", key="k", now=T0).state is JobState.failed
    said = job_json("ERROR", status={"stage": "ERROR", "message": "Job timeout exceeded"})
    assert backend_job(JobInfo(**said), ref="r", key="k", now=T0).state is JobState.timed_out


async def test_a_job_goes_queued_running_succeeded_with_the_hubs_running_time(
    hub: FakeHub, backend: HfBackend
) -> None:
    hub.plan = JobPlan(scheduling_s=10, running_s=61)
    job = await backend.submit(request())
    assert job.state is JobState.queued
    states = []
    for step in (5, 30, 60):
        hub.advance(step)
        states.append((await backend.observe([job.ref], hub.now))[job.ref])
    assert [s.state for s in states] == [JobState.queued, JobState.running, JobState.succeeded]
    assert states[-1].running_s == 61.0 and billed_minutes(states[-1].running_s) == 2


async def test_a_job_past_its_timeout_ends_timed_out(hub: FakeHub, backend: HfBackend) -> None:
    hub.plan = JobPlan(scheduling_s=0, running_s=10_000, outcome="ERROR")
    job = await backend.submit(request(timeout_s=600))
    hub.advance(700)
    ended = (await backend.observe([job.ref], hub.now))[job.ref]
    assert ended.state is JobState.timed_out and ended.running_s == 600.0


async def test_watching_costs_one_listing_for_all_jobs_and_one_look_per_ended_job(
    hub: FakeHub, backend: HfBackend
) -> None:
    hub.plan_for = lambda labels: JobPlan(
        scheduling_s=0, running_s=100 if labels["posttrain-job"].endswith("1") else 1000
    )
    refs = [(await backend.submit(request(n=n))).ref for n in (1, 2, 3)]
    before = len(hub.calls)
    hub.advance(30)
    await backend.observe(refs, hub.now)
    assert [c.method for c in hub.calls[before:]] == ["list_jobs"]
    assert hub.calls[-1].args["status"] == ["SCHEDULING", "RUNNING"]
    hub.advance(100)  # job 1 ends
    seen = await backend.observe(refs, hub.now)
    assert [c.method for c in hub.calls[before + 1 :]] == ["list_jobs", "inspect_job"]
    assert [seen[r].state for r in refs] == [JobState.succeeded, JobState.running, JobState.running]


async def test_a_job_the_hub_no_longer_knows_vanishes_only_after_repeated_404s(
    hub: FakeHub,
) -> None:
    backend = make_backend(hub, vanished_after_looks=3, vanished_after_s=300)
    job = await backend.submit(request())
    gone = hub.jobs.pop(HfRef.decode(job.ref).job_id)
    # Two 404s, four minutes apart: not yet a verdict, the job is left out (still watched).
    for _ in range(2):
        assert await backend.observe([job.ref], hub.now) == {}
        hub.advance(240)
    # It answers again: the count starts over.
    hub.jobs[gone.id] = gone
    assert job.ref in await backend.observe([job.ref], hub.now)
    hub.jobs.pop(gone.id)
    seen: list[dict] = []
    for _ in range(3):
        seen.append(await backend.observe([job.ref], hub.now))
        hub.advance(200)
    assert seen[:2] == [{}, {}]
    vanished = seen[2][job.ref]
    assert vanished.vanished and vanished.state is JobState.cancelled
    assert "404 on 3 looks over 400 s" in vanished.message and "worst case" in vanished.message


# -- cancel and confirm ---------------------------------------------------------------------------


async def test_a_confirmed_cancellation_returns_the_cancelled_job(
    hub: FakeHub, backend: HfBackend
) -> None:
    job = await backend.submit(request())
    hub.advance(30)
    cancelled = await backend.cancel(job.ref, hub.now)
    assert cancelled.state is JobState.cancelled and cancelled.running_s == 25.0
    assert len(hub.calls_to("cancel_job")) == 1


async def test_an_unconfirmed_cancellation_keeps_its_activity_retrying_with_the_job_id(
    hub: FakeHub, tmp_path: Path
) -> None:
    backend = make_backend(hub, cancel_confirm_looks=3)
    hub.plan = JobPlan(scheduling_s=0, running_s=3600, cancel_after_s=None)
    job = await backend.submit(request())
    hf_id = HfRef.decode(job.ref).job_id
    env = ActivityEnvironment()
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    ref = JobRef(ref=job.ref, key=request().key, now=T0)
    with pytest.raises(TransientBackendError) as stuck:
        await env.run(activities(backend, tmp_path).cancel_job, ref)
    # A plain exception, not a non-retryable ApplicationError: Temporal retries it.
    assert not isinstance(stuck.value, ApplicationError)
    assert hf_id in str(stuck.value) and "not confirmed" in str(stuck.value)
    assert beats and all(beat[0]["hf_job_id"] == hf_id for beat in beats)
    # One look before asking (is it ours, has it ended?), then the three confirmation looks.
    assert len(hub.calls_to("inspect_job")) == 1 + 3
    # The Hub finally stops it: the next attempt confirms.
    hub.jobs[hf_id].plan.cancel_after_s = 0.0
    hub.jobs[hf_id].cancel_at = None
    done = await env.run(activities(backend, tmp_path).cancel_job, ref)
    assert done.state is JobState.cancelled


async def test_cancelling_a_job_that_already_ended_returns_its_end(
    hub: FakeHub, backend: HfBackend
) -> None:
    job = await backend.submit(request())
    hub.advance(600)
    hub.fail("cancel_job", 400)  # the Hub refuses to cancel a finished job
    ended = await backend.cancel(job.ref, hub.now)
    assert ended.state is JobState.succeeded


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500, 502, 503])
async def test_rate_limits_and_server_errors_are_transient(
    hub: FakeHub, backend: HfBackend, status: int
) -> None:
    hub.fail("run_uv_job", status)
    with pytest.raises(TransientBackendError, match=str(status)):
        await backend.submit(request())
    assert not hub.jobs
    assert (await backend.submit(request())).state is JobState.queued  # the retry succeeds


async def test_no_credits_is_an_hf_error_a_person_can_act_on(
    hub: FakeHub, backend: HfBackend, tmp_path: Path
) -> None:
    hub.fail("run_uv_job", 402)
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(activities(backend, tmp_path).submit_job, submit_job())
    assert refused.value.type == "hf_error" and refused.value.non_retryable
    assert "no credits" in refused.value.message and "settings/billing" in refused.value.message
    assert len(hub.calls_to("run_uv_job")) == 1


@pytest.mark.parametrize(
    ("status", "words"), [(401, "HF_TOKEN"), (403, "write access"), (422, "422")]
)
async def test_other_client_errors_are_hf_errors_not_retried(
    hub: FakeHub, backend: HfBackend, status: int, words: str
) -> None:
    hub.fail("run_uv_job", status)
    with pytest.raises(ToolError) as refused:
        await backend.submit(request())
    assert refused.value.type is ErrorType.hf_error and words in refused.value.message


# -- inputs ---------------------------------------------------------------------------------------


async def test_a_public_dataset_resolves_to_its_commit(hub: FakeHub, backend: HfBackend) -> None:
    assert await backend.resolve_dataset(DATASET.repo_id, []) == DATASET.revision


@pytest.mark.parametrize(
    ("dataset", "reason"),
    [
        (dataset_json("org/private", "1" * 40, private=True), "does not exist or is not public"),
        (dataset_json("org/gated", "2" * 40, gated="manual"), "is gated"),
        (dataset_json("org/disabled", "3" * 40, disabled=True), "is disabled"),
        (None, "does not exist or is not public"),
    ],
)
async def test_private_gated_disabled_and_missing_datasets_are_refused(
    hub: FakeHub, backend: HfBackend, dataset: dict | None, reason: str
) -> None:
    repo_id = dataset["id"] if dataset else "org/missing"
    if dataset:
        hub.datasets[repo_id] = dataset
    with pytest.raises(ToolError) as refused:
        await backend.resolve_dataset(repo_id, [])
    assert refused.value.type is ErrorType.dataset_not_allowed
    assert reason in refused.value.message and refused.value.details["dataset"] == repo_id


@pytest.mark.parametrize("repo_id", ["org/public-data", "ORG/Public-Data", "../etc", "a/b/c", ""])
async def test_denylisted_and_invalid_datasets_are_refused_before_any_call(
    hub: FakeHub, backend: HfBackend, repo_id: str
) -> None:
    with pytest.raises(ToolError) as refused:
        await backend.resolve_dataset(repo_id, ["org/public-data"])
    assert refused.value.type is ErrorType.dataset_not_allowed
    assert not hub.calls_to("dataset_info")


async def test_a_renamed_dataset_is_checked_against_the_denylist_by_its_current_name(
    hub: FakeHub, backend: HfBackend
) -> None:
    hub.datasets["old/name"] = dataset_json("org/denied", "4" * 40)
    with pytest.raises(ToolError, match="denylist"):
        await backend.resolve_dataset("old/name", ["org/denied"])


async def test_a_base_model_branch_resolves_to_its_commit(hub: FakeHub, backend: HfBackend) -> None:
    assert await backend.resolve_model(MODEL.repo_id, "main") == MODEL.revision
    with pytest.raises(ToolError, match="has no revision"):
        await backend.resolve_model(MODEL.repo_id, "no-such-branch")
    with pytest.raises(ToolError, match="does not exist"):
        await backend.resolve_model("org/nothing", "main")


# -- prices ---------------------------------------------------------------------------------------


async def test_prices_come_from_the_hub_per_minute_and_are_cached(
    hub: FakeHub, backend: HfBackend
) -> None:
    prices = {p.name: p for p in await backend.hardware()}
    assert prices["cpu-basic"].micro_usd_per_minute == 167
    assert (prices["t4-small"].accelerators, prices["t4-small"].accelerator) == (1, "T4")
    await backend.hardware()
    await backend.submit(request())
    assert len(hub.calls_to("list_jobs_hardware")) == 1


async def test_an_unknown_flavor_refreshes_the_prices_once_then_is_refused(
    hub: FakeHub, backend: HfBackend
) -> None:
    await backend.hardware()
    hub.hardware.append({**hub.hardware[2], "name": "l4x1", "unitCostMicroUSD": 13_333})
    job = await backend.submit(request(flavor="l4x1"))  # new since the cache was filled
    assert job.state is JobState.queued and len(hub.calls_to("list_jobs_hardware")) == 2
    with pytest.raises(ToolError, match="no flavor 'h999'"):
        await backend.submit(request(n=2, flavor="h999"))
    assert len(hub.calls_to("list_jobs_hardware")) == 3 and len(hub.jobs) == 1


# -- evaluations and logs --------------------------------------------------------------------------


async def test_an_empty_artifact_gets_a_placeholder_so_the_evaluation_can_mount_it(
    hub: FakeHub, backend: HfBackend
) -> None:
    agent = await backend.submit(request())
    hub.advance(600)
    await backend.submit(request(JobRole.dev, n=2, artifact_ref=agent.ref))
    (batch,) = hub.calls_to("batch_bucket_files")
    folder = HfRef.decode(agent.ref).folder
    assert batch.args["add"] == [(b"", f"{folder}/outputs/.keep")]


async def test_an_artifact_over_the_cap_is_not_evaluated(hub: FakeHub, backend: HfBackend) -> None:
    hub.plan = JobPlan(outputs={"model.safetensors": 3 * 1024**3})
    agent = await backend.submit(request())
    hub.advance(600)
    await backend.observe([agent.ref], hub.now)
    # The artifact's fault (it scores 0 as invalid), never an error of the service's.
    with pytest.raises(ArtifactRejected, match="over this task's cap"):
        await backend.submit(
            request(JobRole.dev, n=2, artifact_ref=agent.ref, artifact_cap_bytes=2 * 1024**3)
        )
    assert len(hub.calls_to("run_uv_job")) == 1
    await backend.submit(request(JobRole.dev, n=3, artifact_ref=agent.ref))  # default cap: 20 GiB
    assert not hub.calls_to("batch_bucket_files")


async def test_logs_are_the_tail_of_the_hubs_log(hub: FakeHub, backend: HfBackend) -> None:
    hub.plan = JobPlan(logs=[f"line {i}" for i in range(10)])
    job = await backend.submit(request())
    hub.advance(30)
    assert await backend.logs(job.ref, 3, hub.now) == ["line 7", "line 8", "line 9"]
    assert hub.calls_to("fetch_job_logs")[0].args == {
        "job_id": HfRef.decode(job.ref).job_id,
        "namespace": "alice",
        "follow": False,
        "tail": 3,
    }


# -- construction ---------------------------------------------------------------------------------


def test_without_hf_token_the_backend_refuses_to_start(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, backend="hf", hf_token=None)
    with pytest.raises(SystemExit) as refused:
        hf_backend(settings, ServerKey(b"k" * 32))
    assert "HF_TOKEN" in str(refused.value.code)


def test_the_wiring_keeps_the_token_in_the_broker_api_only(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, backend="hf", hf_token=SecretStr("hf_x"))
    key = ServerKey(b"k" * 32)
    try:
        backend = hf_backend(settings, key)
        assert isinstance(backend, HfBackend)
        assert backend._api.token == "hf_x" and backend._public.token is False
        # One deployment label per server key: every worker sharing the key agrees on it.
        again = hf_backend(settings, key)
        assert isinstance(again, HfBackend) and again.deployment == backend.deployment
        # Every Hub request of the process goes through the bounded transport.
        client = get_session()
        assert isinstance(client._transport, BoundedTransport)
        assert None not in client.timeout.as_dict().values()
    finally:
        set_client_factory(default_client_factory)


async def test_the_namespace_defaults_to_the_tokens_user(hub: FakeHub) -> None:
    backend = HfBackend(
        hub.api("hf_anotherBrokerToken0123456789"),  # type: ignore[arg-type]
        hub.api(False),  # type: ignore[arg-type]
        deployment="d",
    )
    await backend.submit(request())
    await backend.submit(request(n=2))
    assert len(hub.calls_to("whoami")) == 1
    assert hub.calls_to("run_uv_job")[0].args["namespace"] == "alice"


async def test_a_ref_of_another_backend_is_left_out_or_refused(
    hub: FakeHub, backend: HfBackend
) -> None:
    job = await backend.submit(request())
    assert set(await backend.observe([job.ref, "fake-0123"], hub.now)) == {job.ref}
    with pytest.raises(ToolError) as refused:
        await backend.cancel("fake-0123/../x", hub.now)
    assert refused.value.type is ErrorType.hf_error
