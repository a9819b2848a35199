"""The orphan reaper: on the time-skipping test server (the workflow itself) and on the dev server
(the Temporal Schedule the hf worker creates, triggered explicitly: the test server does not
implement Schedules)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path
from typing import cast

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.backends.hf.backend import HfBackend
from activities.backends.hf.labels import HfRef
from activities.jobs.reaper import ReaperActivities
from posttrain_common.contracts.jobs import JobRole
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_server.wiring import (
    TemporalEpisodeLiveness,
    reaper_schedule_id,
    schedule_reaper_soon,
)
from posttrain_server.worker import build_worker
from tests.hf.conftest import make_backend, request
from tests.hf.fake_hub import FakeHub, JobPlan
from tests.hf.schedules import dev_server, first_run, once_it_answers
from tests.hf.stand_in import StandInEpisode
from workflows.ids import episode_workflow_id
from workflows.operations.reaper import ReaperInput, ReaperReport, ReaperWorkflow

LIVE, CLOSED, NEVER = "ep-1111111111111111", "ep-2222222222222222", "ep-3333333333333333"


async def start_jobs(hub: FakeHub, backend: HfBackend) -> dict[str, str]:
    """A running job in each episode (and a finished one in the closed episode)."""
    hub.plan = JobPlan(scheduling_s=0, running_s=86_400)
    refs = {}
    for n, episode in enumerate((LIVE, CLOSED, NEVER), start=1):
        job = await backend.submit(request(n=n, episode_id=episode, key=f"{episode}/job/1"))
        refs[episode] = job.ref
    hub.plan = JobPlan(scheduling_s=0, running_s=1)
    await backend.submit(request(n=9, episode_id=CLOSED, key=f"{CLOSED}/job/2"))
    hub.advance(30)
    return refs


def stage(hub: FakeHub, ref: str) -> str:
    return hub.info(HfRef.decode(ref).job_id).status.stage


async def test_the_reaper_cancels_orphans_and_leaves_live_episodes_jobs_alone(
    time_skipping_env: WorkflowEnvironment, hub: FakeHub, backend: HfBackend
) -> None:
    client = time_skipping_env.client
    refs = await start_jobs(hub, backend)
    # Another deployment's job in the closed episode is not ours to reap.
    other = make_backend(hub)
    other.deployment = "dother"
    theirs = await other.submit(request(n=7, episode_id=CLOSED, key="x/job/1"))
    queue = f"tq-{uuid.uuid4().hex[:8]}"
    reaper = ReaperActivities(backend, TemporalEpisodeLiveness(client))
    # Without time skipping: a skip would run the stand-in episode into its execution timeout.
    with time_skipping_env.auto_time_skipping_disabled():
        await reap_beside_episodes(client, queue, reaper, refs)
    assert stage(hub, refs[CLOSED]) == "CANCELED" and stage(hub, refs[NEVER]) == "CANCELED"
    assert stage(hub, refs[LIVE]) == "RUNNING"
    assert stage(hub, theirs.ref) == "RUNNING"


async def reap_beside_episodes(
    client: Client, queue: str, reaper: ReaperActivities, refs: dict[str, str]
) -> None:
    async with Worker(
        client,
        task_queue=queue,
        workflows=[ReaperWorkflow, StandInEpisode],
        activities=[reaper.find_orphan_jobs, reaper.cancel_orphan_job],
    ):
        live = await client.start_workflow(
            StandInEpisode.run, False, id=episode_workflow_id(LIVE), task_queue=queue
        )
        await client.execute_workflow(
            StandInEpisode.run, True, id=episode_workflow_id(CLOSED), task_queue=queue
        )
        handle = await client.start_workflow(
            ReaperWorkflow.run,
            ReaperInput(reconcile=False),
            id=f"reaper-{queue}",
            task_queue=queue,
        )
        report = await handle.result()
        assert report.checked == 3
        assert {o.episode_id for o in report.orphans} == {CLOSED, NEVER}
        assert sorted(report.cancelled) == sorted([refs[CLOSED], refs[NEVER]])
        assert not report.failed and report.done
        assert {o.role for o in report.orphans} == {JobRole.agent.value}
        assert await handle.query(ReaperWorkflow.report) == report
        await live.signal(StandInEpisode.finish)
        await live.result()


async def test_a_dry_run_only_reports(
    time_skipping_env: WorkflowEnvironment, hub: FakeHub, backend: HfBackend
) -> None:
    client = time_skipping_env.client
    refs = await start_jobs(hub, backend)
    queue = f"tq-{uuid.uuid4().hex[:8]}"
    reaper = ReaperActivities(backend, TemporalEpisodeLiveness(client))
    async with Worker(
        client,
        task_queue=queue,
        workflows=[ReaperWorkflow],
        activities=[reaper.find_orphan_jobs, reaper.cancel_orphan_job],
    ):
        report = await client.execute_workflow(
            ReaperWorkflow.run,
            ReaperInput(dry_run=True, reconcile=False),
            id=f"r-{queue}",
            task_queue=queue,
        )
    assert len(report.orphans) == 3 and not report.cancelled  # no episode workflow exists
    assert all(stage(hub, ref) == "RUNNING" for ref in refs.values())


async def test_the_hf_worker_schedules_the_reaper(
    tmp_path: Path, hub: FakeHub, backend: HfBackend
) -> None:
    refs = await start_jobs(hub, backend)
    env = await dev_server()
    try:
        client = env.client
        queue = f"tq-{uuid.uuid4().hex[:8]}"
        settings = Settings(state_dir=tmp_path / "state", backend="fake")
        key = ServerKey.load_or_create(settings.server_key_path)
        worker = build_worker(
            client, settings, backend, key=key, task_queue=queue, tasks_dir=tmp_path
        )
        async with worker:
            schedule = client.get_schedule_handle(reaper_schedule_id(client.namespace, queue))
            await once_it_answers(schedule.describe)
            await schedule.trigger()
            report = await first_run(client, schedule, ReaperReport)
        assert {o.episode_id for o in report.orphans} == {LIVE, CLOSED, NEVER}
        assert all(stage(hub, ref) == "CANCELED" for ref in refs.values())
        await schedule.delete()
    finally:
        await env.shutdown()


async def test_the_schedule_is_not_attempted_outside_an_event_loop() -> None:
    client = cast(Client, None)  # never reached: no loop runs in that thread
    task = await asyncio.to_thread(schedule_reaper_soon, client, "q", timedelta(minutes=1))
    assert task is None
