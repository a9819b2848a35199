"""Whole episodes through the real workflows and their retry policies, with the hf backend on
the real `HfApi` over the HTTP-level fake Hub, while the Hub misbehaves: a job creation that
hangs and lands later, listing lag, a 429 with a reset, a job that vanishes, a namespace changed
between two workers."""

from __future__ import annotations

import math
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from job_launcher.trusted_lines import SCORE_TAG, format_trusted_line
from posttrain_common.contracts.jobs import LateJob
from tests.hf.conftest import http_backend
from tests.hf.fake_hub import JobPlan
from tests.hf.http_hub import HubHttp
from tests.hf.temporal import hf_worker
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import SIGNAL_LATE_JOB_SETTLED
from workflows.operations.reaper import ReaperInput, ReaperWorkflow
from workflows.policies import SUBMIT_RETRY

CPU_PRICE = 167  # micro-USD per minute of cpu-basic
SCORE_LINE = format_trusted_line(SCORE_TAG, "{nonce}", {"score": 0.75, "split": "hidden"})
RATE_LIMITED = {"RateLimit": '"api";r=0;t=90'}


def reserved_usd(minutes: int) -> float:
    return minutes * CPU_PRICE / 1e6


async def test_a_hung_create_that_lands_later_yields_one_job_and_one_reservation(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, http_hub: HubHttp
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=5, running_s=61)
    http_hub.listing_lag = 1
    # The first attempt's create gets no answer within its timeout; the Hub creates the job
    # one request later, while the retry is already looking for it.
    http_hub.hang("create_job", lands_after_requests=1)
    async with hf_worker(time_skipping_env, tmp_path, hub, http_backend(http_hub)) as h:
        ep = await h.episode()
        submitted = await ep.call(
            "jobs_submit", script="print('x')\n", flavor="cpu-basic", timeout_minutes=5
        )
        assert submitted.data["state"] == "queued", submitted.data
        assert submitted.metadata["service_spend"]["reserved"]["usd"] == reserved_usd(5)
        done = await ep.wait_job(submitted.data["job_id"])
        assert done.data["state"] == "succeeded" and done.data["cost_usd"] == reserved_usd(2)
        spend = (await ep.status()).service_spend
        assert spend.settled.jobs == 1 and spend.reserved.usd == 0.0
    assert len(hub.jobs) == 1 and len(http_hub.requests_to("create_job")) == 1


async def test_listing_lag_of_two_observations_still_yields_one_job_per_submit(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, http_hub: HubHttp
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=5, running_s=30)
    http_hub.listing_lag = 2
    for _ in range(2):  # both creates succeed on the Hub after the client gave up on them
        http_hub.hang("create_job")
    async with hf_worker(time_skipping_env, tmp_path, hub, http_backend(http_hub)) as h:
        ep = await h.episode()
        jobs = [await ep.submit_job(), await ep.submit_job()]
        for job_id in jobs:
            assert (await ep.wait_job(job_id)).data["state"] == "succeeded"
        assert (await ep.status()).service_spend.settled.jobs == 2
    assert len(hub.jobs) == 2 and len(http_hub.requests_to("create_job")) == 2


async def test_a_429_with_a_reset_is_retried_by_temporal_after_the_reset(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, http_hub: HubHttp
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=5, running_s=30)
    http_hub.answer("list_jobs", 429, headers=RATE_LIMITED)  # the submit's look by key
    async with hf_worker(time_skipping_env, tmp_path, hub, http_backend(http_hub)) as h:
        ep = await h.episode()
        submitted = await ep.call_over(
            timedelta(minutes=4),
            "jobs_submit",
            script="print('x')\n",
            flavor="cpu-basic",
            timeout_minutes=5,
        )
        assert submitted.data["state"] == "queued", submitted.data
    refused, retried = http_hub.requests_to("list_jobs")[:2]
    # One request in the failed attempt (no library retry), the next one after the reset.
    assert (retried.at - refused.at).total_seconds() >= 91
    assert len(hub.jobs) == 1


