"""An operator's repairs of an episode: when each applies, and what it does to the carry (pure).

`retry_cancel` asks the backend again, now, to cancel every job whose cancellation is not yet
confirmed; `confirm_cancelled` takes the operator's word that a job is gone and settles it (at
its worst case, or at the minutes the operator read on the provider's console); `end` ends a
running episode as an operator's cancel. `refusal` says why a request does not apply (the
update's validator raises it, so a refusal leaves no trace in history).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from posttrain_common.contracts.episodes import EpisodeSetup
from posttrain_common.contracts.jobs import JobRole, LateJob
from posttrain_common.contracts.operator import (
    MAX_OPERATOR_ACTIONS,
    OperatorAction,
    OperatorRequest,
)
from posttrain_env.models import JobState, usd
from workflows.episode.ledger import LedgerKind, Settlement
from workflows.episode.state import EpisodeCarry, JobRecord
from workflows.job.workflow import JobSnapshot

TEMPORAL_CANCEL_REASON = "its workflow was cancelled through Temporal (the UI, CLI or an SDK)"
SESSION_CANCEL_REASON = "its session's workflow was cancelled or terminated through Temporal"
WIND_DOWN_REASON = (
    "its workflow was terminated through Temporal; the reconciler started it again to end it"
)
JOB_TEMPORAL_CANCEL_REASON = (
    "was cancelled through Temporal (the UI, CLI or an SDK); it cancels the job and reports its end"
)
JOB_WIND_DOWN_REASON = (
    "was terminated through Temporal; the reconciler started it again to cancel the job"
)


class WindDown(BaseModel):
    """Given to a run the reconciler starts after the last one was terminated from outside:
    end the episode as an operator's cancel, after taking these reports (the final snapshots of
    job workflows that completed while no run of the episode was there to hear them)."""

    reports: list[JobSnapshot] = Field(default_factory=list)
    previous_run_id: str | None = None  # the terminated run (its record continues here)


def pending_cancellations(carry: EpisodeCarry) -> list[JobRecord]:
    return [r for r in carry.jobs.values() if r.live and r.state is JobState.cancelling]


def refusal(episode_id: str, carry: EpisodeCarry, request: OperatorRequest) -> str | None:
    """Why `request` does not apply to this episode now (None: it does)."""
    if request.action == "retry_cancel":
        if not pending_cancellations(carry):
            live = [f"{r.job_id} ({r.state.value})" for r in carry.jobs.values() if r.live]
            jobs = f"live jobs: {', '.join(live)}" if live else "no job is live"
            return f"episode {episode_id} has no cancellation pending, nothing to retry ({jobs})"
        return None
    if request.action == "confirm_cancelled":
        record = carry.jobs.get(request.job_id or "")
        if record is None:
            known = ", ".join(carry.jobs) or "none"
            return f"episode {episode_id} has no job {request.job_id!r} (its jobs: {known})"
        if record.final:
            cost = record.settlement.cost_micro_usd if record.settlement else 0
            return (
                f"job {record.job_id} is final already ({record.state.value}, settled at "
                f"${usd(cost):.6f}): nothing to confirm"
            )
        if record.state is not JobState.cancelling and carry.end is None:
            return (
                f"job {record.job_id} is {record.state.value} and no cancellation was asked "
                f"for: end the episode first (`posttrain-env episodes end {episode_id}`)"
            )
        return None
    if carry.end is not None:
        return (
            f"episode {episode_id} has ended already ({carry.end.reason.value}); for a job "
            "whose cancellation is stuck use `episodes retry-cancel` or `confirm-cancelled`"
        )
    return None


def confirm_gone(
    carry: EpisodeCarry, record: JobRecord, minutes: int | None, message: str
) -> Settlement | None:
    """Make `record` final as cancelled on the operator's word and settle it: at `minutes` billed
    minutes when given, else at its whole reservation (its real running time is unknown). A
    grader job holds no money and settles nothing."""
    settlement = None
    if record.role is not JobRole.grader and record.job_id in carry.ledger.reservations:
        if minutes is None:
            settlement = carry.ledger.settle_at_reservation(record.job_id)
        else:
            settlement = carry.ledger.settle(record.job_id, minutes * 60)
            record.running_s = float(minutes * 60)
    record.settlement = settlement
    record.state = JobState.cancelled
    record.message = message
    record.final = True
    record.version += 1
    return settlement


def outside_job_action(
    record: JobRecord, snap: JobSnapshot, now: datetime
) -> OperatorAction | None:
    """What the record keeps of a job whose own workflow was cancelled or terminated through
    Temporal, from the first report that says so (its `cancelling`, or its end when it ended
    first), or None: once per job (it marks the record). The verbs of the episode's own
    workflow, with the job named: `temporal_cancel` by "temporal", `wind_down` by "reconciler".
    An operator's `confirm-cancelled` of a cancellation stuck after it comes after it."""
    if snap.outside is None or record.outside_noted:
        return None
    record.outside_noted = True
    if snap.outside == "cancel":
        verb, by = "temporal_cancel", "temporal"
        reason = f"its job's workflow ({record.workflow_id}) {JOB_TEMPORAL_CANCEL_REASON}"
    else:
        verb, by = "wind_down", "reconciler"
        reason = f"its job's workflow ({record.workflow_id}) {JOB_WIND_DOWN_REASON}"
    return OperatorAction(
        action=verb, by=by, reason=reason, at=now, job_id=record.job_id, jobs=[record.job_id]
    )


def remember_action(carry: EpisodeCarry, action: OperatorAction) -> None:
    """Keep `action` for the record; the oldest go past MAX_OPERATOR_ACTIONS."""
    carry.operator_actions.append(action)
    del carry.operator_actions[:-MAX_OPERATOR_ACTIONS]


def action_of(request: OperatorRequest, now: datetime) -> OperatorAction:
    return OperatorAction(
        action=request.action,
        by=request.by,
        reason=request.reason,
        at=now,
        job_id=request.job_id,
        minutes=request.minutes,
    )


def settle_late_job(
    setup: EpisodeSetup, carry: EpisodeCarry, record: JobRecord, late: LateJob
) -> Settlement | None:
    """Charge a stray job of `record` (cancelled by the reaper) at its real running time and
    the job's flavor's price; a grader's holds no money (graders are free to the agent), and a
    flavor without a known price charges nothing (logged by the caller's note)."""
    if record.role is JobRole.grader:
        return None
    price = setup.prices.get(record.flavor)
    if price is None:
        return None
    kind: LedgerKind = "job" if record.role is JobRole.agent else "dev"
    key = f"{record.job_id}+late:{late.ref}"
    return carry.ledger.settle_late(key, kind, price, max(0.0, late.running_s))
