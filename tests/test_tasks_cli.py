"""`posttrain-env tasks list [--json]`, as docs/tasks.md shows it: every family with its members."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from posttrain_server.commands.tasks import run_tasks
from tasks.registry import TASKS_DIR, list_tasks, load_task

COMMAND = Path(sys.executable).parent / "posttrain-env"


# What `posttrain-env tasks fetch` writes (never in the repository; maybe in a checkout).
FETCHED = ("bfcl", "bfcl_test_items.jsonl", "gsm8k_test.jsonl", "__pycache__")


def unfetched_tasks(root: Path) -> Path:
    """A copy of the shipped tasks as a fresh deployment has them: nothing fetched."""
    shutil.copytree(TASKS_DIR, root / "tasks", ignore=shutil.ignore_patterns(*FETCHED))
    return root / "tasks"


def posttrain_env(*args: str, tasks_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The installed `posttrain-env` command, a process of its own."""
    env = {**os.environ, "POSTTRAIN_TASKS_DIR": str(tasks_dir)} if tasks_dir else None
    return subprocess.run(
        [str(COMMAND), *args], capture_output=True, text=True, timeout=120, check=False, env=env
    )


def test_tasks_list_json_lists_every_task_under_its_family_with_its_limits(
    tmp_path: Path,
) -> None:
    done = posttrain_env("tasks", "list", "--json", tasks_dir=unfetched_tasks(tmp_path))
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert listing["broken"] == []
    members = {
        member["id"]: (family["family"], member)
        for family in listing["families"]
        for member in family["members"]
    }
    assert sorted(members) == list_tasks()
    for task_id, (family, member) in members.items():
        spec = load_task(task_id)
        assert family == (spec.family or spec.id)
        assert member["flavors"] == spec.flavors
        assert member["budget_usd"] == spec.budget_usd
        assert member["time_limit_s"] == spec.time_limit_s
        assert member["base_model"]["repo_id"] == spec.base_model.repo_id
        assert member["base_model"]["revision"] == spec.base_model.revision
        assert member["base_model"]["local"] == spec.base_model.local
    family, tool_call = members["t1_tool_call"]
    assert family == "t1_tool_call" and members["t1_tool_call_tiny"][0] == "t1_tool_call"
    assert tool_call["base_model"]["revision"] == "7ae557604adf67be50417f59c2c2f167def9a775"
    assert tool_call["hidden_split"] == "public"
    # The real tool-calling member's BFCL files and both real members' test items are written
    # by `tasks fetch`: until then the listing says so, and which command writes them.
    evaluable = {task_id for task_id, (_, member) in members.items() if member["evaluable"]}
    assert evaluable == set(members) - {"t1_tool_call"}
    assert (
        "`posttrain-env tasks fetch t1_tool_call` writes it" in (tool_call["not_evaluable_because"])
    )
    checks = {task_id: member["contamination_check"] for task_id, (_, member) in members.items()}
    assert checks["t1_tool_call_tiny"] == checks["math_word_problems_tiny"] == "ready"
    assert checks["t1_tool_call"] == checks["math_word_problems"] == "not_ready"
    for real in ("t1_tool_call", "math_word_problems"):
        why = members[real][1]["contamination_not_ready_because"]
        assert f"`posttrain-env tasks fetch {real}` writes them" in why


