"""Replaying a recorded history as the worker would run it."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from posttrain_server.worker import WORKFLOWS, workflow_runner


def replayer_of_the_worker() -> Replayer:
    """A replayer of every workflow the worker runs, with its data converter and its sandbox
    (`workflow_runner`: beartype passed through). The SDK's default sandbox re-imports beartype
    for every history once any module has installed beartype's import hook, which a test
    process that collected the whole suite has: 2.2 s of CPU per history there, against
    0.1 s, and 269 of the default suite's 736 CPU-seconds."""
    return Replayer(
        workflows=list(WORKFLOWS),
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    )


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, json.loads(path.read_text()))
