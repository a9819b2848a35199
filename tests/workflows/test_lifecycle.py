"""Sessions and the end of episodes: reset, close, operator cancel, caps, history."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateStage
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.episode_calls import EndRequest
from posttrain_common.keys import ServerKey
from posttrain_env.models import EndReason
from tests.workflows.harness import running_worker, write_task
from workflows.episode.session import ResetRequest, ResetResult, SessionWorkflow
from workflows.episode.workflow import EpisodeWorkflow

LONG = FakeJobScript(run_s=100_000)


async def test_reset_ends_the_previous_episode_unscored_and_cancels_its_jobs(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[LONG])) as h:
        session = await h.session()
        first = await h.episode(session=session)
        job_id = await first.submit_job(timeout_minutes=60)
        await first.skip(timedelta(minutes=2))
        second = await h.episode(session=session)
        assert second.episode_id != first.episode_id
        old = await first.status()
        assert old.end is not None and old.end.reason == EndReason.reset
        assert old.end.reward is None
        assert old.jobs[0]["job_id"] == job_id and old.jobs[0]["state"] == "cancelled"
        assert old.service_spend.final is True and old.service_spend.settled.jobs == 1
        assert await session.query(SessionWorkflow.current_episode) == second.episode_id


async def test_reset_with_a_never_confirmed_cancellation_fails_naming_the_job(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    stuck = FakeJobScript(run_s=100_000, cancel_confirm_after_s=None)
    async with running_worker(
        time_skipping_env, tmp_path, FakeScenario(jobs=[stuck]), cancel_confirm_s=120
    ) as h:
        session = await h.session()
        first = await h.episode(session=session)
        job_id = await first.submit_job(timeout_minutes=60)
        reset = await session.start_update(
            SessionWorkflow.reset,
            ResetRequest(task_id="t_test"),
            result_type=ResetResult,
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        )
        await first.skip(timedelta(minutes=4))
        with pytest.raises(WorkflowUpdateFailedError) as failure:
            await reset.result()
        cause = failure.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "hf_error"
        assert job_id in cause.message and "not confirmed" in cause.message
        old = await first.status()
        assert old.cancelling == [job_id] and old.service_spend.final is False
        assert old.end is not None and old.end.reason == EndReason.reset
        assert await session.query(SessionWorkflow.current_episode) == first.episode_id


async def test_close_ends_the_episode_as_cancelled_with_its_jobs(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[LONG])) as h:
        session = await h.session()
        ep = await h.episode(session=session)
        await ep.submit_job(timeout_minutes=60)
        closed = await session.execute_update(SessionWorkflow.close)
        assert closed is not None and closed.end.reason == EndReason.cancelled
        assert closed.end.reward is None and closed.service_spend.final is True
        assert (await ep.status()).jobs[0]["state"] == "cancelled"
        after = await ep.call("task_info")
        assert after.data["error"]["type"] == "episode_over"


async def test_an_operators_cancel_ends_the_episode_unscored(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, FakeScenario(jobs=[LONG])) as h:
        ep = await h.episode()
        await ep.submit_job(timeout_minutes=60)
        await ep.handle.signal(
            EpisodeWorkflow.end_requested, EndRequest(reason=EndReason.cancelled)
        )
        await ep.skip(timedelta(seconds=40))
        status = await ep.status()
        assert status.end is not None and status.end.reason == EndReason.cancelled
        assert status.end.reward is None and status.jobs[0]["state"] == "cancelled"


async def test_a_cancellation_unconfirmed_keeps_final_false_until_it_is_confirmed(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    slow_stop = FakeJobScript(run_s=100_000, cancel_confirm_after_s=300)
    caplog.set_level(logging.WARNING, logger="temporalio.workflow")
    async with running_worker(
        time_skipping_env, tmp_path, FakeScenario(jobs=[slow_stop]), cancel_confirm_s=60
    ) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(timeout_minutes=60)
        await ep.skip(timedelta(minutes=1))
        answer = await ep.call_over(timedelta(minutes=2), "jobs_cancel", job_id=job_id)
        assert answer.data["state"] == "cancelling"
        assert answer.metadata["service_spend"]["final"] is False
        await ep.skip(timedelta(minutes=10))
        done = await ep.call("jobs_status", job_id=job_id)
        assert done.data["state"] == "cancelled"
        assert done.metadata["service_spend"]["final"] is True
        assert done.metadata["service_spend"]["reserved"]["usd"] == 0.0
    # Every cancel asked again is a warning naming the job, its episode and how long it waited.
    retries = [
        r.getMessage() for r in caplog.records if "still unconfirmed after" in r.getMessage()
    ]
    assert retries, "no warning for an unconfirmed cancellation asked again"
    assert all(job_id in line and ep.episode_id in line for line in retries), retries


async def test_the_live_episode_cap_refuses_new_episodes_cleanly(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, max_live_episodes=1) as h:
        first = await h.episode()
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await h.episode()
        cause = refused.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "limit_reached"
        assert "1 live episodes" in cause.message
        job_id = await first.submit_job()
        await first.wait_job(job_id)
        await first.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        await first.skip(timedelta(seconds=40))
        await h.episode()  # the first one retired: room again


async def test_the_server_wide_spend_cap_refuses_jobs_and_episodes_cleanly(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    # cpu-basic costs 167 micro-USD a minute: the cap fits 10 minutes in all live episodes.
    async with running_worker(
        time_skipping_env, tmp_path, FakeScenario(jobs=[LONG]), spend_cap_usd=0.00167
    ) as h:
        one, two = await h.episode(), await h.episode()
        await one.submit_job(timeout_minutes=6)
        refused = await two.call(
            "jobs_submit", script="pass\n", flavor="cpu-basic", timeout_minutes=5
        )
        assert refused.data["error"]["type"] == "budget_exhausted"
        assert "server-wide" in refused.data["error"]["message"]
        assert refused.metadata["service_spend"]["reserved"]["usd"] == 0.0
        await two.submit_job(timeout_minutes=4)
        with pytest.raises(WorkflowUpdateFailedError) as no_room:
            await h.episode()
        assert isinstance(no_room.value.cause, ApplicationError)
        assert no_room.value.cause.type == "budget_exhausted"


async def test_no_secret_appears_in_any_workflow_history(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        session = await h.session()
        ep = await h.episode(session=session)
        job_id = await ep.submit_job()
        await ep.wait_job(job_id)
        await ep.call_over(timedelta(minutes=5), "dev_evaluate", job_id=job_id)
        await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        key = ServerKey.load_or_create(h.settings.state_dir / "server.key")
        requests = h.backend.requests()
        secrets = {
            key.hidden_split_seed(ep.episode_id),
            key.episode_token(ep.episode_id),
            (h.settings.state_dir / "server.key").read_bytes().hex(),
        }
        secrets |= {r.env["POSTTRAIN_NONCE"] for r in requests}
        secrets |= {v for r in requests for v in r.secrets.values()}
        assert len([r for r in requests if r.secrets]) == 1  # only the grader has a secret
        workflow_ids = [session.id, ep.handle.id] + [
            f"{ep.handle.id}/job/{n}" for n in range(1, len(requests) + 1)
        ]
        scanned = 0
        for workflow_id in workflow_ids:
            history = await h.client.get_workflow_handle(workflow_id).fetch_history()
            text = history.to_json()
            scanned += len(history.events)
            for secret in secrets:
                assert secret not in text, f"a secret is in the history of {workflow_id}"
        assert scanned > 50


async def test_a_jobs_history_stays_within_30_events_across_a_6_hour_job(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    six_hours = FakeJobScript(run_s=6 * 3600)
    # The watcher looks every 5 minutes here, not every 30 s: the job's history must not grow
    # with its duration whatever the interval (a look that signalled the job without a change
    # would still pass 30 events, 72 looks over 6 hours), and 720 looks cost 30 s of CPU.
    async with running_worker(
        time_skipping_env, tmp_path, FakeScenario(jobs=[six_hours]), watch_interval_s=300.0
    ) as h:
        write_task(
            tmp_path / "tasks",
            "t_long",
            time_limit_s=8 * 3600,
            budget_usd=5.0,
            max_timeout_minutes=7 * 60,
        )
        ep = await h.episode("t_long")
        job_id = await ep.submit_job(timeout_minutes=7 * 60)
        await ep.skip(timedelta(hours=6, minutes=11))  # past the first look after its end
        done = await ep.call("jobs_status", job_id=job_id)
        assert done.data["state"] == "succeeded"
        history = await h.client.get_workflow_handle(f"{ep.handle.id}/job/1").fetch_history()
        print(f"job history: {len(history.events)} events")
        # 28 events: 5 of them show `running` as its PtState (the watcher's `shown` signal, its
        # workflow task and the upsert), and none report its start (the submit activity does).
        assert len(history.events) <= 30, len(history.events)


async def test_continue_as_new_keeps_every_job_reservation_and_answer(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(
        time_skipping_env, tmp_path, FakeScenario(jobs=[LONG]), continue_as_new_events=100
    ) as h:
        ep = await h.episode()
        first_run = (await ep.handle.describe()).run_id
        job_id = await ep.submit_job(timeout_minutes=60)
        before = await ep.call("jobs_status", request_id="before-can", job_id=job_id)
        for _ in range(25):
            await ep.call("task_info")
        await ep.skip(timedelta(seconds=40))
        assert (await ep.handle.describe()).run_id != first_run  # it continued as new
        status = await ep.status()
        assert status.steps_used == 27
        assert [j["job_id"] for j in status.jobs] == [job_id]
        assert status.service_spend.reserved.usd == 60 * 167 / 1e6
        again = await ep.call("jobs_status", request_id="before-can", job_id=job_id)
        assert again == before  # answered from the carried results, not run again
        assert (await ep.status()).steps_used == 27
        # The fake confirms at once: no workflow time needs to pass for this call.
        cancelled = await ep.call("jobs_cancel", job_id=job_id)
        assert cancelled.data["state"] == "cancelled"
        assert cancelled.metadata["service_spend"]["reserved"]["usd"] == 0.0
        assert cancelled.metadata["service_spend"]["settled"]["jobs"] == 1