def test_tasks_list_prints_each_family_then_its_members(tmp_path: Path) -> None:
    done = posttrain_env("tasks", "list", tasks_dir=unfetched_tasks(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    family_at = lines.index("t1_tool_call")
    tiny = next(line for line in lines if line.startswith("  t1_tool_call_tiny "))
    assert lines.index(tiny) > family_at
    assert (
        "budget $0.50" in tiny and "time 2h00m" in tiny and "flavors cpu-basic,cpu-upgrade" in tiny
    )
    assert "base posttrain-env/tiny-tool-lm@main (local: tiny-tool-lm)" in tiny
    real = next(line for line in lines if line.startswith("  t1_tool_call "))
    assert "budget $20.00" in real and "Qwen/Qwen2.5-0.5B-Instruct@7ae5576" in real


def test_a_task_whose_spec_does_not_load_is_listed_with_its_error_and_exit_1(
    tmp_path: Path,
) -> None:
    tasks_dir = tmp_path / "tasks"
    shutil.copytree(TASKS_DIR / "t0_artifact", tasks_dir / "t0_artifact")
    (tasks_dir / "t9_broken").mkdir()
    (tasks_dir / "t9_broken" / "task.toml").write_text('id = "t9_broken"\n')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = run_tasks(argparse.Namespace(json=True), tasks_dir)
    assert status == 1
    listing = json.loads(out.getvalue())
    assert [family["family"] for family in listing["families"]] == ["t0_artifact"]
    (broken,) = listing["broken"]
    assert broken["id"] == "t9_broken" and "field 'prompt'" in broken["error"]


def test_a_member_whose_evaluator_cannot_be_assembled_is_listed_as_not_evaluable(
    tmp_path: Path,
) -> None:
    """A file its evaluator embeds is missing: listed, `evaluable: false` and why, exit 0."""
    tasks_dir = tmp_path / "tasks"
    for task_id in ("t1_tool_call", "t1_tool_call_tiny"):
        shutil.copytree(TASKS_DIR / task_id, tasks_dir / task_id)
    (tasks_dir / "t1_tool_call" / "tiny_hidden.jsonl").unlink()
    shutil.rmtree(tasks_dir / "t1_tool_call" / "bfcl", ignore_errors=True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = run_tasks(argparse.Namespace(json=True), tasks_dir)
    assert status == 0
    (family,) = json.loads(out.getvalue())["families"]
    members = {member["id"]: member for member in family["members"]}
    assert members["t1_tool_call"]["evaluable"] is False  # its BFCL files are not fetched
    tiny = members["t1_tool_call_tiny"]
    assert tiny["evaluable"] is False
    assert "tiny_hidden.jsonl does not exist" in tiny["not_evaluable_because"]


def test_tasks_needs_a_subcommand() -> None:
    done = posttrain_env("tasks")
    assert done.returncode == 2 and "list" in done.stderr


def test_a_member_whose_test_items_are_not_here_is_listed_as_not_ready_until_they_are(
    tmp_path: Path,
) -> None:
    """The real math member's GSM8K test file is made from the Hub, not shipped: the listing
    says its check is not ready (and why) until the file is there, then that it is ready."""
    tasks_dir = tmp_path / "tasks"
    for task_id in ("math_word_problems", "math_word_problems_tiny", "t0_artifact"):
        shutil.copytree(TASKS_DIR / task_id, tasks_dir / task_id)
    items = tasks_dir / "math_word_problems" / "gsm8k_test.jsonl"
    assert not items.exists()

    def listed() -> tuple[dict[str, dict[str, str]], str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert run_tasks(argparse.Namespace(json=True), tasks_dir) == 0
        members = {
            member["id"]: member
            for family in json.loads(out.getvalue())["families"]
            for member in family["members"]
        }
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            assert run_tasks(argparse.Namespace(json=False), tasks_dir) == 0
        return members, text.getvalue()

    members, text = listed()
    real = members["math_word_problems"]
    assert real["contamination_check"] == "not_ready"
    assert "'gsm8k_test.jsonl' do not exist" in real["contamination_not_ready_because"]
    assert "`reset` refuses the task" in text
    assert members["math_word_problems_tiny"]["contamination_check"] == "ready"
    assert members["t0_artifact"]["contamination_check"] == "generated"  # items per episode
    assert "contamination check not ready: task 'math_word_problems'" in text
    assert text.count("contamination check not ready") == 1

    items.write_text('{"id": "gsm8k-test-0000", "text": "A problem.", "answer": "1"}\n')
    members, text = listed()
    assert members["math_word_problems"]["contamination_check"] == "ready"
    assert "contamination_not_ready_because" not in members["math_word_problems"]
    assert "contamination check not ready" not in text
