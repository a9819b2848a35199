"""The replay backend's settings (`POSTTRAIN_REPLAY_*`, docs/backends.md "Replay backend")."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# Backends the replay may stand on. Over `hf` the replay backend declares that it spends money
# (replay/info.py), as a job that falls through does: API keys are then required.
InnerBackend = Literal["fake", "local", "hf"]


class ReplaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="POSTTRAIN_REPLAY_", extra="ignore", hide_input_in_errors=True
    )

    # The store of recordings (default: <state_dir>/replay/store). Build one from a deployment's
    # audit records with `posttrain-env replay-store build`.
    store: Path | None = None
    # Recorded queueing and running times are replayed multiplied by this (0.01: a 10-minute
    # job ends in 6 s; 0: a replayed job ends the moment it starts). Charges are the recorded
    # ones whatever the scale.
    time_scale: float = Field(default=1.0, ge=0, le=1000)
    # The backend that answers what is not a job (models, datasets, prices, job limits) and,
    # with fall-through, runs the jobs that have no recording.
    inner: InnerBackend = "local"
    # Unseen scripts run on `inner` and are recorded when they end; off: they are refused with
    # `not_recorded`.
    fall_through: bool = False
