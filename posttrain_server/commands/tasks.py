"""`posttrain-env tasks`: the shipped tasks, by family (docs/tasks.md).

    posttrain-env tasks list [--json]    every family and its members: id, flavors, budget, time
                                         limit, base model (Hugging Face and local), evaluation
                                         flavor, grading timeout, hidden split, whether its
                                         evaluator can be assembled here, and whether its
                                         contamination check has its test items here
    posttrain-env tasks fetch <task>     write what a real member needs that the repository
                                         does not ship (posttrain_server/commands/tasks_fetch.py)

A family is the task that holds the evaluator, with every task that names it in `family`. A
member whose spec does not load is listed with its error (exit status 1); one whose evaluator
cannot be assembled (data the repository does not ship, e.g. t1_tool_call's BFCL files) is listed
with `evaluable: false` and why (exit status 0: the task is usable once `tasks fetch` made them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from posttrain_common.settings import Settings
from posttrain_env.models import TaskSpec
from posttrain_server.commands.tasks_fetch import add_fetch_command, run_fetch
from tasks.registry import (
    TASKS_DIR,
    TaskSpecError,
    evaluator_script,
    list_tasks,
    load_task,
    test_items_path,
)

TASKS_HELP = "the shipped tasks, by family"


def add_tasks_commands(subparsers: argparse._SubParsersAction) -> None:  # pyright: ignore[reportPrivateUsage]
    """Register `tasks` and its subcommands on the top-level parser's subparsers."""
    tasks = subparsers.add_parser("tasks", help=TASKS_HELP, description=TASKS_HELP)
    commands = tasks.add_subparsers(dest="tasks_command", required=True)
    listing = commands.add_parser(
        "list", help="every family and its members (flavors, budget, time limit, base model)"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object on stdout")
    add_fetch_command(commands)


def run_tasks(args: argparse.Namespace, tasks_dir: Path | None = None) -> int:
    """Run a parsed `tasks` command; the exit status (`list`: 1 if a task's spec does not
    load; `fetch`: posttrain_server/commands/tasks_fetch.py)."""
    # The deployment's tasks (POSTTRAIN_TASKS_DIR), as its workers read them.
    tasks_dir = tasks_dir or Settings().tasks_dir or TASKS_DIR
    if getattr(args, "tasks_command", "list") == "fetch":
        return run_fetch(args, tasks_dir)
    families, broken = catalogue(tasks_dir)
    if args.json:
        print(json.dumps({"families": families, "broken": broken}, indent=2))
    else:
        print(render(families, broken), end="")
    return 1 if broken else 0


def catalogue(tasks_dir: Path = TASKS_DIR) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The families (sorted by id, each with its members sorted by id) and the tasks whose
    spec does not load ({"id", "error"})."""
    members: dict[str, list[dict[str, Any]]] = {}
    broken = []
    for task_id in list_tasks(tasks_dir):
        try:
            spec = load_task(task_id, tasks_dir)
        except TaskSpecError as exc:
            broken.append({"id": task_id, "error": str(exc)})
            continue
        try:
            evaluator_script(spec, tasks_dir)
            evaluable, why = True, ""
        except TaskSpecError as exc:
            evaluable, why = False, str(exc)
        contamination = spec.contamination
        members.setdefault(spec.family or spec.id, []).append(
            {
                "id": spec.id,
                "flavors": list(spec.flavors),
                "budget_usd": spec.budget_usd,
                "time_limit_s": spec.time_limit_s,
                "base_model": {
                    "repo_id": spec.base_model.repo_id,
                    "revision": spec.base_model.revision,
                    "local": spec.base_model.local,
                },
                "eval_flavor": spec.eval_flavor,
                "score_timeout_s": spec.score_timeout_s,
                "hidden_split": contamination.hidden_split if contamination else None,
                "evaluable": evaluable,
                **({"not_evaluable_because": why} if why else {}),
                **contamination_readiness(spec, tasks_dir),
            }
        )
    families = [{"family": family, "members": members[family]} for family in sorted(members)]
    return families, broken


def contamination_readiness(spec: TaskSpec, tasks_dir: Path = TASKS_DIR) -> dict[str, str]:
    """Whether the grader-side contamination check can run for this task on this deployment:
    `contamination_check` is "none" (the task has none), "generated" (its items are made per
    episode), "ready" (its test items file is here) or "not_ready", with why: until the file
    is made (`posttrain-env tasks fetch <task>`), `reset` refuses the task unless the operator
    accepts unchecked rewards, which an operator should know before running it."""
    contamination = spec.contamination
    if contamination is None:
        return {"contamination_check": "none"}
    if contamination.test_items is None:
        return {"contamination_check": "generated"}
    try:
        test_items_path(spec.id, spec.family, contamination, tasks_dir)
    except TaskSpecError as exc:
        return {"contamination_check": "not_ready", "contamination_not_ready_because": str(exc)}
    return {"contamination_check": "ready"}


def render(families: list[dict[str, Any]], broken: list[dict[str, str]]) -> str:
    """The text form: a family's id, then one line per member."""
    lines = []
    for family in families:
        lines.append(f"{family['family']}")
        for member in family["members"]:
            base = member["base_model"]
            model = f"{base['repo_id']}@{_short(base['revision'])}"
            if base["local"]:
                model += f" (local: {base['local']})"
            hours, rest = divmod(member["time_limit_s"], 3600)
            limit = f"{hours}h{rest // 60:02d}m"
            lines.append(
                f"  {member['id']:28} budget ${member['budget_usd']:.2f}  time {limit}  "
                f"flavors {','.join(member['flavors'])}  base {model}"
            )
            if not member["evaluable"]:
                lines.append(f"  {'':28} not evaluable here: {member['not_evaluable_because']}")
            if member["contamination_check"] == "not_ready":
                lines.append(
                    f"  {'':28} contamination check not ready: "
                    f"{member['contamination_not_ready_because']}; until then `reset` refuses "
                    "the task, unless POSTTRAIN_ACCEPT_UNCHECKED_REWARDS=true (rewards unchecked)"
                )
    for entry in broken:
        lines.append(f"{entry['id']}: does not load: {entry['error']}")
    return "".join(line + "\n" for line in lines)


def _short(revision: str) -> str:
    """A commit shown as its first 7 hex digits (a branch name as it is)."""
    is_commit = len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)
    return revision[:7] if is_commit else revision
