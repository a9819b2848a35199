"""The reaper's input and report (out of the workflow's module, see workflows/job/contract.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from posttrain_common.contracts.jobs import OrphanJob
from posttrain_common.contracts.reconcile import StrandedRun

# Runs closed at most this long ago are looked at (a deployment down longer than this leaves
# older ones to `posttrain-env episodes` and the runbook).
RECONCILE_LOOKBACK_S = 7 * 24 * 3600


class ReaperInput(BaseModel):
    dry_run: bool = False  # report what it finds without acting
    orphans: bool = True  # the backend lists its live jobs (Capabilities.reaps_orphans)
    reconcile: bool = True
    lookback_s: float = RECONCILE_LOOKBACK_S
    # The watcher's and the account's closed runs: about two Schedule periods.
    singleton_lookback_s: float = 1800.0


class ReaperReport(BaseModel):
    checked: int = 0  # live jobs of this deployment looked at
    orphans: list[OrphanJob] = Field(default_factory=list)
    cancelled: list[str] = Field(default_factory=list)  # refs
    strays: list[OrphanJob] = Field(default_factory=list)
    settled_late: list[str] = Field(default_factory=list)  # refs of strays cancelled and settled
    failed: dict[str, str] = Field(default_factory=dict)  # ref or workflow id -> why
    stranded: list[StrandedRun] = Field(default_factory=list)  # closed from outside
    wound_down: dict[str, str] = Field(default_factory=dict)  # workflow id -> what was done
    done: bool = False
