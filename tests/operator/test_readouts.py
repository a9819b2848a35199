"""What the operator reads is what is true, on the real dev server (issue 26, point 4): a job's
`PtState` says `running` while it runs; the reservation is an attribute and a column, and falls
to 0 at the close; `list --stuck` and `show` agree, and list only open workflows; the time left
is as of now; an export of an `ending` episode has its end and its spend."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from mcp_gateway.episode_calls import call_tool
from mcp_gateway.episode_control import EpisodeControl
from mcp_gateway.sessions import Sessions
from posttrain_common.contracts.episode_calls import EpisodeStatus, ToolCall
from posttrain_common.contracts.jobs import JobRole
from tests.operator.dev_env import Operated, operated
from tests.waiting import PROGRESS_S, eventually
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import episode_workflow_id, job_workflow_id
from workflows.operations import search_attributes as sa

RUNNING = FakeScenario(jobs=[FakeJobScript(role=JobRole.agent, queue_s=3, run_s=3600)])
STUCK = FakeScenario(
    jobs=[
        FakeJobScript(script_contains="QUICK", queue_s=0, run_s=1),
        FakeJobScript(role=JobRole.agent, queue_s=0, run_s=3600, cancel_confirm_after_s=None),
    ]
)


async def submit(op: Operated, episode_id: str, request_id: str, script: str) -> str:
    call = ToolCall(
        request_id=request_id,
        tool="jobs_submit",
        arguments={"script": script, "flavor": "cpu-basic", "timeout_minutes": 60},
        path="mcp",
    )
    result = await call_tool(op.client, episode_id, call)
    assert "error" not in result.data, result.data
    return result.data["job_id"]


async def attribute(op: Operated, workflow_id: str, key: sa.SearchAttributeKey[Any]) -> Any:
    return (await op.handle(workflow_id).describe()).typed_search_attributes.get(key)


async def live(op: Operated, episode_id: str) -> EpisodeStatus:
    return await op.handle(episode_workflow_id(episode_id)).query(EpisodeWorkflow.status)


async def listed_row(op: Operated, episode_id: str, *args: str) -> dict[str, Any] | None:
    done = await op.run("episodes", "list", *args, "--json")
    assert done.status == 0, done.stderr
    rows = [row for row in done.json() if row["episode_id"] == episode_id]
    return rows[0] if rows else None


async def test_a_running_job_shows_running_in_its_state_attribute(tmp_path: Path) -> None:
    async with operated(tmp_path, RUNNING) as op:
        episode_id = (await op.reset()).episode_id
        await submit(op, episode_id, "r1", "print('x')\n")
        job = job_workflow_id(episode_id, 1)
        assert await attribute(op, job, sa.STATE) == "queued"  # the submit saw it queued

        async def running() -> bool:
            return await attribute(op, job, sa.STATE) == "running"

        await eventually(running, PROGRESS_S, "the job's PtState says running", every_s=0.5)
        # The episode heard it too (from the watcher).
        assert [j["state"] for j in (await live(op, episode_id)).jobs] == ["running"]


async def test_the_reservation_is_shown_and_falls_to_zero_at_the_close(tmp_path: Path) -> None:
    async with operated(tmp_path, RUNNING) as op:
        episode_id = (await op.reset()).episode_id
        await submit(op, episode_id, "r1", "print('x')\n")
        reserved = (await live(op, episode_id)).service_spend.reserved.usd
        assert reserved > 0
        workflow_id = episode_workflow_id(episode_id)

        async def shown() -> bool:
            return await attribute(op, workflow_id, sa.RESERVED_MICRO_USD) == round(reserved * 1e6)

        await eventually(
            shown, PROGRESS_S, "PtReservedMicroUsd holds the job's reservation", every_s=0.5
        )
        row = await listed_row(op, episode_id)
        assert row is not None and row["reserved_usd"] == reserved
        table = (await op.run("episodes", "list")).stdout
        header, line = table.splitlines()[:2]
        assert "RESERVED_USD" in header.split() and f"{reserved:.6f}" in line.split()
        shown_json = (await op.run("episodes", "show", episode_id, "--json")).json()
        assert shown_json["reserved_usd"] == reserved
        # What its artifacts keep so far (its job is still running: nothing), and the hold.
        assert shown_json["stored_bytes"] == 0
        storage = shown_json["live"]["service_spend"]["storage"]
        assert storage["reserved_bytes"] > 0 and storage["cap_bytes"] > 0
        shown_text = (await op.run("episodes", "show", episode_id)).stdout
        assert f"held for live jobs, of a cap of {storage['cap_bytes']}" in shown_text

        assert (await op.cli("episodes", "cancel", episode_id)).status == 0

        async def released() -> bool:
            row = await listed_row(op, episode_id, "--state", "ended")
            return row is not None and row["reserved_usd"] == 0.0

        await eventually(
            released, PROGRESS_S, "the ended episode holds no reservation", every_s=0.5
        )
        assert await attribute(op, workflow_id, sa.RESERVED_MICRO_USD) == 0


async def test_stuck_lists_only_open_workflows_and_show_agrees(tmp_path: Path) -> None:
    async with operated(tmp_path, STUCK) as op:
        episode_id = (await op.reset()).episode_id
        await submit(op, episode_id, "r1", "print('stuck')\n")
        assert (await op.cli("episodes", "cancel", episode_id)).status == 0

        async def listed_with_its_job() -> bool:
            row = await listed_row(op, episode_id, "--stuck", "1s")
            return row is not None and len(row["stuck_jobs"]) == 1

        await eventually(
            listed_with_its_job, PROGRESS_S, "the episode is listed as stuck", every_s=0.5
        )
        row = await listed_row(op, episode_id, "--stuck", "1s")
        assert row is not None
        shown = (await op.run("episodes", "show", episode_id, "--json")).json()
        (in_list,) = row["stuck_jobs"]
        (in_show,) = shown["stuck_jobs"]
        assert in_show["workflow_id"] == in_list["workflow_id"] == job_workflow_id(episode_id, 1)
        assert in_show["pending_since"] == in_list["pending_since"] is not None
        assert in_show["backend_job_id"] == in_list["backend_job_id"] is not None
        (job,) = shown["jobs"]
        assert job["cancel_pending_since"] == in_list["pending_since"]

        # Terminated from outside while cancelling: its closed run keeps `cancelling` and its
        # pending-since, but waits on nothing; it is no stuck job any more.
        await op.handle(job_workflow_id(episode_id, 1)).terminate("an operator's terminate")

        async def job_gone() -> bool:
            row = await listed_row(op, episode_id, "--stuck", "1s")
            return row is not None and row["stuck_jobs"] == []

        await eventually(
            job_gone, PROGRESS_S, "the terminated job is not listed as stuck", every_s=0.5
        )
        assert (await op.run("episodes", "show", episode_id, "--json")).json()["stuck_jobs"] == []

        await op.handle(episode_workflow_id(episode_id)).terminate("an operator's terminate")

        async def episode_gone() -> bool:
            return await listed_row(op, episode_id, "--stuck", "1s") is None

        await eventually(
            episode_gone, PROGRESS_S, "a closed episode is not listed as stuck", every_s=0.5
        )
        # Its attributes still say it was cancelling: only the open-run rule keeps it out.
        closed = op.handle(episode_workflow_id(episode_id))
        assert await attribute(op, closed.id, sa.CANCEL_PENDING_SINCE) is not None


async def test_the_time_left_is_as_of_now_not_of_the_last_workflow_task(tmp_path: Path) -> None:
    async with operated(tmp_path, FakeScenario()) as op:
        episode_id = (await op.reset()).episode_id
        before_first = datetime.now(UTC)
        first = (await op.run("episodes", "show", episode_id, "--json")).json()["live"]
        control = EpisodeControl(op.client)  # the gateway's GET /episodes/<id>
        sessions = Sessions(op.client, op.task_queue)  # the gateway's OpenEnv /state

        async def counts_down() -> bool:
            # Nothing happens in the episode meanwhile: no workflow task moves its clock.
            shown = (await op.run("episodes", "show", episode_id, "--json")).json()["live"]
            lefts = [
                shown["time_left_s"],
                (await control.status(episode_id)).time_left_s,
                (await sessions.status(episode_id)).time_left_s,
            ]
            return all(left <= first["time_left_s"] - 2 for left in lefts)

        await eventually(counts_down, PROGRESS_S, "show's time left counts down", every_s=0.5)
        left = (await control.status(episode_id)).time_left_s
        at_most_elapsed = (datetime.now(UTC) - before_first).total_seconds()
        # Counted down by the time that passed between the two reads, no more.
        assert first["time_left_s"] - at_most_elapsed - 0.01 <= left <= first["time_left_s"] - 2
        text = (await op.run("episodes", "show", episode_id)).stdout
        assert f"time left {first['time_left_s']:.0f} s" not in text


async def test_an_export_of_an_ending_episode_has_its_end_and_spend(tmp_path: Path) -> None:
    async with operated(tmp_path, STUCK) as op:
        episode_id = (await op.reset()).episode_id
        await submit(op, episode_id, "r1", "print('QUICK')\n")

        async def settled() -> bool:
            return (await live(op, episode_id)).service_spend.settled.usd > 0

        await eventually(settled, PROGRESS_S, "the quick job settled", every_s=0.5)
        await submit(op, episode_id, "r2", "print('stuck')\n")
        assert (await op.cli("episodes", "cancel", episode_id)).status == 0

        async def ending() -> bool:
            status = await live(op, episode_id)
            return status.done and bool(status.cancelling)

        await eventually(ending, PROGRESS_S, "the episode is ending", every_s=0.5)
        status = await live(op, episode_id)
        done = await op.cli("episodes", "export", episode_id)
        assert done.status == 0, done.stderr
        record = done.json()
        assert record["end"] == {
            "reason": "cancelled_by_operator",
            "reward": None,
            "invalid_score": None,
            "replayed": None,
            "replay_miss": None,
            "replay_misses": None,
        }
        spend = status.service_spend
        assert record["final_spend_micro_usd"] == round(spend.settled.usd * 1e6) > 0
        assert record["reserved_micro_usd"] == round(spend.reserved.usd * 1e6) > 0
