"""Campaigns started before an upgrade keep running after it: the recorded histories of real
campaigns (tests/replay/record_campaign_histories.py: campaigns, rollouts and their episodes,
with continue-as-new, a retry, a cancel and a reopen) are replayed by test_replay.py; this
checks that every scenario and workflow type is in each recording, and that the recorder
records histories that replay."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.replay.record_campaign_histories import FOLDER_TAG, SCENARIOS
from tests.replay.replaying import load, replayer_of_the_worker

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = sorted(p for p in (Path(__file__).parent / "histories").glob(f"*{FOLDER_TAG}*"))


def recorded(folder: Path) -> set[tuple[str, str]]:
    return {(p.name.split("--")[0], p.name.split("--")[1]) for p in folder.glob("*.json")}


def test_a_campaign_recording_is_kept() -> None:
    assert RECORDINGS, "no folder of campaign histories"


# The scenarios of the first recording; later ones (`campaign_outside_cancel`) may be recorded
# in a folder of their own (campaign_continue_as_new cannot be recorded again since issue 25).
FIRST_SCENARIOS = {"campaign_continue_as_new", "campaign_cancel", "campaign_reopen"}


@pytest.mark.parametrize("folder", RECORDINGS, ids=lambda p: p.name)
def test_every_campaign_scenario_and_workflow_type_is_recorded(folder: Path) -> None:
    found = recorded(folder)
    scenarios = {scenario for scenario, _ in found}
    assert scenarios <= set(SCENARIOS)
    assert FIRST_SCENARIOS <= scenarios or not FIRST_SCENARIOS & scenarios
    for scenario in scenarios:
        types = {t for s, t in found if s == scenario}
        assert {"CampaignWorkflow", "RolloutWorkflow", "EpisodeWorkflow", "JobWorkflow"} <= types
    if "campaign_continue_as_new" not in scenarios:
        return
    # The campaign continued as new (two runs, each its own history), and a rollout did too.
    runs = [p for p in folder.glob("campaign_continue_as_new--CampaignWorkflow--*.json")]
    assert len(runs) >= 2
    rollouts = [
        json.loads(p.read_text())["events"][-1]["eventType"]
        for p in folder.glob("campaign_continue_as_new--RolloutWorkflow--*.json")
    ]
    assert "EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW" in rollouts


def test_every_campaign_scenario_is_recorded_somewhere() -> None:
    everywhere = set().union(*({s for s, _ in recorded(folder)} for folder in RECORDINGS))
    assert everywhere == set(SCENARIOS)


@pytest.mark.slow  # minutes of real turns, jobs or recordings: the slow set
@pytest.mark.timeout(600)
def test_the_campaign_recorder_records_histories_that_replay(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.replay.record_campaign_histories",
            "--label",
            "test",
            "--out",
            str(tmp_path),
            "campaign_reopen",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    paths = sorted(tmp_path.glob("*.json"))
    assert {"CampaignWorkflow", "RolloutWorkflow"} <= {p.name.split("--")[1] for p in paths}
    replayer = replayer_of_the_worker()
    for path in paths:
        history = load(path)
        result = asyncio.run(replayer.replay_workflow(history, raise_on_replay_failure=False))
        assert result.replay_failure is None, path.name
