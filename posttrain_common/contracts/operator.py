"""What an operator may do to an episode, and what the episode keeps of it (pure).

`posttrain-env episodes retry-cancel | confirm-cancelled | end` send an `OperatorRequest` as the
episode's `operator_action` update; an outside cancel or terminate through Temporal is recorded
the same way, by the episode itself (`by` = "temporal") or by the reconciler. Every action taken
lands in the episode's audit record with who asked and why (`OperatorAction`). A request that
does not apply is refused by the update's validator, so a refusal leaves no trace in history.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StringConstraints

OperatorVerb = Literal[
    "retry_cancel", "confirm_cancelled", "end", "temporal_cancel", "wind_down", "late_job_settled"
]
# What an operator types after --reason, and their name: short, on one line.
MAX_REASON_CHARS = 500
MAX_BY_CHARS = 100
# confirm-cancelled --minutes: billed minutes the operator read on the provider's console (a
# week at most: no job of ours runs longer).
MAX_CONFIRMED_MINUTES = 7 * 24 * 60
# Actions an episode keeps for its record; past this the oldest are dropped (counted).
MAX_OPERATOR_ACTIONS = 50

Reason = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_REASON_CHARS)
]
By = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_BY_CHARS)]


class OperatorRequest(BaseModel):
    """One repair, as `posttrain-env episodes` sends it."""

    action: Literal["retry_cancel", "confirm_cancelled", "end"]
    by: By  # who asks (the CLI's --by, default the login name and host)
    reason: Reason
    job_id: str | None = None  # confirm_cancelled: the job the operator attests is gone
    # confirm_cancelled: settle at these billed minutes instead of the job's worst case.
    minutes: int | None = Field(default=None, ge=0, le=MAX_CONFIRMED_MINUTES)


class OperatorAction(BaseModel):
    """An action taken on the episode, as its audit record keeps it."""

    action: OperatorVerb
    by: str
    reason: str
    at: datetime
    job_id: str | None = None
    minutes: int | None = None
    settled_micro_usd: int | None = None  # confirm_cancelled: what the job was settled at
    jobs: list[str] = Field(default_factory=list)  # retry_cancel / end: the jobs it reached


class OperatorOutcome(BaseModel):
    """The update's answer: what was done (a refusal is an error, never an outcome)."""

    episode_id: str
    action: OperatorAction
    message: str
