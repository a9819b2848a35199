"""Episodes started before an upgrade keep running after it: the recorded histories of real
episodes (tests/replay/record_histories.py) replay against today's workflows without a
non-determinism error. A change to workflow code that alters the commands it makes must use
`workflow.patched` (README, "Changing workflow code")."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from posttrain_env.entrypoints.worker import WORKFLOWS

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*/*.json"))
RECORDINGS = sorted({path.parent for path in HISTORIES})


@pytest.mark.parametrize("folder", RECORDINGS, ids=lambda p: p.name)
def test_every_scenario_and_workflow_type_is_recorded(folder: Path) -> None:
    recorded = {(p.name.split("--")[0], p.name.split("--")[1]) for p in folder.glob("*.json")}
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


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_a_recorded_history_replays_without_nondeterminism(path: Path) -> None:
    history = load(path)
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure!r}"


def test_the_recorder_records_histories_that_replay(tmp_path: Path) -> None:
    """The README's recording command, on two of its scenarios."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.replay.record_histories",
            "--label",
            "test",
            "--out",
            str(tmp_path),
            "reset",
            "continue_as_new",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = sorted(tmp_path.glob("*.json"))
    names = {p.name.split("--")[1] for p in recorded}
    assert {"SessionWorkflow", "EpisodeWorkflow", "JobWorkflow", "AccountWorkflow"} <= names
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    for path in recorded:
        result = asyncio.run(replayer.replay_workflow(load(path), raise_on_replay_failure=False))
        assert result.replay_failure is None, path.name
