"""The read-outs' pure rules: the reservation attribute, the time left as of the reader's clock,
and what `episodes list` asks Temporal for (workflows/operations/visibility.py,
posttrain_common/contracts/episode_calls.py, posttrain_server/commands/episode_queries.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from posttrain_env.models import EndReason, EpisodeEnd
from posttrain_server.commands.episode_queries import (
    EpisodeFilter,
    FilterError,
    list_link_query,
    stuck_jobs_query,
)
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


def test_the_ui_link_keeps_every_filter_of_the_list() -> None:
    """`episodes list --ui-url`: --stuck alone links the stuck job workflows (their rows show
    the backend job id), with --task too (jobs carry PtTask); a filter only episodes carry
    links the episodes with a cancellation stuck instead of being dropped."""
    now = T0 + timedelta(hours=1)
    stuck = timedelta(minutes=10)
    assert list_link_query(EpisodeFilter(stuck=stuck), now) == stuck_jobs_query(now, stuck)
    of_task = list_link_query(EpisodeFilter(stuck=stuck, task="t0_artifact"), now)
    assert of_task.startswith("WorkflowType = 'JobWorkflow' AND PtTask = 't0_artifact' AND ")
    assert of_task.endswith(stuck_jobs_query(now, stuck).split(" AND ", 1)[1])
    for episode_only in (
        {"campaign": "c-1"},
        {"state": "ending"},
        {"end_reason": "abandoned"},
        {"since": timedelta(days=1)},
    ):
        filters = EpisodeFilter(stuck=stuck, **episode_only)
        assert list_link_query(filters, now) == filters.query(now)
        assert "WorkflowType = 'EpisodeWorkflow'" in filters.query(now)
    plain = EpisodeFilter(task="t0_artifact", state="running")
    assert list_link_query(plain, now) == plain.query(now)
    with pytest.raises(FilterError):
        list_link_query(EpisodeFilter(stuck=stuck, task="x' OR PtTask != '"), now)