async def test_a_vanished_job_settles_at_its_reserved_worst_case_and_is_flagged(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, http_hub: HubHttp
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=5, running_s=3000)
    backend = http_backend(http_hub, vanished_after_looks=3, vanished_after_s=120)
    async with hf_worker(time_skipping_env, tmp_path, hub, backend) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(timeout_minutes=10)
        running = await ep.call_over(timedelta(minutes=2), "jobs_wait", job_id=job_id, timeout_s=60)
        assert running.data["state"] == "running"
        hub.jobs.clear()  # the Hub answers 404 for it from now on
        gone = await ep.wait_job(job_id)
        assert gone.data["state"] == "cancelled"
        assert gone.data["cost_usd"] == reserved_usd(10)  # never 0: the whole reservation
        assert gone.data["settled_at_worst_case"] is True
        assert "worst case" in gone.data["message"] and "404" in gone.data["message"]
        spend = (await ep.status()).service_spend
        assert spend.settled.usd == reserved_usd(10) and spend.reserved.usd == 0.0


async def test_a_job_keeps_being_tracked_when_the_namespace_changes_mid_job(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, http_hub: HubHttp
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=5, running_s=600)
    http_hub.namespaces.add("alice-org")
    backend = http_backend(http_hub, namespace="alice")
    async with hf_worker(time_skipping_env, tmp_path, hub, backend) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(timeout_minutes=20)
        # Where new jobs start changes while the job runs, as it does for a worker restarted
        # with another POSTTRAIN_NAMESPACE, or when the token's user changes.
        backend._namespace = "alice-org"
        done = await ep.wait_job(job_id)
        assert done.data["state"] == "succeeded" and done.data["running_s"] == 600.0
        assert done.data["cost_usd"] == reserved_usd(10)
        await ep.submit_job()
    # The first job stayed in alice, and every call on it went there; the next one starts in
    # alice-org.
    assert [http_hub.namespace_of(job) for job in hub.jobs] == ["alice", "alice-org"]
    first = next(iter(hub.jobs))
    for seen in http_hub.requests_to("inspect_job"):
        if first in seen.path:
            assert seen.path.startswith("/api/jobs/alice/"), seen.path


async def test_a_log_replay_cut_short_is_read_again_and_the_episode_is_scored(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, http_hub: HubHttp
) -> None:
    hub = http_hub.hub
    agent = JobPlan(scheduling_s=5, running_s=30, outputs={"model.safetensors": 1000})
    grader = JobPlan(scheduling_s=5, running_s=30, logs=["loading", "evaluating", SCORE_LINE])
    hub.plan_for = lambda labels: agent if labels["posttrain-role"] == "agent" else grader
    # The grader's first three log replays stop before the score line, silent until the read
    # timeout (the library's "end of the replay"), and disagree: the log was not read whole.
    http_hub.cut_logs(1, 2, 2)
    async with hf_worker(time_skipping_env, tmp_path, hub, http_backend(http_hub)) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        assert (await ep.wait_job(job_id)).data["state"] == "succeeded"
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.done and final.reward == 0.75, final.data
    replays = [seen for seen in http_hub.requests_to("job_logs") if "tail" in str(seen.params)]
    assert len(replays) >= 4  # three cut ones, then the whole log


async def test_a_whole_log_without_a_score_line_is_still_invalid_with_score_0(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, http_hub: HubHttp
) -> None:
    hub = http_hub.hub
    agent = JobPlan(scheduling_s=5, running_s=30, outputs={"model.safetensors": 1000})
    grader = JobPlan(scheduling_s=5, running_s=30, logs=["loading", "evaluating"])
    hub.plan_for = lambda labels: agent if labels["posttrain-role"] == "agent" else grader
    async with hf_worker(time_skipping_env, tmp_path, hub, http_backend(http_hub)) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        assert (await ep.wait_job(job_id)).data["state"] == "succeeded"
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.done and final.reward == 0.0, final.data


