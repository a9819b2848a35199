"""Episodes started before an upgrade keep running after it: the recorded histories of real
episodes (tests/replay/record_histories.py) replay against today's workflows without a
non-determinism error. A change to workflow code that alters the commands it makes must use
`workflow.patched` (docs/development.md, "Changing workflow code")."""

from __future__ import annotations

import ast
import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.replay.replaying import load, replayer_of_the_worker

ROOT = Path(__file__).resolve().parents[2]
HISTORIES = sorted((Path(__file__).parent / "histories").glob("*/*.json"))
# Episode recordings; campaign ones (tests/replay/record_campaign_histories.py) are checked in
# test_campaign_replay.py, and reaper ones (`-reaper-`: a ReaperWorkflow run that settled a stray,
# taken from tests/hf/test_fault_episodes.py's run against the fake Hub, which the recorder's
# local backend cannot produce) hold the reaper alone. Every history of each is replayed below.
RECORDINGS = sorted(
    {
        path.parent
        for path in HISTORIES
        if "-campaigns-" not in path.parent.name and "-reaper-" not in path.parent.name
    }
)


@pytest.mark.parametrize("folder", RECORDINGS, ids=lambda p: p.name)
def test_every_scenario_and_workflow_type_is_recorded(folder: Path) -> None:
    recorded = {(p.name.split("--")[0], p.name.split("--")[1]) for p in folder.glob("*.json")}
    scenarios = {scenario for scenario, _ in recorded}
    # Later recordings add scenarios (`sent_again`); none drops one of the first four.
    assert {"t0_artifact", "reset", "continue_as_new", "cancel_pending"} <= scenarios
    types = {workflow_type for _, workflow_type in recorded}
    every_time = {
        "SessionWorkflow",
        "EpisodeWorkflow",
        "JobWorkflow",
        "WatcherWorkflow",
        "AccountWorkflow",
    }
    # The reaper's Schedule (every backend since issue 26) may fire during a recording.
    assert every_time <= types <= every_time | {"ReaperWorkflow"}


def patch_ids_in_code() -> set[str]:
    """Every id the workflow code passes to `workflow.patched` (a literal, or a module-level
    string constant of the same module)."""
    ids: set[str] = set()
    for path in (ROOT / "workflows").rglob("*.py"):
        tree = ast.parse(path.read_text())
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else None
            name = node.func.id if isinstance(node.func, ast.Name) else name
            if name == "patched" and node.args:
                arg = node.args[0]
                if path.name == "cancellation.py":
                    continue  # `reraise_cancel(err, patch)`: its callers name the patch
            elif name == "reraise_cancel" and len(node.args) == 2:
                arg = node.args[1]
            else:
                continue
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                ids.add(arg.value)
            elif isinstance(arg, ast.Name) and arg.id in constants:
                ids.add(constants[arg.id])
            else:
                raise AssertionError(f"{path.name}:{node.lineno}: a patch id that is not literal")
    return ids


def patch_ids_taken(path: Path) -> set[str]:
    """The patches a recorded history took (Temporal's `core_patch` markers)."""
    taken = set()
    for event in json.loads(path.read_text())["events"]:
        marker = event.get("markerRecordedEventAttributes")
        if marker is None or marker.get("markerName") != "core_patch":
            continue
        for payload in marker["details"]["patch-data"]["payloads"]:
            taken.add(json.loads(base64.b64decode(payload["data"]))["id"])
    return taken


def test_every_patched_branch_of_the_workflow_code_is_replayed() -> None:
    """A change behind `workflow.patched` is followed by a recording that takes it
    (docs/development.md, "Changing workflow code"), so that its new branch is replayed too, not
    only the old one."""
    in_code = patch_ids_in_code()
    assert len(in_code) >= 5
    taken = set().union(*(patch_ids_taken(path) for path in HISTORIES))
    assert in_code - taken == set(), "record new histories (tests/replay/record_histories.py)"


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_a_recorded_history_replays_without_nondeterminism(path: Path) -> None:
    history = load(path)
    replayer = replayer_of_the_worker()
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure!r}"


@pytest.mark.slow  # minutes of real turns, jobs or recordings: the slow set
@pytest.mark.timeout(600)
def test_the_recorder_records_histories_that_replay(tmp_path: Path) -> None:
    """The recording command of docs/development.md, on three of its scenarios."""
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
            "cancel_pending",  # its session's history holds a failure, with a stack trace
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = sorted(tmp_path.glob("*.json"))
    # Failures' stack traces would carry this machine's folders into the repository.
    assert not [p.name for p in recorded if str(ROOT) in p.read_text()]
    names = {p.name.split("--")[1] for p in recorded}
    assert {"SessionWorkflow", "EpisodeWorkflow", "JobWorkflow", "AccountWorkflow"} <= names
    replayer = replayer_of_the_worker()
    for path in recorded:
        result = asyncio.run(replayer.replay_workflow(load(path), raise_on_replay_failure=False))
        assert result.replay_failure is None, path.name
