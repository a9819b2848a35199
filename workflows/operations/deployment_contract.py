"""The deployment workflow's input (out of the workflow's module, see workflows/job/contract.py)."""

from __future__ import annotations

from pydantic import BaseModel


class DeploymentInput(BaseModel):
    key_fingerprint: str