async def test_a_create_that_lands_after_every_submit_attempt_is_reaped_and_settled_at_once(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, http_hub: HubHttp
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=0, running_s=86_400)
    async with hf_worker(time_skipping_env, tmp_path, hub, http_backend(http_hub)) as h:
        ep = await h.episode()
        followed = await ep.submit_job(timeout_minutes=60)  # a job its workflow follows
        # Every attempt's create hangs; the first one lands on the Hub after the submit gave up.
        http_hub.hang("create_job", lands_after_requests=10**9)
        for _ in range(SUBMIT_RETRY.maximum_attempts - 1):
            http_hub.hang("create_job", lands=False)
        failed = await ep.call_over(
            timedelta(minutes=10),
            "jobs_submit",
            script="print('x')\n",
            flavor="cpu-basic",
            timeout_minutes=5,
        )
        assert len(http_hub.requests_to("create_job")) == 1 + SUBMIT_RETRY.maximum_attempts
        (job_id,) = [j["job_id"] for j in (await ep.status()).jobs if j["job_id"] != followed]
        assert failed.data.get("job_id", job_id) == job_id
        before = (await ep.status()).service_spend
        assert before.settled.usd == 0.0 and before.reserved.usd == reserved_usd(60), before
        (landed,) = http_hub.land_now()  # billing now, and nothing follows it
        await ep.skip(timedelta(seconds=150))
        # One reaper run (its Schedule's period), without time skipping: a skip while the
        # client awaits it would run the episode into its time limit.
        with time_skipping_env.auto_time_skipping_disabled():
            report = await h.client.execute_workflow(
                ReaperWorkflow.run,
                ReaperInput(reconcile=False),
                id=f"reaper-{uuid.uuid4().hex[:8]}",
                task_queue=h.task_queue,
            )
        assert [stray.job_id for stray in report.strays] == [job_id] and not report.orphans
        assert report.settled_late == [report.strays[0].ref] and not report.failed
        # The followed job of the same running episode is no stray: it runs on.
        (running,) = [j for j in hub.jobs.values() if j.id != landed.id]
        assert hub.info(running.id).status.stage == "RUNNING"
        stopped = hub.info(landed.id)
        assert stopped.status.stage == "CANCELED"
        status = await ep.status()
        assert not status.done  # settled while the episode runs, not at its close
        # Its real running time (the Hub's: at least the 150 s skipped, 3 started minutes) is
        # charged to the episode.
        assert stopped.durations is not None and stopped.durations.running_secs is not None
        minutes = math.ceil(stopped.durations.running_secs / 60)
        assert minutes >= 3
        assert status.service_spend.settled.usd == reserved_usd(minutes)
        # A second report of the same job changes nothing.
        await ep.handle.signal(
            SIGNAL_LATE_JOB_SETTLED, LateJob(job_id=job_id, ref=report.strays[0].ref, running_s=150)
        )
        assert (await ep.status()).service_spend.settled.usd == reserved_usd(minutes)
        record = await ep.handle.query(EpisodeWorkflow.resume_input)
        (note,) = [a for a in record.carry.operator_actions if a.action == "late_job_settled"]
        assert note.job_id == job_id and note.minutes == minutes and note.by == "reaper"


async def test_a_create_that_lands_after_its_retrys_job_ended_is_reaped_and_settled(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, http_hub: HubHttp
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=5, running_s=30)
    # The first attempt's create hangs and lands only after the retry's own job has ended,
    # long past the retry's settle window: the watcher's duplicate check never sees it.
    http_hub.hang("create_job", lands_after_requests=10**9)
    async with hf_worker(time_skipping_env, tmp_path, hub, http_backend(http_hub)) as h:
        ep = await h.episode()
        job_id = await ep.submit_job()
        done = await ep.wait_job(job_id)
        assert done.data["state"] == "succeeded" and done.data["cost_usd"] == reserved_usd(1)
        hub.plan = JobPlan(scheduling_s=0, running_s=86_400)
        (landed,) = http_hub.land_now()
        await ep.skip(timedelta(seconds=100))
        with time_skipping_env.auto_time_skipping_disabled():
            report = await h.client.execute_workflow(
                ReaperWorkflow.run,
                ReaperInput(reconcile=False),
                id=f"reaper-{uuid.uuid4().hex[:8]}",
                task_queue=h.task_queue,
            )
        assert [stray.job_id for stray in report.strays] == [job_id]
        assert report.settled_late == [report.strays[0].ref]
        stopped = hub.info(landed.id)
        assert stopped.status.stage == "CANCELED"
        assert stopped.durations is not None and stopped.durations.running_secs is not None
        minutes = math.ceil(stopped.durations.running_secs / 60)
        spend = (await ep.status()).service_spend
        # The followed job's minute, and the stray's real minutes on top.
        assert spend.settled.usd == reserved_usd(1 + minutes) and spend.settled.jobs == 1
