"""`posttrain-env episodes retry-cancel | confirm-cancelled | end`, run as an operator runs them
against the real dev server (fake backend): each works on the state it is for, refuses the
others with a non-zero exit and a reason, and lands in the episode's audit record."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from temporalio.api.enums.v1 import EventType

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from tests.operator.dev_env import Operated, operated
from tests.operator.test_outside_cancel import audit_record, start_job, status, workflow_status
from tests.waiting import PROGRESS_S, eventually
from workflows.ids import episode_workflow_id, job_workflow_id
from workflows.job.watcher import WatcherWorkflow
from workflows.job.workflow import CANCEL_REISSUE_S

# A job whose cancellation the backend never confirms (a provider that lost the request).
NEVER_CONFIRMED = FakeScenario(
    jobs=[FakeJobScript(role=JobRole.agent, queue_s=0, run_s=3600, cancel_confirm_after_s=None)]
)
PRICE_PER_MINUTE = 167  # cpu-basic in the fake backend's price list


async def cancel_requests(op: Operated, workflow_id: str) -> list[datetime]:
    """When the job's workflow asked the backend to cancel (its cancel_job activities)."""
    times = []
    async for event in op.handle(workflow_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "cancel_job":
                times.append(event.event_time.ToDatetime().replace(tzinfo=UTC))
    return times


async def test_retry_cancel_asks_again_now_and_refuses_when_nothing_is_pending(
    tmp_path: Path,
) -> None:
    async with operated(tmp_path, NEVER_CONFIRMED) as op:
        episode_id, job_id, _ref = await start_job(op)
        nothing = await op.cli("episodes", "retry-cancel", episode_id)
        assert nothing.status == 1 and "no cancellation pending" in nothing.stderr, nothing

        assert (await op.cli("episodes", "end", episode_id, "--reason", "stuck")).status == 0
        job_workflow = job_workflow_id(episode_id, 1)

        async def asked_once() -> bool:
            return len(await cancel_requests(op, job_workflow)) == 1

        await eventually(asked_once, PROGRESS_S, "the end asked the backend to cancel", every_s=0.2)
        retried = await op.cli(
            "episodes", "retry-cancel", episode_id, "--reason", "provider flaky", "--by", "ops-1"
        )
        assert retried.status == 0, retried.stderr
        assert f"asked the backend again to cancel {job_id}" in retried.stdout

        async def asked_twice() -> bool:
            return len(await cancel_requests(op, job_workflow)) == 2

        await eventually(asked_twice, PROGRESS_S, "retry-cancel asked again", every_s=0.2)
        first, second = await cancel_requests(op, job_workflow)
        assert (second - first).total_seconds() < CANCEL_REISSUE_S  # not the backoff's re-issue

        confirmed = await op.cli(
            "episodes", "confirm-cancelled", episode_id, job_id, "--reason", "console: gone"
        )
        assert confirmed.status == 0, confirmed.stderr
        record = await audit_record(op, episode_id)
        actions = [(a["action"], a["by"], a["reason"]) for a in record["operator_actions"]]
        assert actions[1] == ("retry_cancel", "ops-1", "provider flaky")
        assert record["operator_actions"][1]["jobs"] == [job_id]


async def test_confirm_cancelled_settles_at_the_minutes_given_and_closes_the_episode(
    tmp_path: Path,
) -> None:
    async with operated(tmp_path, NEVER_CONFIRMED) as op:
        episode_id, job_id, ref = await start_job(op)
        early = await op.cli(
            "episodes", "confirm-cancelled", episode_id, job_id, "--reason", "too early"
        )
        assert early.status == 1 and "no cancellation was asked" in early.stderr, early
        unknown = await op.cli(
            "episodes", "confirm-cancelled", episode_id, "job-000000000000", "--reason", "x"
        )
        assert unknown.status == 1 and "has no job 'job-000000000000'" in unknown.stderr, unknown
        negative = await op.cli(
            "episodes", "confirm-cancelled", episode_id, job_id, "--reason", "x", "--minutes", "-1"
        )
        assert negative.status == 2 and "--minutes" in negative.stderr, negative
        blank = await op.cli("episodes", "confirm-cancelled", episode_id, job_id, "--reason", " ")
        assert blank.status == 2 and "--reason" in blank.stderr, blank

        assert (await op.cli("episodes", "cancel", episode_id)).status == 0
        confirmed = await op.cli(
            "episodes",
            "confirm-cancelled",
            episode_id,
            job_id,
            "--reason",
            "the provider's console shows it stopped after 3 min",
            "--minutes",
            "3",
            "--by",
            "ops-2",
        )
        assert confirmed.status == 0, confirmed.stderr
        assert "settled at 3 min" in confirmed.stdout

        record = await audit_record(op, episode_id)
        assert record["end"]["reason"] == "cancelled_by_operator"
        (job,) = record["jobs"]
        assert job["final_state"] == "cancelled"
        assert job["settled_micro_usd"] == 3 * PRICE_PER_MINUTE
        assert record["final_spend_micro_usd"] == 3 * PRICE_PER_MINUTE
        cancel, confirm = record["operator_actions"]
        assert cancel["action"] == "end" and "episodes cancel" in cancel["reason"]
        assert confirm == {
            "action": "confirm_cancelled",
            "by": "ops-2",
            "reason": "the provider's console shows it stopped after 3 min",
            "at": confirm["at"],
            "job_id": job_id,
            "minutes": 3,
            "settled_micro_usd": 3 * PRICE_PER_MINUTE,
            "jobs": [],
        }
        s = await status(op, episode_id)
        assert s.service_spend.reserved.usd == 0 and s.service_spend.final is True

        async def closed() -> bool:
            return await workflow_status(op, episode_workflow_id(episode_id)) == "COMPLETED"

        await eventually(
            closed, PROGRESS_S, "the episode closes once its job is confirmed", every_s=0.2
        )
        (view,) = op.backend.views(datetime.now(UTC))
        assert view.ref == ref and not view.state.terminal  # the backend never agreed
        watcher = op.handle(op.watcher_of(episode_id))

        async def unwatched() -> bool:
            return ref not in await watcher.query(WatcherWorkflow.watched)

        await eventually(unwatched, PROGRESS_S, "the watcher forgot the job said gone", every_s=0.2)
        again = await op.cli("episodes", "confirm-cancelled", episode_id, job_id, "--reason", "x")
        assert again.status == 1 and "is closed (completed)" in again.stderr, again


async def test_confirm_cancelled_without_minutes_settles_at_the_worst_case(
    tmp_path: Path,
) -> None:
    async with operated(tmp_path, NEVER_CONFIRMED) as op:
        episode_id, job_id, _ref = await start_job(op)
        assert (await op.cli("episodes", "end", episode_id, "--reason", "stop")).status == 0
        done = await op.cli("episodes", "confirm-cancelled", episode_id, job_id, "--reason", "gone")
        assert done.status == 0, done.stderr
        assert "settled at its worst case" in done.stdout
        record = await audit_record(op, episode_id)
        assert record["jobs"][0]["settled_micro_usd"] == 60 * PRICE_PER_MINUTE  # its timeout


async def test_end_ends_a_running_episode_once_and_refuses_after(tmp_path: Path) -> None:
    async with operated(tmp_path, FakeScenario()) as op:
        episode_id = (await op.reset()).episode_id
        no_reason = await op.cli("episodes", "end", episode_id)
        assert no_reason.status == 2 and "--reason" in no_reason.stderr
        ended = await op.cli("episodes", "end", episode_id, "--reason", "agent misbehaves")
        assert ended.status == 0, ended.stderr
        again = await op.cli("episodes", "end", episode_id, "--reason", "again")
        assert again.status != 0
        assert "ended already" in again.stderr or "is closed" in again.stderr, again
        record = await audit_record(op, episode_id)
        assert record["end"]["reason"] == "cancelled_by_operator"
        assert [a["reason"] for a in record["operator_actions"]] == ["agent misbehaves"]
        missing = await op.cli("episodes", "end", "ep-0000000000000000", "--reason", "x")
        assert missing.status == 1 and "no episode" in missing.stderr
