"""The retention workflow's input (out of the workflow's module, see workflows/job/contract.py)."""

from __future__ import annotations

from pydantic import BaseModel


class RetentionInput(BaseModel):
    dry_run: bool = False  # report what is due without deleting anything
