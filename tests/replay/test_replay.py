"""Episodes started before an upgrade keep running after it: the recorded histories of real
episodes (tests/replay/record_histories.py) replay against today's workflows without a
non-determinism error. A change to workflow code that alters the commands it makes must use
`workflow.patched` (README, "Changing workflow code")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from posttrain_env.worker import WORKFLOWS

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_every_scenario_and_workflow_type_is_recorded() -> None:
    recorded = {(p.name.split("--")[0], p.name.split("--")[1]) for p in HISTORIES}
    scenarios = {scenario for scenario, _ in recorded}
    assert scenarios == {"t0_artifact", "reset", "continue_as_new", "cancel_pending"}
    types = {workflow_type for _, workflow_type in recorded}
    assert types == {
        "SessionWorkflow",
        "EpisodeWorkflow",
        "JobWorkflow",
        "WatcherWorkflow",
        "AccountWorkflow",
    }


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, json.loads(path.read_text()))


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_a_recorded_history_replays_without_nondeterminism(path: Path) -> None:
    history = load(path)
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure!r}"
