"""A cancel or terminate of our workflows through the Temporal CLI, as an operator would type it,
on the real dev server with the fake backend: no job is left running on the backend, no money
is left reserved, and the episode's audit record says what happened."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from activities.records.audit import record_path
from mcp_gateway.episode_calls import call_tool
from posttrain_common.contracts.episode_calls import EpisodeStatus, ToolCall
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.models import JobState
from tests.operator.dev_env import Operated, operated
from tests.waiting import PROGRESS_S, eventually
from workflows.episode.session import SessionWorkflow
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import (
    account_workflow_id,
    episode_workflow_id,
    job_workflow_id,
)
from workflows.job.watcher import WatcherWorkflow
from workflows.operations import search_attributes as sa
from workflows.operations.account import AccountWorkflow

# A job that runs for an hour unless cancelled; its cancellation is confirmed 2 s after asked.
LONG = FakeScenario(
    jobs=[FakeJobScript(role=JobRole.agent, queue_s=0, run_s=3600, cancel_confirm_after_s=2)]
)
# The reconciler's period in these tests: a terminated workflow is wound down within it.
PERIOD_S = 3.0


async def start_job(op: Operated) -> tuple[str, str, str]:
    """An episode with one running job: (episode id, job id, backend ref)."""
    episode_id = (await op.reset()).episode_id
    call = ToolCall(
        request_id="r1",
        tool="jobs_submit",
        arguments={"script": "print('x')\n", "flavor": "cpu-basic", "timeout_minutes": 60},
        path="mcp",
    )
    result = await call_tool(op.client, episode_id, call)
    assert "error" not in result.data, result.data
    job_id = result.data["job_id"]
    key = job_workflow_id(episode_id, 1)

    async def running() -> bool:
        views = [v for v in op.backend.views(datetime.now(UTC)) if v.key == key]
        return bool(views) and views[0].state is JobState.running

    await eventually(running, PROGRESS_S, "the job runs on the backend", every_s=0.2)
    (view,) = [v for v in op.backend.views(datetime.now(UTC)) if v.key == key]
    return episode_id, job_id, view.ref


async def status(op: Operated, episode_id: str) -> EpisodeStatus:
    handle = op.client.get_workflow_handle_for(EpisodeWorkflow.run, episode_workflow_id(episode_id))
    return await handle.query(EpisodeWorkflow.status)


def backend_state(op: Operated, ref: str) -> JobState:
    (job,) = [j for j in op.backend.views(datetime.now(UTC)) if j.ref == ref]
    return job.state


async def audit_record(op: Operated, episode_id: str) -> dict[str, Any]:
    path = record_path(op.state_dir / "audit", episode_id)
    await eventually(lambda: path.exists(), PROGRESS_S, "the audit record is written", every_s=0.2)
    return json.loads(path.read_text())


async def workflow_status(op: Operated, workflow_id: str) -> str:
    described = await op.handle(workflow_id).describe()
    assert described.status is not None
    return described.status.name


async def test_cancelling_a_job_workflow_cancels_its_backend_job_and_settles_it(
    tmp_path: Path,
) -> None:
    async with operated(tmp_path, LONG) as op:
        episode_id, job_id, ref = await start_job(op)
        job_workflow = job_workflow_id(episode_id, 1)
        # The job's row, before: its reservation (60 min of cpu-basic) and what it trains on.
        described = await op.handle(job_workflow).describe()
        assert described.typed_search_attributes.get(sa.RESERVED_MICRO_USD) == 60 * 167
        memo = await described.memo()
        assert memo["task_id"] == "t_test" and memo["job_id"] == job_id
        episode_memo = await (await op.handle(episode_workflow_id(episode_id)).describe()).memo()
        assert len(memo["base_model_commit"]) == 40
        assert (memo["base_model"], memo["base_model_commit"]) == (
            episode_memo["base_model"],
            episode_memo["base_model_commit"],
        )

        done = await op.temporal("workflow", "cancel", "--workflow-id", job_workflow)
        assert done.status == 0, done.stderr

        async def settled() -> bool:
            s = await status(op, episode_id)
            (job,) = s.jobs
            return job["state"] == "cancelled" and s.service_spend.reserved.usd == 0

        await eventually(settled, PROGRESS_S, "the episode settled the cancelled job", every_s=0.5)
        assert backend_state(op, ref) is JobState.cancelled
        assert await workflow_status(op, job_workflow) == "COMPLETED"
        s = await status(op, episode_id)
        assert s.end is None  # the episode goes on: only that job was cancelled
        assert s.service_spend.settled.jobs == 1 and s.service_spend.settled.usd > 0
        (job,) = s.jobs
        assert "cancelled from outside" in job["message"]

        final = (await op.handle(job_workflow).describe()).typed_search_attributes
        assert final.get(sa.RESERVED_MICRO_USD) == 0 and final.get(sa.STATE) == "cancelled"

        ended = await op.cli("episodes", "end", episode_id, "--reason", "test over")
        assert ended.status == 0, ended.stderr
        record = await audit_record(op, episode_id)
        (audited,) = record["jobs"]
        assert audited["final_state"] == "cancelled" and audited["settled_micro_usd"] > 0
        assert record["end"]["reason"] == "cancelled_by_operator"
        # The job's cancel through Temporal is on the episode's record too (issue 45).
        cancel, end = record["operator_actions"]
        assert (cancel["action"], cancel["by"], cancel["job_id"]) == (
            "temporal_cancel",
            "temporal",
            job_id,
        )
        assert cancel["jobs"] == [job_id] and job_workflow in cancel["reason"]
        assert cancel["at"] < end["at"]  # when the episode heard of it, before the end
        assert end["action"] == "end"


async def test_a_job_cancelled_through_temporal_and_never_confirmed_is_on_the_record(
    tmp_path: Path,
) -> None:
    """The runbook's stuck cancellation, started from the UI: the cancel is on the episode's
    record from the job's first report of it, so the operator's confirm follows it there."""
    stuck = FakeScenario(
        jobs=[FakeJobScript(role=JobRole.agent, queue_s=0, run_s=3600, cancel_confirm_after_s=None)]
    )
    async with operated(tmp_path, stuck) as op:
        episode_id, job_id, _ref = await start_job(op)
        job_workflow = job_workflow_id(episode_id, 1)
        done = await op.temporal("workflow", "cancel", "--workflow-id", job_workflow)
        assert done.status == 0, done.stderr

        async def cancelling() -> bool:
            return (await status(op, episode_id)).jobs[0]["state"] == "cancelling"

        await eventually(cancelling, PROGRESS_S, "the episode sees the job cancelling", every_s=0.5)
        confirmed = await op.cli(
            "episodes", "confirm-cancelled", episode_id, job_id, "--reason", "gone on the console"
        )
        assert confirmed.status == 0, confirmed.stderr
        ended = await op.cli("episodes", "end", episode_id, "--reason", "test over")
        assert ended.status == 0, ended.stderr
        record = await audit_record(op, episode_id)
        actions = [(a["action"], a["by"], a["job_id"]) for a in record["operator_actions"]]
        assert actions[0] == ("temporal_cancel", "temporal", job_id)
        assert [a for a, _by, _job in actions[1:]] == ["confirm_cancelled", "end"]


async def test_cancelling_an_episode_workflow_ends_it_as_an_operator_would(
    tmp_path: Path,
) -> None:
    async with operated(tmp_path, LONG) as op:
        episode_id, job_id, ref = await start_job(op)
        workflow_id = episode_workflow_id(episode_id)

        done = await op.temporal("workflow", "cancel", "--workflow-id", workflow_id)
        assert done.status == 0, done.stderr

        record = await audit_record(op, episode_id)
        assert record["end"] == {
            "reason": "cancelled_by_operator",
            "reward": None,
            "invalid_score": None,
            "replayed": None,
            "replay_miss": None,
            "replay_misses": None,
        }
        (action,) = record["operator_actions"]
        assert action["action"] == "temporal_cancel" and action["jobs"] == [job_id]
        assert record["jobs"][0]["final_state"] == "cancelled"
        assert record["final_spend_micro_usd"] == record["jobs"][0]["settled_micro_usd"] > 0
        assert backend_state(op, ref) is JobState.cancelled

        async def closed() -> bool:
            return await workflow_status(op, workflow_id) == "COMPLETED"

        await eventually(closed, PROGRESS_S, "the episode's workflow closes", every_s=0.2)
        s = await status(op, episode_id)  # a closed episode still answers its status
        assert s.service_spend.reserved.usd == 0 and s.service_spend.final is True
        listed = (await op.run("episodes", "list", "--state", "ended", "--json")).json()
        assert [row["episode_id"] for row in listed] == [episode_id]


async def test_a_terminated_job_workflow_is_wound_down_by_the_reconciler(tmp_path: Path) -> None:
    async with operated(tmp_path, LONG, reaper_every_s=PERIOD_S) as op:
        episode_id, job_id, ref = await start_job(op)
        job_workflow = job_workflow_id(episode_id, 1)

        done = await op.temporal(
            "workflow", "terminate", "--workflow-id", job_workflow, "--reason", "operator test"
        )
        assert done.status == 0, done.stderr
        assert backend_state(op, ref) is JobState.running  # a terminated workflow runs no code

        async def settled() -> bool:
            s = await status(op, episode_id)
            return s.jobs[0]["state"] == "cancelled" and s.service_spend.reserved.usd == 0

        await eventually(settled, PROGRESS_S, "the reconciler wound the job down", every_s=0.5)
        assert backend_state(op, ref) is JobState.cancelled

        async def new_run_completed() -> bool:
            # The new run ends just after it told the episode (a moment later under load).
            return await workflow_status(op, job_workflow) == "COMPLETED"

        await eventually(new_run_completed, PROGRESS_S, "the job workflow's new run completed")
        assert "terminated from outside" in (await status(op, episode_id)).jobs[0]["message"]
        ended = await op.cli("episodes", "end", episode_id, "--reason", "test over")
        assert ended.status == 0, ended.stderr
        record = await audit_record(op, episode_id)
        wound, _end = record["operator_actions"]
        assert (wound["action"], wound["by"], wound["job_id"]) == (
            "wind_down",
            "reconciler",
            job_id,
        )
        assert job_workflow in wound["reason"] and "terminated" in wound["reason"]


async def test_a_terminated_episode_is_ended_by_the_reconciler_and_its_jobs_cancelled(
    tmp_path: Path,
) -> None:
    async with operated(tmp_path, LONG, reaper_every_s=PERIOD_S) as op:
        episode_id, job_id, ref = await start_job(op)
        workflow_id = episode_workflow_id(episode_id)

        done = await op.temporal(
            "workflow", "terminate", "--workflow-id", workflow_id, "--reason", "operator test"
        )
        assert done.status == 0, done.stderr

        record = await audit_record(op, episode_id)
        assert record["end"]["reason"] == "cancelled_by_operator"
        (action,) = record["operator_actions"]
        assert action["action"] == "wind_down" and action["by"] == "reconciler"
        assert action["jobs"] == [job_id]
        assert backend_state(op, ref) is JobState.cancelled
        s = await status(op, episode_id)
        assert s.service_spend.reserved.usd == 0 and s.service_spend.final is True
        assert record["final_spend_micro_usd"] > 0


async def test_an_episode_and_its_job_both_terminated_are_both_wound_down(
    tmp_path: Path,
) -> None:
    async with operated(tmp_path, LONG, reaper_every_s=PERIOD_S) as op:
        episode_id, job_id, ref = await start_job(op)
        for workflow_id in (job_workflow_id(episode_id, 1), episode_workflow_id(episode_id)):
            done = await op.temporal(
                "workflow", "terminate", "--workflow-id", workflow_id, "--reason", "both"
            )
            assert done.status == 0, done.stderr

        record = await audit_record(op, episode_id)
        assert record["jobs"][0]["final_state"] == "cancelled"
        assert backend_state(op, ref) is JobState.cancelled
        s = await status(op, episode_id)
        assert s.service_spend.reserved.usd == 0 and s.service_spend.final is True
        # Both wind-downs are on the record, in whichever order the reconciler found them.
        actions = {(a["action"], a["by"], a["job_id"]) for a in record["operator_actions"]}
        assert actions == {("wind_down", "reconciler", None), ("wind_down", "reconciler", job_id)}


async def test_a_terminated_watcher_hands_its_jobs_to_the_next_one(tmp_path: Path) -> None:
    async with operated(tmp_path, LONG, reaper_every_s=PERIOD_S) as op:
        episode_id, _job_id, ref = await start_job(op)
        watcher_id = op.watcher_of(episode_id)
        done = await op.temporal(
            "workflow", "terminate", "--workflow-id", watcher_id, "--reason", "operator test"
        )
        assert done.status == 0, done.stderr

        async def watched_again() -> bool:
            if await workflow_status(op, watcher_id) != "RUNNING":
                return False
            return ref in await op.handle(watcher_id).query(WatcherWorkflow.watched)

        await eventually(watched_again, PROGRESS_S, "a new watcher follows the job", every_s=0.5)
        ended = await op.cli("episodes", "end", episode_id, "--reason", "watched again")
        assert ended.status == 0, ended.stderr
        record = await audit_record(op, episode_id)  # the cancellation was seen through
        assert record["jobs"][0]["final_state"] == "cancelled"


async def test_a_terminated_account_hands_its_live_episodes_to_the_next_one(
    tmp_path: Path,
) -> None:
    async with operated(tmp_path, LONG, reaper_every_s=PERIOD_S, max_live_episodes=5) as op:
        episode_id = (await op.reset()).episode_id
        account_id = account_workflow_id(op.client.namespace, op.task_queue)
        assert episode_id in await op.handle(account_id).query(AccountWorkflow.live)
        done = await op.temporal(
            "workflow", "terminate", "--workflow-id", account_id, "--reason", "operator test"
        )
        assert done.status == 0, done.stderr

        async def counted_again() -> bool:
            if await workflow_status(op, account_id) != "RUNNING":
                return False
            return episode_id in await op.handle(account_id).query(AccountWorkflow.live)

        await eventually(
            counted_again, PROGRESS_S, "the next account counts the episode", every_s=0.5
        )


async def session_of(op: Operated, episode_id: str) -> str:
    """The workflow id of the session whose current episode this is."""
    query = "WorkflowType = 'SessionWorkflow' AND ExecutionStatus = 'Running'"
    async for execution in op.client.list_workflows(query):
        handle = op.handle(execution.id)
        if await handle.query(SessionWorkflow.current_episode) == episode_id:
            return execution.id
    raise AssertionError(f"no running session holds {episode_id}")


async def test_a_cancelled_or_terminated_session_ends_its_episode(tmp_path: Path) -> None:
    async with operated(tmp_path, LONG, reaper_every_s=PERIOD_S) as op:
        for verb in ("cancel", "terminate"):
            episode_id, job_id, ref = await start_job(op)
            session = await session_of(op, episode_id)
            args = ["--reason", "operator test"] if verb == "terminate" else []
            done = await op.temporal("workflow", verb, "--workflow-id", session, *args)
            assert done.status == 0, done.stderr

            record = await audit_record(op, episode_id)
            assert record["end"]["reason"] == "cancelled_by_operator", verb
            (action,) = record["operator_actions"]
            assert action["action"] == "temporal_cancel" and action["jobs"] == [job_id]
            assert backend_state(op, ref) is JobState.cancelled
            s = await status(op, episode_id)
            assert s.service_spend.reserved.usd == 0 and s.service_spend.final
