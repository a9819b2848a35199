"""Task specifications: `tasks/<task_id>/task.toml`, validated into `TaskSpec` at load.

A task id comes from a client (`reset(task_id=...)`), so it is checked against `[a-z0-9_]+` before
it is ever joined to a path. A malformed spec fails at load with a `TaskSpecError` naming the file
and the field; the evaluator file is only looked up when an evaluation starts (`evaluator_path`).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from posttrain_env.models import ContaminationSpec, TaskSpec

TASKS_DIR = Path(__file__).parent
SPEC_FILE = "task.toml"
# Shared evaluator helpers, embedded into evaluators by evaluator_script.
KIT_PATH = TASKS_DIR / "evaluator_kit.py"
_TASK_ID = re.compile(r"[a-z0-9_]+")


class TaskSpecError(ValueError):
    """A task that cannot be used: unknown id, malformed spec or missing evaluator."""


def list_tasks(tasks_dir: Path = TASKS_DIR) -> list[str]:
    """The ids of the tasks in `tasks_dir` (folders with a task.toml), sorted."""
    if not tasks_dir.is_dir():
        return []
    return sorted(
        entry.name
        for entry in tasks_dir.iterdir()
        if _TASK_ID.fullmatch(entry.name) and (entry / SPEC_FILE).is_file()
    )


def load_task(task_id: str, tasks_dir: Path = TASKS_DIR) -> TaskSpec:
    """Read and validate `tasks_dir/<task_id>/task.toml`.

    Raises TaskSpecError for an id that is not `[a-z0-9_]+` or names no task (the message lists the
    known ids), for invalid TOML, and for a spec that fails validation (the message names the file
    and every failing field), including an `id` other than the folder's name.
    """
    if not isinstance(task_id, str) or not _TASK_ID.fullmatch(task_id):
        raise TaskSpecError(
            f"invalid task id {task_id!r}: ids are lowercase letters, digits and '_'; "
            f"known tasks: {_known(tasks_dir)}"
        )
    path = tasks_dir / task_id / SPEC_FILE
    if not path.is_file():
        raise TaskSpecError(f"unknown task {task_id!r}; known tasks: {_known(tasks_dir)}")
    shown = _shown(path, tasks_dir)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TaskSpecError(f"{shown}: not valid TOML: {exc}") from None
    try:
        # Strict: TOML has real types, so a quoted number or a boolean where an integer belongs is a
        # mistake in the spec, not something to coerce.
        spec = TaskSpec.model_validate(data, strict=True)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise TaskSpecError(f"{shown}: {problems}") from None
    if spec.id != task_id:
        raise TaskSpecError(
            f"{shown}: field 'id': {spec.id!r} must equal the task's folder name {task_id!r}"
        )
    evaluator_problem = _evaluator_problem(spec.evaluator)
    if evaluator_problem:
        raise TaskSpecError(f"{shown}: field 'evaluator': {evaluator_problem}")
    items = spec.contamination.test_items if spec.contamination else None
    items_problem = _evaluator_problem(items) if items is not None else None
    if items_problem:
        raise TaskSpecError(f"{shown}: field 'contamination.test_items': {items_problem}")
    return spec


def evaluator_path(spec: TaskSpec, tasks_dir: Path = TASKS_DIR) -> Path:
    """The task's evaluator script, in the task's folder or its family's (`family`). Raises
    TaskSpecError if it is missing or outside that folder."""
    shown_spec = _shown(tasks_dir / spec.id / SPEC_FILE, tasks_dir)
    task_dir = tasks_dir / (spec.family or spec.id)
    problem = _evaluator_problem(spec.evaluator)
    if problem:
        raise TaskSpecError(f"{shown_spec}: field 'evaluator': {problem}")
    path = task_dir / spec.evaluator
    # Resolving catches a symlink that leads out of the task's folder.
    if not path.resolve().is_relative_to(task_dir.resolve()):
        raise TaskSpecError(
            f"{shown_spec}: field 'evaluator': {spec.evaluator!r} leads outside the task's folder"
        )
    if not path.is_file():
        raise TaskSpecError(
            f"task {spec.id!r} has no evaluator: {_shown(path, tasks_dir)} does not exist "
            f"(field 'evaluator' = {spec.evaluator!r} in {shown_spec}); "
            f"this task cannot be evaluated until it is added"
        )
    return path


def test_items_path(
    task_id: str, family: str | None, spec: ContaminationSpec, tasks_dir: Path = TASKS_DIR
) -> Path:
    """The task's test items file (`[contamination] test_items`), in the task's folder or its
    family's. Raises TaskSpecError if it is not declared, leads outside that folder or is
    missing (the grader-side contamination check then reports `check_failed`)."""
    if spec.test_items is None:
        raise TaskSpecError(f"task {task_id!r} declares no test items")
    task_dir = tasks_dir / (family or task_id)
    problem = _evaluator_problem(spec.test_items)
    path = task_dir / spec.test_items
    if problem is None and not path.resolve().is_relative_to(task_dir.resolve()):
        problem = f"{spec.test_items!r} leads outside the task's folder"
    if problem:
        raise TaskSpecError(f"task {task_id!r}: field 'contamination.test_items': {problem}")
    if not path.is_file():
        raise TaskSpecError(f"task {task_id!r}: its test items {spec.test_items!r} do not exist")
    return path


def _evaluator_problem(evaluator: str) -> str | None:
    relative = PurePosixPath(evaluator)
    if not evaluator or relative.is_absolute() or ".." in relative.parts or "\\" in evaluator:
        return f"{evaluator!r} must be a relative path inside the task's folder"
    return None


def _describe(error: Any) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "(top level)"
    if error["type"] == "extra_forbidden":
        return f"field '{field}': unknown key"
    return f"field '{field}': {error['msg']}"


def _shown(path: Path, tasks_dir: Path) -> str:
    """`tasks/<id>/task.toml`: the path from the tasks folder's parent, short but unambiguous."""
    try:
        return path.relative_to(tasks_dir.parent).as_posix()
    except ValueError:
        return str(path)


