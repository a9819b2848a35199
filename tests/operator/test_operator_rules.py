"""An operator's repairs as pure rules (workflows/episode/operator.py) and the limits of what
they take (posttrain_common/contracts/operator.py): when each applies, what it settles, and how
much of it an episode keeps."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from posttrain_common.contracts.jobs import JobRole
from posttrain_common.contracts.operator import (
    MAX_BY_CHARS,
    MAX_CONFIRMED_MINUTES,
    MAX_OPERATOR_ACTIONS,
    MAX_REASON_CHARS,
    OperatorAction,
    OperatorRequest,
)
from posttrain_env.models import EndReason, EpisodeEnd, FlavorPrice, JobState
from workflows.episode.ledger import Ledger
from workflows.episode.operator import confirm_gone, refusal, remember_action
from workflows.episode.state import EpisodeCarry, JobRecord

NOW = datetime(2026, 12, 3, tzinfo=UTC)
PRICE = FlavorPrice(name="cpu-basic", micro_usd_per_minute=100)


def carry_with_job(state: JobState, role: JobRole = JobRole.agent) -> EpisodeCarry:
    carry = EpisodeCarry(started_at=NOW, ledger=Ledger(budget_micro_usd=1_000_000))
    if role is not JobRole.grader:
        carry.ledger.reserve("job-1", "job", PRICE, 30)
    carry.jobs["job-1"] = JobRecord(
        job_id="job-1",
        workflow_id="episode-ep/job/1",
        role=role,
        flavor="cpu-basic",
        timeout_minutes=30,
        reserved_micro_usd=3000 if role is not JobRole.grader else 0,
        state=state,
    )
    return carry


def request(action: str, **fields: object) -> OperatorRequest:
    return OperatorRequest.model_validate(
        {"action": action, "by": "ops", "reason": "checked", **fields}
    )


def test_each_repair_applies_only_to_its_state() -> None:
    running = carry_with_job(JobState.running)
    cancelling = carry_with_job(JobState.cancelling)
    ended = carry_with_job(JobState.running)
    ended.end = EpisodeEnd(reason=EndReason.cancelled_by_operator, reward=None)

    assert "no cancellation pending" in (refusal("ep", running, request("retry_cancel")) or "")
    assert refusal("ep", cancelling, request("retry_cancel")) is None

    confirm = request("confirm_cancelled", job_id="job-1")
    assert "no cancellation was asked" in (refusal("ep", running, confirm) or "")
    assert refusal("ep", cancelling, confirm) is None
    assert refusal("ep", ended, confirm) is None  # a live job of an ended episode
    unknown = request("confirm_cancelled", job_id="job-9")
    assert "has no job 'job-9'" in (refusal("ep", cancelling, unknown) or "")

    assert refusal("ep", running, request("end")) is None
    assert "has ended already" in (refusal("ep", ended, request("end")) or "")


def test_confirming_settles_at_the_minutes_given_or_else_the_worst_case_and_once() -> None:
    carry = carry_with_job(JobState.cancelling)
    record = carry.jobs["job-1"]
    settlement = confirm_gone(carry, record, 3, "gone")
    assert settlement is not None and settlement.cost_micro_usd == 300
    assert record.final and record.state is JobState.cancelled and record.running_s == 180
    assert carry.ledger.reserved_micro_usd == 0 and carry.ledger.settled_micro_usd == 300
    assert "is final already" in (
        refusal("ep", carry, request("confirm_cancelled", job_id="job-1")) or ""
    )

    worst = carry_with_job(JobState.cancelling)
    settled = confirm_gone(worst, worst.jobs["job-1"], None, "gone")
    assert settled is not None and settled.worst_case and settled.cost_micro_usd == 3000

    grader = carry_with_job(JobState.cancelling, JobRole.grader)
    assert confirm_gone(grader, grader.jobs["job-1"], None, "gone") is None
    assert grader.ledger.settled_micro_usd == 0 and grader.jobs["job-1"].final


def test_a_request_outside_its_limits_is_refused_before_it_is_sent() -> None:
    for fields, where in (
        ({"reason": " "}, "reason"),
        ({"reason": "x" * (MAX_REASON_CHARS + 1)}, "reason"),
        ({"by": "y" * (MAX_BY_CHARS + 1)}, "by"),
        ({"minutes": -1}, "minutes"),
        ({"minutes": MAX_CONFIRMED_MINUTES + 1}, "minutes"),
        ({"action": "delete"}, "action"),
    ):
        with pytest.raises(ValidationError) as err:
            OperatorRequest.model_validate(
                {"action": "confirm_cancelled", "by": "ops", "reason": "ok", **fields}
            )
        assert err.value.errors()[0]["loc"] == (where,)
    at_limit = request("confirm_cancelled", minutes=MAX_CONFIRMED_MINUTES, reason="r" * 500)
    assert at_limit.minutes == MAX_CONFIRMED_MINUTES


def test_an_episode_keeps_its_latest_actions_only() -> None:
    carry = carry_with_job(JobState.running)
    for n in range(MAX_OPERATOR_ACTIONS + 5):
        action = OperatorAction(action="retry_cancel", by="ops", reason=f"#{n}", at=NOW)
        remember_action(carry, action)
    kept = [a.reason for a in carry.operator_actions]
    assert (
        len(kept) == MAX_OPERATOR_ACTIONS
        and kept[0] == "#5"
        and kept[-1] == f"#{MAX_OPERATOR_ACTIONS + 4}"
    )
