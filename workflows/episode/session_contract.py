"""The session workflow's reset request, its answer and its carried state (out of the workflow's
module, see workflows/job/contract.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from posttrain_common.contracts.episodes import EpisodeSetup


class ResetRequest(BaseModel):
    task_id: str = Field(min_length=1, max_length=100)


class ResetResult(BaseModel):
    episode_id: str
    workflow_id: str
    setup: EpisodeSetup


class SessionState(BaseModel):
    current: EpisodeSetup | None = None
    closed: bool = False
