"""When the episode ends by its clock, when its run loop wakes, and when it tells its session
(pure: tested without Temporal, as the ledger is).

Until the end the loop sleeps until the deadline; a submit grading at the deadline still counts,
so its wait has no timer. A session's end request asks for a reply: it is sent once every job is
final, or when `cancel_confirm_s` has passed without it (naming the jobs that did not confirm).
No clock here: `now` is passed in (the workflow's time).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from posttrain_common.contracts.episodes import EpisodeSetup
from workflows.episode.rules import all_final, deadline, unconfirmed
from workflows.episode.state import EpisodeCarry

# No timer shorter than this: a deadline that has just passed still wakes the loop once.
MIN_TIMER = timedelta(seconds=1)


@dataclass
class SessionReply:
    """A session's end request waiting for its reply. Held by the run, not carried through
    continue-as-new."""

    reply_to: str | None = None
    requested_at: datetime | None = None
    replied: bool = False

    def requested(self, reply_to: str, now: datetime) -> None:
        self.reply_to, self.requested_at, self.replied = reply_to, now, False


def out_of_time(setup: EpisodeSetup, carry: EpisodeCarry, now: datetime) -> bool:
    """The deadline has passed and nothing holds the end back (a grading submit does)."""
    return carry.end is None and now >= deadline(setup, carry) and not carry.submitting


def _reply_due_at(setup: EpisodeSetup, reply: SessionReply) -> datetime | None:
    if reply.requested_at is None:
        return None
    return reply.requested_at + timedelta(seconds=setup.cancel_confirm_s)


def next_timer(
    setup: EpisodeSetup, carry: EpisodeCarry, reply: SessionReply, now: datetime
) -> timedelta | None:
    """How long the run loop sleeps at most (None: until something happens)."""
    if carry.end is None:
        if carry.submitting and now >= deadline(setup, carry):
            return None  # a submit in flight at the deadline finishes and counts
        return max(deadline(setup, carry) - now, MIN_TIMER)
    due = _reply_due_at(setup, reply)
    if reply.reply_to and not reply.replied and due is not None:
        return max(due - now, MIN_TIMER)
    return None


def reply_is_due(
    setup: EpisodeSetup, carry: EpisodeCarry, reply: SessionReply, now: datetime
) -> bool:
    """The ended episode owes its session the reply: every job is final, or the confirmation
    window has passed."""
    if reply.reply_to is None or reply.replied or carry.end is None:
        return False
    due = _reply_due_at(setup, reply)
    return all_final(carry) or (due is not None and now >= due)


def close_needs_announcing(setup: EpisodeSetup, carry: EpisodeCarry, reply: SessionReply) -> bool:
    """The session must still hear that the episode closed (so it never signals a completed
    run): it has one, and no reply already told it that every job confirmed."""
    session = setup.session_workflow_id
    if session is None:
        return False
    return not (reply.reply_to == session and reply.replied and not unconfirmed(carry))
