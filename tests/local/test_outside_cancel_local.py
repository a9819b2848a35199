"""On the local backend (real jobs in bubblewrap on this machine) a cancel or terminate through
the Temporal CLI stops the job's processes, settles its money and leaves the record right, as on
the fake backend (tests/operator/test_outside_cancel.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from mcp_gateway.episode_calls import call_tool
from posttrain_common.contracts.episode_calls import ToolCall
from posttrain_env.models import JobState
from tests.operator.dev_env import Operated, operated
from tests.operator.test_outside_cancel import audit_record, status
from tests.waiting import eventually
from workflows.ids import episode_workflow_id, job_workflow_id

SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(3600)\n"
TASK = "t0_artifact"


async def start_sleeper(op: Operated) -> tuple[str, str]:
    """An episode whose one job sleeps for an hour: (episode id, backend ref)."""
    episode_id = (await op.reset(TASK)).episode_id
    call = ToolCall(
        request_id="r1",
        tool="jobs_submit",
        arguments={"script": SLEEPER, "flavor": "cpu-basic", "timeout_minutes": 30},
        path="mcp",
    )
    result = await call_tool(op.client, episode_id, call)
    assert "error" not in result.data, result.data

    async def running() -> bool:
        jobs = (await status(op, episode_id)).jobs
        return jobs[0]["state"] == "running"

    await eventually(running, 120, "the job runs in its sandbox", every_s=0.5)
    record = await op.backend.find_by_key(job_workflow_id(episode_id, 1), datetime.now(UTC))
    assert record is not None and record.state is JobState.running
    return episode_id, record.ref


async def backend_state(op: Operated, ref: str) -> JobState:
    seen = await op.backend.observe([ref], datetime.now(UTC))
    return seen[ref].state


async def test_a_cancelled_job_workflow_stops_the_local_job(tmp_path: Path) -> None:
    async with operated(tmp_path, local=True) as op:
        episode_id, ref = await start_sleeper(op)
        done = await op.temporal(
            "workflow", "cancel", "--workflow-id", job_workflow_id(episode_id, 1)
        )
        assert done.status == 0, done.stderr

        async def settled() -> bool:
            s = await status(op, episode_id)
            return s.jobs[0]["state"] == "cancelled" and s.service_spend.reserved.usd == 0

        await eventually(settled, 120, "the job is cancelled and settled", every_s=0.5)
        assert await backend_state(op, ref) is JobState.cancelled
        assert (await status(op, episode_id)).service_spend.settled.jobs == 1


async def test_a_terminated_episode_on_the_local_backend_is_wound_down(tmp_path: Path) -> None:
    async with operated(tmp_path, local=True, reaper_every_s=3) as op:
        episode_id, ref = await start_sleeper(op)
        done = await op.temporal(
            "workflow",
            "terminate",
            "--workflow-id",
            episode_workflow_id(episode_id),
            "--reason",
            "operator test",
        )
        assert done.status == 0, done.stderr
        record = await audit_record(op, episode_id)
        assert record["end"]["reason"] == "cancelled_by_operator"
        assert record["jobs"][0]["final_state"] == "cancelled"
        assert [a["action"] for a in record["operator_actions"]] == ["wind_down"]
        assert await backend_state(op, ref) is JobState.cancelled
        s = await status(op, episode_id)
        assert s.service_spend.reserved.usd == 0 and s.service_spend.final
