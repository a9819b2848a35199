"""`jobs_status` and the episode's `status` query answer pages of jobs (issue 27): oldest first,
each job once while jobs are added, a cursor from elsewhere refused with a typed error, and a
page of the largest jobs far below the payload limit."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pydantic_core
import pytest
from temporalio.client import WorkflowQueryFailedError
from temporalio.testing import WorkflowEnvironment

from posttrain_common.contracts.episode_calls import JobsPage
from posttrain_env.errors import ToolError
from posttrain_env.limits import (
    DEFAULT_JOBS_PAGE,
    KIB,
    MAX_JOBS_PAGE,
    MAX_JOBS_PER_EPISODE,
    MAX_MESSAGE_CHARS,
)
from tests.workflows.harness import running_worker, write_task
from tests.workflows.largest import largest_episode
from workflows.episode.paging import cursor_at, page_of
from workflows.episode.rules import episode_status, job_view, tool_result
from workflows.episode.workflow import EpisodeWorkflow

# The target: no payload above this.
PAYLOAD_BUDGET = 512 * KIB
NOW = datetime(2026, 1, 1, tzinfo=UTC)


# -- the pages, pure ---------------------------------------------------------------------------


def test_pages_list_each_item_once_in_order_while_items_are_added() -> None:
    items = list(range(4))
    first = page_of("ep-1", "agent", items, None, 3)
    assert first.items == [0, 1, 2] and first.total == 4 and first.next_cursor is not None
    items += [4, 5, 6]  # started between two pages
    second = page_of("ep-1", "agent", items, first.next_cursor, 3)
    assert second.items == [3, 4, 5] and second.total == 7
    last = page_of("ep-1", "agent", items, second.next_cursor, 3)
    assert last.items == [6] and last.next_cursor is None
    assert page_of("ep-1", "agent", [], None, 3).next_cursor is None
    exact = page_of("ep-1", "agent", [0, 1, 2], None, 3)
    assert exact.items == [0, 1, 2] and exact.next_cursor is None


@pytest.mark.parametrize(
    "cursor, why",
    [
        ("not a cursor!", "not a cursor this server gives"),
        ("", "not a cursor this server gives"),
        ("é", "not a cursor this server gives"),
        (cursor_at("ep-other", "agent", 1), "not given by this episode"),
        (cursor_at("ep-1", "all", 1), "not given by this episode for this list"),
        (cursor_at("ep-1", "agent", 3), "points past this episode's jobs"),
    ],
)
def test_a_cursor_not_given_here_is_a_typed_invalid_argument(cursor: str, why: str) -> None:
    with pytest.raises(ToolError) as raised:
        page_of("ep-1", "agent", [0, 1], cursor, 3)
    assert raised.value.type.value == "invalid_argument"
    assert why in raised.value.message and raised.value.details["field"] == "cursor"


def test_an_altered_cursor_position_is_refused() -> None:
    import base64

    good = cursor_at("ep-1", "agent", 1)
    raw = base64.urlsafe_b64decode(good + "=" * (-len(good) % 4)).decode()
    forged = raw.replace(":1:", ":0:", 1)
    altered = base64.urlsafe_b64encode(forged.encode()).decode().rstrip("=")
    with pytest.raises(ToolError, match="not given by this episode"):
        page_of("ep-1", "agent", [0, 1, 2], altered, 3)


# -- at the limit: the largest jobs, the most of them ----------------------------------------------


def test_a_page_of_the_largest_jobs_is_far_below_the_payload_limit() -> None:
    setup, carry = largest_episode()
    assert len(carry.jobs) == MAX_JOBS_PER_EPISODE
    views = [job_view(setup.episode_id, r, NOW) for r in carry.jobs.values()]
    assert all(len(v.message) == MAX_MESSAGE_CHARS for v in views)
    page = page_of(setup.episode_id, "agent", views, None, MAX_JOBS_PAGE)
    data = {
        "jobs": [v.model_dump(mode="json") for v in page.items],
        "total": page.total,
        "next_cursor": page.next_cursor,
    }
    answer = tool_result(setup, carry, "jobs_status", data, NOW)
    size = len(pydantic_core.to_json(answer))
    print(f"jobs_status page of {MAX_JOBS_PAGE} largest jobs: {size} bytes")
    assert size <= PAYLOAD_BUDGET


def test_the_status_query_of_the_fullest_episode_is_bounded_and_pages_through_every_job() -> None:
    setup, carry = largest_episode()
    seen: list[str] = []
    cursor: str | None = None
    largest = 0
    while True:
        status = episode_status(setup, carry, NOW, JobsPage(cursor=cursor, limit=MAX_JOBS_PAGE))
        largest = max(largest, len(pydantic_core.to_json(status)))
        assert status.jobs_total == MAX_JOBS_PER_EPISODE
        seen += [job["job_id"] for job in status.jobs]
        cursor = status.jobs_next_cursor
        if cursor is None:
            break
    assert seen == list(carry.jobs)  # every job once, in the order they started
    # Without a page: the first DEFAULT_JOBS_PAGE jobs, as an old caller asks.
    assert len(episode_status(setup, carry, NOW).jobs) == DEFAULT_JOBS_PAGE
    print(f"status query, fullest episode, largest page: {largest} bytes")
    assert largest <= PAYLOAD_BUDGET


# -- through the episode -----------------------------------------------------------------------


async def test_jobs_status_pages_the_agents_jobs_as_they_are_added(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        write_task(tmp_path / "tasks", "t_many", budget_usd=10.0, max_concurrent_jobs=8)
        ep = await h.episode("t_many")
        other = await h.episode("t_many")
        started = [await ep.submit_job() for _ in range(4)]
        first = (await ep.call("jobs_status", limit=3)).data
        assert [j["job_id"] for j in first["jobs"]] == started[:3] and first["total"] == 4
        started += [await ep.submit_job() for _ in range(3)]
        second = (await ep.call("jobs_status", limit=3, cursor=first["next_cursor"])).data
        assert [j["job_id"] for j in second["jobs"]] == started[3:6] and second["total"] == 7
        last = (await ep.call("jobs_status", limit=3, cursor=second["next_cursor"])).data
        assert [j["job_id"] for j in last["jobs"]] == started[6:] and last["next_cursor"] is None
        # The default page holds them all here; a single job is answered as before.
        everything = (await ep.call("jobs_status")).data
        assert [j["job_id"] for j in everything["jobs"]] == started
        assert (await ep.call("jobs_status", job_id=started[0])).data["job_id"] == started[0]

        foreign = (await other.call("jobs_status", cursor=first["next_cursor"])).data["error"]
        assert foreign["type"] == "invalid_argument" and foreign["field"] == "cursor"
        assert "not given by this episode" in foreign["message"]
        garbled = (await ep.call("jobs_status", cursor="???")).data["error"]
        assert garbled["type"] == "invalid_argument" and "cursor" in garbled["message"]
        both = (await ep.call("jobs_status", job_id=started[0], cursor=first["next_cursor"])).data
        assert both["error"]["type"] == "invalid_argument"
        assert "either job_id" in both["error"]["message"]
        too_many = (await ep.call("jobs_status", limit=MAX_JOBS_PAGE + 1)).data["error"]
        assert too_many["type"] == "invalid_argument" and too_many["field"] == "limit"

        # The status query pages every job the same way (evaluations included).
        status = await ep.handle.query(EpisodeWorkflow.status, JobsPage(limit=5))
        assert [j["job_id"] for j in status.jobs] == started[:5] and status.jobs_total == 7
        rest = await ep.handle.query(
            EpisodeWorkflow.status, JobsPage(cursor=status.jobs_next_cursor, limit=5)
        )
        assert [j["job_id"] for j in rest.jobs] == started[5:] and rest.jobs_next_cursor is None
        assert [j["job_id"] for j in (await ep.status()).jobs] == started  # no page: the first
        with pytest.raises(WorkflowQueryFailedError, match="cursor"):
            await ep.handle.query(EpisodeWorkflow.status, JobsPage(cursor=first["next_cursor"]))
