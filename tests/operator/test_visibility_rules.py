"""The operator's search attributes and memo, as pure rules (workflows/operations/visibility.py)."""

from __future__ import annotations

import json
from datetime import timedelta

from pydantic_core import to_json

from posttrain_common.contracts.jobs import JobRole, RepoRef
from posttrain_env.models import EndReason, EpisodeEnd, JobState
from tests.workflows.test_episode_rules import T0, agent, carry, setup
from workflows.job.contract import JobInput
from workflows.job.workflow import job_memo, job_start_attributes
from workflows.operations import search_attributes as sa
from workflows.operations.visibility import (
    MEMO_VALUE_CHARS,
    cancel_pending_since,
    changes,
    episode_attributes,
    episode_memo,
    job_attributes,
)


def test_fourteen_attributes_with_at_most_ten_keywords_as_sql_visibility_allows() -> None:
    names = [key.name for key in sa.SEARCH_ATTRIBUTES]
    assert len(names) == len(set(names)) == 14
    keywords = [k for k in sa.SEARCH_ATTRIBUTES if sa.type_name(k) == "Keyword"]
    assert len(keywords) == 9
    assert sa.type_name(sa.REWARD) == "Double" and sa.type_name(sa.STEPS_USED) == "Int"
    assert sa.type_name(sa.CANCEL_PENDING_SINCE) == "Datetime"
    flags = sa.dev_server_flags()
    assert flags[:2] == ["--search-attribute", "PtTask=Keyword"] and len(flags) == 28


def test_a_running_episode_shows_task_state_and_spend_and_no_reward() -> None:
    s = setup().model_copy(update={"backend": "fake", "deployment": "d1", "campaign_id": "c1"})
    attrs = episode_attributes(s, carry())
    assert attrs[sa.TASK] == "t0_artifact" and attrs[sa.STATE] == "running"
    assert attrs[sa.BACKEND] == "fake" and attrs[sa.DEPLOYMENT] == "d1"
    assert attrs[sa.CAMPAIGN] == "c1"
    assert attrs[sa.REWARD] is None and attrs[sa.END_REASON] is None
    assert attrs[sa.SPEND_MICRO_USD] == 0 and attrs[sa.CANCEL_PENDING_SINCE] is None


def test_an_ended_episode_is_ending_until_closing_then_ended_with_reason_and_reward() -> None:
    c = carry()
    c.end = EpisodeEnd(reason=EndReason.submitted, reward=0.75)
    attrs = episode_attributes(setup(), c)
    assert attrs[sa.STATE] == "ending" and attrs[sa.END_REASON] == "submitted"
    assert attrs[sa.REWARD] == 0.75
    assert episode_attributes(setup(), c, closing=True)[sa.STATE] == "ended"


def test_cancel_pending_since_is_the_oldest_unconfirmed_cancellation() -> None:
    c = carry()
    older, newer, done = (
        agent(JobState.cancelling, "j1"),
        agent(JobState.cancelling, "j2"),
        agent(JobState.cancelled, "j3"),
    )
    older.cancel_requested_at = T0 + timedelta(minutes=1)
    newer.cancel_requested_at = T0 + timedelta(minutes=5)
    done.cancel_requested_at = T0
    done.final = True
    c.jobs = {r.job_id: r for r in (older, newer, done)}
    assert cancel_pending_since(c) == T0 + timedelta(minutes=1)
    older.state, older.final = JobState.cancelled, True
    assert cancel_pending_since(c) == T0 + timedelta(minutes=5)
    newer.state, newer.final = JobState.cancelled, True
    assert cancel_pending_since(c) is None


def test_steps_alone_never_cause_an_upsert_but_ride_along_with_a_change() -> None:
    s, c = setup(), carry()
    shown = episode_attributes(s, c)
    c.steps_used = 7
    assert changes(shown, episode_attributes(s, c)) == []
    c.end = EpisodeEnd(reason=EndReason.max_steps, reward=0.0)
    updates = changes(shown, episode_attributes(s, c))
    names = {u.key.name for u in updates}
    assert names == {"PtState", "PtEndReason", "PtReward", "PtStepsUsed"}


def test_an_attribute_that_becomes_none_is_unset() -> None:
    before = job_attributes(
        state=JobState.cancelling,
        backend_job_id="hf-1",
        cancel_requested_at=T0,
    )
    after = {**before, sa.STATE: "cancelled", sa.CANCEL_PENDING_SINCE: None}
    by_name = {u.key.name: u for u in changes(before, after)}
    assert set(by_name) == {"PtState", "PtCancelPendingSince"}
    assert by_name["PtCancelPendingSince"].value is None
    assert by_name["PtState"].value == "cancelled"


