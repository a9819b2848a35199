"""When an episode ends by its clock, how long its run loop sleeps, and when it owes its session
a reply (workflows/episode/timing.py), without Temporal; and the answers and status it builds
from its state (workflows/episode/rules.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from posttrain_common.contracts.episodes import Caps, EpisodeSetup
from posttrain_common.contracts.jobs import JobRole, RepoRef
from posttrain_env.errors import ErrorType
from posttrain_env.models import EndReason, EpisodeEnd, FlavorPrice, JobState, TaskSpec
from tasks.registry import load_task
from workflows.episode.ledger import Ledger
from workflows.episode.rules import already_answered, episode_status, tool_result
from workflows.episode.state import EpisodeCarry, JobRecord
from workflows.episode.timing import (
    MIN_TIMER,
    SessionReply,
    close_needs_announcing,
    next_timer,
    out_of_time,
    reply_is_due,
)

T0 = datetime(2026, 12, 1, tzinfo=UTC)
SESSION = "session-s1"


def setup(time_limit_s: int = 3600, cancel_confirm_s: int = 120) -> EpisodeSetup:
    task = TaskSpec.model_validate(
        {**load_task("t0_artifact").model_dump(), "time_limit_s": time_limit_s}
    )
    return EpisodeSetup(
        episode_id="ep-0000000000000000",
        task=task,
        base_model=RepoRef(repo_id="org/model", revision="a" * 40),
        prices={"cpu-basic": FlavorPrice(name="cpu-basic", micro_usd_per_minute=167)},
        cancel_confirm_s=cancel_confirm_s,
        watcher_workflow_id="w",
        caps=Caps(account_workflow_id="a"),
        session_workflow_id=SESSION,
    )


def carry(*states: JobState, ended: bool = False, submitting: bool = False) -> EpisodeCarry:
    jobs = {
        f"job-{n}": JobRecord(
            job_id=f"job-{n}",
            workflow_id=f"w/{n}",
            role=JobRole.agent,
            flavor="cpu-basic",
            timeout_minutes=5,
            state=state,
            final=state.terminal,
        )
        for n, state in enumerate(states)
    }
    return EpisodeCarry(
        started_at=T0,
        ledger=Ledger(budget_micro_usd=1_000_000),
        jobs=jobs,
        end=EpisodeEnd(reason=EndReason.reset) if ended else None,
        submitting=submitting,
    )


def requested(at: datetime = T0, reply_to: str = SESSION) -> SessionReply:
    reply = SessionReply()
    reply.requested(reply_to, at)
    return reply


def test_the_episode_is_out_of_time_at_its_deadline_unless_a_submit_is_grading() -> None:
    deadline = T0 + timedelta(hours=1)
    assert not out_of_time(setup(), carry(), deadline - timedelta(microseconds=1))
    assert out_of_time(setup(), carry(), deadline)
    assert not out_of_time(setup(), carry(submitting=True), deadline)
    assert not out_of_time(setup(), carry(ended=True), deadline)  # it ends once


def test_before_the_end_the_loop_sleeps_until_the_deadline_and_at_least_a_second() -> None:
    reply = SessionReply()
    assert next_timer(setup(), carry(), reply, T0) == timedelta(hours=1)
    late = T0 + timedelta(hours=2)  # a deadline just passed still wakes the loop once
    assert next_timer(setup(), carry(), reply, late) == MIN_TIMER == timedelta(seconds=1)
    # A submit grading at the deadline finishes and counts: no timer cuts it short.
    assert next_timer(setup(), carry(submitting=True), reply, late) is None
    assert next_timer(setup(), carry(submitting=True), reply, T0) == timedelta(hours=1)


def test_after_an_end_request_the_loop_sleeps_until_the_confirmation_window_closes() -> None:
    ended = carry(JobState.cancelling, ended=True)
    assert next_timer(setup(), ended, SessionReply(), T0) is None  # nobody waits for a reply
    reply = requested(T0)
    assert next_timer(setup(), ended, reply, T0 + timedelta(seconds=20)) == timedelta(seconds=100)
    assert next_timer(setup(), ended, reply, T0 + timedelta(hours=1)) == MIN_TIMER
    reply.replied = True
    assert next_timer(setup(), ended, reply, T0) is None


def test_the_reply_is_due_once_every_job_is_final_or_the_window_has_passed() -> None:
    pending = carry(JobState.cancelling, ended=True)
    reply = requested(T0)
    assert not reply_is_due(setup(), pending, reply, T0 + timedelta(seconds=119))
    assert reply_is_due(setup(), pending, reply, T0 + timedelta(seconds=120))
    assert reply_is_due(setup(), carry(JobState.cancelled, ended=True), reply, T0)
    assert not reply_is_due(setup(), carry(JobState.cancelled), reply, T0)  # not ended yet
    assert not reply_is_due(setup(), carry(ended=True), SessionReply(), T0)  # none asked
    reply.replied = True
    assert not reply_is_due(setup(), carry(ended=True), reply, T0)  # sent once


def test_a_new_end_request_asks_for_a_reply_again() -> None:
    reply = requested(T0)
    reply.replied = True
    reply.requested("session-s2", T0 + timedelta(minutes=1))
    assert (reply.reply_to, reply.requested_at, reply.replied) == (
        "session-s2",
        T0 + timedelta(minutes=1),
        False,
    )


def test_the_close_is_announced_unless_the_reply_already_said_every_job_confirmed() -> None:
    done = carry(JobState.cancelled, ended=True)
    assert close_needs_announcing(setup(), done, SessionReply())
    reply = requested(T0)
    assert close_needs_announcing(setup(), done, reply)  # not replied yet
    reply.replied = True
    assert not close_needs_announcing(setup(), done, reply)
    # The reply named a job that had not confirmed: the session hears again that it closed.
    assert close_needs_announcing(setup(), carry(JobState.cancelling, ended=True), reply)
    # Only a reply to this episode's own session stands for the announcement.
    elsewhere = requested(reply_to="session-other")
    elsewhere.replied = True
    assert close_needs_announcing(setup(), done, elsewhere)
    no_session = setup().model_copy(update={"session_workflow_id": None})
    assert not close_needs_announcing(no_session, done, SessionReply())


def test_an_answer_carries_the_step_metadata_and_the_reward_once_done() -> None:
    live = tool_result(setup(), carry(), "task_info", {"task_id": "t0"}, T0)
    assert (live.done, live.reward, live.metadata.steps_left) == (False, None, 100)
    assert live.metadata.time_left_s == 3600.0
    state = carry()
    state.end = EpisodeEnd(reason=EndReason.submitted, reward=0.5)
    done = tool_result(setup(), state, "submit", {}, T0)
    assert (done.done, done.reward, done.metadata.episode_end) == (True, 0.5, state.end)


def test_the_status_lists_every_job_and_the_cancellations_pending() -> None:
    status = episode_status(setup(), carry(JobState.succeeded, JobState.cancelling), T0)
    assert [job["job_id"] for job in status.jobs] == ["job-0", "job-1"]
    assert status.cancelling == ["job-1"] and status.done is False
    assert status.metadata is not None and status.metadata.steps_left == status.steps_left


def test_a_request_whose_answer_was_dropped_is_refused_and_never_run_again() -> None:
    error = already_answered("r7")
    assert error.type is ErrorType.already_answered and error.details == {"request_id": "r7"}
    assert "not run again" in error.message
