"""The read-outs' pure rules: the reservation attribute, the time left as of the reader's clock,
and what `episodes list` asks Temporal for (workflows/operations/visibility.py,
posttrain_common/contracts/episode_calls.py, posttrain_server/commands/episode_queries.py)."""

from __future__ import annotations

from datetime import timedelta

from posttrain_env.models import EndReason, EpisodeEnd
from posttrain_server.commands.episode_queries import EpisodeFilter, stuck_jobs_query
from tests.workflows.test_episode_rules import CPU, T0, carry, setup
from workflows.episode.rules import episode_status
from workflows.operations import search_attributes as sa
from workflows.operations.visibility import changes, episode_attributes


def test_a_job_start_changes_the_reservation_alone_and_that_is_an_upsert() -> None:
    s, c = setup(), carry()
    shown = episode_attributes(s, c)
    assert shown[sa.RESERVED_MICRO_USD] == 0
    c.ledger.reserve("job-1", "job", CPU, timeout_minutes=5)
    updates = changes(shown, episode_attributes(s, c))
    assert [(u.key.name, u.value) for u in updates] == [("PtReservedMicroUsd", 5 * 167)]


def test_the_time_left_is_counted_from_the_deadline_on_the_readers_clock() -> None:
    s = setup(time_limit_s=600)
    status = episode_status(s, carry(), T0 + timedelta(seconds=10))  # the last task's time
    assert status.time_left_s == 590 and status.deadline == T0 + timedelta(seconds=600)
    later = status.as_of(T0 + timedelta(seconds=100))
    assert later.time_left_s == 500
    assert later.metadata is not None and later.metadata.time_left_s == 500
    assert status.as_of(T0 + timedelta(hours=1)).time_left_s == 0


def test_an_ended_episode_has_no_time_left_and_no_deadline() -> None:
    c = carry()
    c.end = EpisodeEnd(reason=EndReason.cancelled)
    status = episode_status(setup(), c, T0)
    assert status.deadline is None and status.as_of(T0).time_left_s == 0


def test_stuck_means_an_open_workflow_and_no_run_that_continued_as_new_is_an_episode() -> None:
    now = T0 + timedelta(hours=1)
    query = EpisodeFilter(stuck=timedelta(minutes=10)).query(now)
    assert "ExecutionStatus != 'ContinuedAsNew'" in query
    assert "ExecutionStatus = 'Running' AND PtCancelPendingSince < '2026-12-01T00:50:00Z'" in query
    assert EpisodeFilter().query(now).endswith("ExecutionStatus != 'ContinuedAsNew'")
    jobs = stuck_jobs_query(now, timedelta(0))
    assert jobs.startswith("WorkflowType = 'JobWorkflow' AND ExecutionStatus = 'Running' AND ")