def _known(tasks_dir: Path) -> str:
    return ", ".join(list_tasks(tasks_dir)) or "(none)"


def evaluator_script(spec: TaskSpec, tasks_dir: Path = TASKS_DIR) -> str:
    """The task's evaluator as the one file a grader job runs (DESIGN §9, "Evaluators").

    An evaluator that imports the shared helpers with one `from tasks.evaluator_kit import ...`
    statement gets that statement replaced by the kit's source (tasks/evaluator_kit.py, always
    the package's own, whatever `tasks_dir`); any other evaluator is returned as it is. Raises
    TaskSpecError as evaluator_path does, and if the evaluator imports the kit more than once.
    """
    path = evaluator_path(spec, tasks_dir)
    text = path.read_text(encoding="utf-8")
    imports = _KIT_IMPORT.findall(text)
    if not imports:
        return text
    if len(imports) > 1:
        raise TaskSpecError(
            f"{_shown(path, tasks_dir)}: import tasks.evaluator_kit in one statement, not "
            f"{len(imports)}"
        )
    kit = _kit_source()
    return _KIT_IMPORT.sub(lambda _: kit, text, count=1)


# `from tasks.evaluator_kit import a, b` or a parenthesised list over several lines.
_KIT_IMPORT = re.compile(
    r"^from tasks\.evaluator_kit import (?:\([^)]*\)|[^\n(]*)[^\n]*\n", re.MULTILINE
)


def _kit_source() -> str:
    kit = KIT_PATH.read_text(encoding="utf-8")
    # Embedded mid-file, the kit must not bring a second PEP 723 block or a __future__ import.
    if re.search(r"^# /// script|^from __future__ ", kit, re.MULTILINE):
        raise RuntimeError(f"{KIT_PATH} cannot be embedded: PEP 723 block or __future__ import")
    begin, end = (
        "# --- begin tasks/evaluator_kit.py (embedded) ---\n",
        "# --- end tasks/evaluator_kit.py ---\n",
    )
    return begin + kit + end
