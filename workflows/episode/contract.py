"""The episode workflow's input (out of the workflow's module, see workflows/job/contract.py)."""

from __future__ import annotations

from pydantic import BaseModel

from posttrain_common.contracts.episodes import EpisodeSetup
from workflows.episode.operator import WindDown
from workflows.episode.state import EpisodeCarry


class EpisodeInput(BaseModel):
    setup: EpisodeSetup
    carry: EpisodeCarry | None = None
    # Set by the reconciler when the last run was terminated from outside: end and close.
    wind_down: WindDown | None = None
