"""The account workflow's admissions, exposures and carried state (out of the workflow's module,
see workflows/job/contract.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Admission(BaseModel):
    episode_id: str
    max_live_episodes: int | None = None
    spend_cap_micro_usd: int | None = None


class Exposure(BaseModel):
    episode_id: str
    committed_micro_usd: int  # settled + reserved


class ExposureCheck(Exposure):
    cap_micro_usd: int


class AccountState(BaseModel):
    live: dict[str, int] = Field(default_factory=dict)