def test_a_terminal_job_shows_no_pending_cancellation() -> None:
    attrs = job_attributes(state=JobState.cancelled, backend_job_id="hf-1", cancel_requested_at=T0)
    assert attrs[sa.CANCEL_PENDING_SINCE] is None and attrs[sa.STATE] == "cancelled"


def job_input(**changed: object) -> JobInput:
    fields: dict[str, object] = {
        "role": JobRole.agent,
        "episode_id": "ep-1",
        "task_id": "t",
        "job_id": "job-1",
        "flavor": "cpu-basic",
        "timeout_s": 60,
        "base_model": RepoRef(repo_id="o/m", revision="a" * 40),
        "parent_workflow_id": "episode-ep-1",
        "watcher_workflow_id": "w",
        "reserved_micro_usd": 10_020,
        **changed,
    }
    return JobInput.model_validate(fields)


def test_a_job_starts_with_its_task_role_flavor_queued_and_its_reservation() -> None:
    attrs = job_start_attributes(job_input())
    assert attrs == {
        sa.TASK: "t",
        sa.ROLE: "agent",
        sa.FLAVOR: "cpu-basic",
        sa.STATE: "queued",
        sa.RESERVED_MICRO_USD: 10_020,
    }
    # Its memo says what it trains on, as the episode's does (issue 45: only its ids before).
    assert job_memo(job_input()) == {
        "job_id": "job-1",
        "episode_id": "ep-1",
        "task_id": "t",
        "base_model": "o/m",
        "base_model_commit": "a" * 40,
    }


def test_a_jobs_reservation_shows_until_it_is_final_then_falls_to_zero_with_its_state() -> None:
    running = job_attributes(
        state=JobState.cancelling,
        backend_job_id="hf-1",
        cancel_requested_at=T0,
        reserved_micro_usd=10_020,
    )
    assert running[sa.RESERVED_MICRO_USD] == 10_020
    final = job_attributes(
        state=JobState.cancelled,
        backend_job_id="hf-1",
        cancel_requested_at=T0,
        reserved_micro_usd=10_020,
    )
    names = {u.key.name for u in changes(running, final)}
    assert names == {"PtState", "PtCancelPendingSince", "PtReservedMicroUsd"}  # one upsert
    # A job recorded before (no reservation in its input) upserts what it always did.
    old = job_start_attributes(job_input(reserved_micro_usd=0))
    done = job_attributes(state=JobState.succeeded, backend_job_id="hf-1", cancel_requested_at=None)
    assert {u.key.name for u in changes(old, {**old, **done})} == {"PtState", "PtBackendJobId"}


def test_a_jobs_memo_of_five_values_stays_under_two_kib_whatever_the_values() -> None:
    long = "\U0001f600" * 500  # four bytes a character in UTF-8, as the data converter writes
    spec = job_input(
        episode_id=long, task_id=long, job_id=long, base_model=RepoRef(repo_id=long, revision=long)
    )
    memo = job_memo(spec)
    assert len(memo) == 5 and {len(v) for v in memo.values()} == {86}  # whole characters
    assert len(to_json(memo)) < sa.MAX_MEMO_BYTES
    # Ids (ASCII) are never cut: a Hub repo id of 96 characters stays whole among five.
    repo = "o" * 40 + "/" + "m" * 55
    memo = job_memo(job_input(base_model=RepoRef(repo_id=repo, revision="a" * 40)))
    assert memo["base_model"] == repo and memo["base_model_commit"] == "a" * 40
    # A lone surrogate has no UTF-8: dropped, where the data converter would fail on it.
    assert job_memo(job_input(task_id="t\ud800x"))["task_id"] == "tx"


def test_the_memo_holds_ids_only_and_stays_under_two_kib_whatever_the_ids() -> None:
    long = "é" * 500  # the worst case: many bytes per character
    s = setup().model_copy(update={"base_model": RepoRef(repo_id=long, revision=long)})
    s = s.model_copy(update={"episode_id": long})
    memo = episode_memo(s)
    assert set(memo) == {"episode_id", "task_id", "base_model", "base_model_commit"}
    assert all(len(v) <= MEMO_VALUE_CHARS for v in memo.values())
    for ascii_only in (True, False):
        assert len(json.dumps(memo, ensure_ascii=ascii_only).encode()) < sa.MAX_MEMO_BYTES
    plain = episode_memo(setup())
    assert plain["base_model_commit"] == "a" * 40 and "prompt" not in json.dumps(plain)
