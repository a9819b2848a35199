"""A session closes once its episode has closed and no reset came for `IDLE_CLOSE`; until then,
and while its episode runs, it stays open for a reset."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from mcp_gateway.sessions import Sessions
from posttrain_common.contracts.episode_calls import EndRequest
from posttrain_env.models import EndReason
from tests.waiting import PROGRESS_S, eventually
from tests.workflows.harness import Episode, running_worker
from workflows.episode.session import IDLE_CLOSE, ResetRequest, ResetResult, SessionWorkflow
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import session_workflow_id

MINUTE = timedelta(minutes=1)


async def status_of(handle: WorkflowHandle) -> WorkflowExecutionStatus | None:
    return (await handle.describe()).status


async def end_and_wait_closed(ep: Episode) -> None:
    """The operator's cancel; the episode's workflow completes once its jobs are final."""
    await ep.handle.signal(EpisodeWorkflow.end_requested, EndRequest(reason=EndReason.cancelled))

    async def completed() -> bool:
        return await status_of(ep.handle) is WorkflowExecutionStatus.COMPLETED

    await eventually(completed, PROGRESS_S, "the cancelled episode's workflow completed")


async def test_a_session_whose_episode_closed_closes_after_the_idle_bound(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        session = await h.session()
        ep = await h.episode(session=session)
        await end_and_wait_closed(ep)
        await ep.skip(IDLE_CLOSE - 5 * MINUTE)
        assert await status_of(session) is WorkflowExecutionStatus.RUNNING  # still resettable
        await ep.skip(10 * MINUTE)

        async def closed() -> bool:
            return await status_of(session) is WorkflowExecutionStatus.COMPLETED

        await eventually(closed, PROGRESS_S, "the idle session closed")
        # What its gateway asks of it still answers: its last episode.
        assert await session.query(SessionWorkflow.current_episode) == ep.episode_id


async def test_a_session_stays_open_while_its_episode_runs_and_after_a_reset(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        session = await h.session()
        ep = await h.episode(session=session)
        await ep.skip(IDLE_CLOSE + 10 * MINUTE)  # the episode runs (its limit is 2 h)
        assert await status_of(session) is WorkflowExecutionStatus.RUNNING
        assert (await ep.status()).done is False

        await end_and_wait_closed(ep)
        await ep.skip(IDLE_CLOSE / 2)
        again = await session.execute_update(
            SessionWorkflow.reset, ResetRequest(task_id="t_test"), result_type=ResetResult
        )
        h.started.append(again.workflow_id)
        # The first idle wait's timer fires unheeded: the new episode runs.
        await ep.skip(IDLE_CLOSE)
        assert await status_of(session) is WorkflowExecutionStatus.RUNNING
        assert await session.query(SessionWorkflow.current_episode) == again.episode_id


async def test_the_gateways_reset_of_a_session_closed_when_idle_starts_it_again(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        sessions = Sessions(h.client, h.task_queue)
        session_id = "a" * 64
        first = await sessions.reset(session_id, "t_test", "r1")
        handle = h.client.get_workflow_handle(session_workflow_id(session_id))
        h.started += [handle.id, first.workflow_id]
        ep = Episode(
            h.env, h.client.get_workflow_handle(first.workflow_id), first.episode_id, first
        )
        await end_and_wait_closed(ep)
        await ep.skip(IDLE_CLOSE + 5 * MINUTE)

        async def closed() -> bool:
            return await status_of(handle) is WorkflowExecutionStatus.COMPLETED

        await eventually(closed, PROGRESS_S, "the idle session closed")
        again = await sessions.reset(session_id, "t_test", "r2")
        h.started.append(again.workflow_id)
        assert again.episode_id != first.episode_id
        assert await status_of(handle) is WorkflowExecutionStatus.RUNNING  # a new run
        assert await sessions.episode_of(session_id, refresh=True) == again.episode_id
