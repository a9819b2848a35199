"""Task specs (`tasks/<task_id>/task.toml`): the shipped tasks and the ways a spec can be wrong."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from posttrain_env.models import BaseModelSpec, FlavorPrice, TaskSpec
from tasks.models.tiny_causal_lm import write_tiny_model
from tasks.registry import (
    TASKS_DIR,
    TaskSpecError,
    evaluator_path,
    evaluator_script,
    generated_model,
    generated_models,
    list_tasks,
    load_task,
    missing_evaluation_files,
)

VALID_SPEC = """\
id = "{task_id}"
prompt = "Do the thing."
flavors = ["cpu-basic"]
budget_usd = 0.29
time_limit_s = 3600
score_timeout_s = 600
max_timeout_minutes = 30
eval_flavor = "cpu-basic"
eval_timeout_minutes = 10

[base_model]
repo_id = "HuggingFaceTB/SmolLM2-135M"
"""


def write_task(tasks_dir: Path, task_id: str, text: str) -> Path:
    folder = tasks_dir / task_id
    folder.mkdir(parents=True)
    path = folder / "task.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def tasks_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tasks"
    folder.mkdir()
    return folder


def test_tasks_dir_is_the_tasks_package() -> None:
    assert TASKS_DIR == Path(__file__).parent.parent / "tasks"
    assert (TASKS_DIR / "registry.py").is_file()


def test_the_shipped_tasks_are_listed_and_every_other_folder_is_a_package() -> None:
    tasks = list_tasks()
    assert {"t0_arithmetic_format", "t0_arithmetic_format_tiny", "t0_artifact"} <= set(tasks)
    # A folder of tasks/ is a task (its task.toml) or a package of the tasks' code (models/):
    # a task folder whose spec is misnamed would silently not be a task.
    others = {
        entry.name
        for entry in TASKS_DIR.iterdir()
        if entry.is_dir() and entry.name != "__pycache__" and entry.name not in tasks
    }
    assert others == {
        entry.name for entry in TASKS_DIR.iterdir() if (entry / "__init__.py").is_file()
    }


@pytest.mark.parametrize("task_id", list_tasks())
def test_every_shipped_task_has_what_a_task_needs(task_id: str, tmp_path: Path) -> None:
    """What a new task must bring (tasks/__init__.py): a spec that loads, an evaluator that
    assembles into one self-contained PEP 723 script, a reference solution, and a local base
    model, if it names one, that is generated here. Files a real member's `fetch.py` writes
    are not in the repository: stand-ins take their place here (tests/tasks/test_bfcl.py
    assembles the real ones)."""
    spec = load_task(task_id)
    tasks_dir = TASKS_DIR
    if missing_evaluation_files(spec) is not None:
        family = spec.family or spec.id
        assert (TASKS_DIR / family / "fetch.py").is_file(), missing_evaluation_files(spec)
        tasks_dir = tmp_path / "tasks"
        shutil.copytree(TASKS_DIR / family, tasks_dir / family)
        shutil.copytree(TASKS_DIR / spec.id, tasks_dir / spec.id, dirs_exist_ok=True)
        files = spec.evaluation["files"]
        assert isinstance(files, list)
        for name in map(str, files):
            (tasks_dir / family / name).parent.mkdir(parents=True, exist_ok=True)
            (tasks_dir / family / name).write_text("{}\n")
    script = evaluator_script(spec, tasks_dir)
    assert script.startswith("#!/usr/bin/env python3\n# /// script\n")
    assert not re.search(r"^\s*(from|import) tasks\b", script, re.MULTILINE)
    compile(script, f"{task_id}/evaluator.py", "exec")
    assert (TASKS_DIR / (spec.family or spec.id) / "reference_solution.py").is_file()
    if spec.base_model.local is not None:
        assert spec.base_model.local in generated_models()


def test_a_generated_model_is_found_by_its_name_and_nothing_else_is(tmp_path: Path) -> None:
    assert {"tiny-causal-lm", "tiny-arith-lm"} <= set(generated_models())
    generate = generated_model("tiny-causal-lm")
    assert generate is not None
    generate(tmp_path / "generated")
    write_tiny_model(tmp_path / "written", seed=0)
    for path in (tmp_path / "written").iterdir():
        assert (tmp_path / "generated" / path.name).read_bytes() == path.read_bytes()
    # Only a module's own name finds it: no shared module, no path, no other spelling.
    for name in (
        "tiny_causal_lm",
        "-llama",
        "_llama",
        "llama",
        "__init__",
        "Tiny-Causal-Lm",
        "org/tiny-causal-lm",
        "../tiny-causal-lm",
        "tiny-causal-lm.py",
        "x",
    ):
        assert generated_model(name) is None, name


def test_t0_artifact_loads_with_the_issue_values() -> None:
    spec = load_task("t0_artifact")
    assert spec.id == "t0_artifact"
    assert spec.base_model == BaseModelSpec(
        repo_id="HuggingFaceTB/SmolLM2-135M", revision="main", local="tiny-causal-lm"
    )
    assert spec.flavors == ["cpu-basic", "cpu-upgrade"]
    assert spec.budget_usd == 0.5
    assert spec.budget_micro_usd == 500_000
    assert spec.time_limit_s == 7200
    assert spec.score_timeout_s == 600
    assert spec.max_timeout_minutes == 30
    assert spec.max_steps == 100
    assert spec.max_concurrent_jobs == 2
    assert spec.max_dev_evaluations == 5
    assert spec.eval_flavor == "cpu-basic"
    assert spec.eval_flavor in spec.flavors
    assert spec.eval_timeout_minutes == 10
    assert spec.evaluator == "evaluator.py"
    assert spec.artifact_cap_bytes is None
    assert "/data/outputs/model.safetensors" in spec.prompt
    assert "model.norm.weight" in spec.prompt
    assert "/base_model" in spec.prompt


def test_t0_arithmetic_format_loads_with_the_issue_values() -> None:
    spec = load_task("t0_arithmetic_format")
    assert spec.id == "t0_arithmetic_format"
    assert spec.base_model == BaseModelSpec(
        repo_id="Qwen/Qwen2.5-0.5B-Instruct", revision="main", local=None
    )
    assert spec.flavors == ["t4-small", "l4x1", "a10g-small"]
    assert spec.budget_usd == 20.0
    assert spec.budget_micro_usd == 20_000_000
    assert spec.time_limit_s == 28800
    assert spec.score_timeout_s == 2700
    assert spec.max_timeout_minutes == 240
    assert spec.max_steps == 100
    assert spec.eval_flavor == "l4x1"
    assert spec.eval_flavor in spec.flavors
    assert spec.eval_timeout_minutes == 30
    assert "ANSWER: <integer>" in spec.prompt
    assert evaluator_path(spec) == TASKS_DIR / "t0_arithmetic_format" / "evaluator.py"


def test_the_tiny_arithmetic_member_shares_the_familys_evaluator_on_the_local_backend() -> None:
    tiny, full = load_task("t0_arithmetic_format_tiny"), load_task("t0_arithmetic_format")
    assert tiny.family == "t0_arithmetic_format"
    assert evaluator_path(tiny) == evaluator_path(full)
    assert evaluator_script(tiny) == evaluator_script(full)
    assert tiny.base_model.local == "tiny-arith-lm" and full.base_model.local is None
    assert tiny.eval_flavor == "cpu-basic" and tiny.evaluation["max_operand"] == 20
    # The same rules and answer format; only the distribution's size differs.
    for phrase in ("ANSWER: <integer>", "chat template", "greedily", "hidden split"):
        assert phrase in tiny.prompt and phrase in full.prompt
    assert set(tiny.evaluation) == set(full.evaluation)


def test_the_limits_view_lists_the_priced_flavors_in_spec_order() -> None:
    spec = load_task("t0_artifact")
    prices = {
        "cpu-upgrade": FlavorPrice(name="cpu-upgrade", micro_usd_per_minute=500),
        "cpu-basic": FlavorPrice(name="cpu-basic", micro_usd_per_minute=167),
    }
    view = spec.limits_view(prices)
    assert view["budget_usd"] == 0.5
    assert view["max_steps"] == 100
    assert [flavor["name"] for flavor in view["flavors"]] == ["cpu-basic", "cpu-upgrade"]


@pytest.mark.parametrize(("budget", "micro"), [("0.29", 290_000), ("0.50", 500_000)])
def test_budget_micro_usd_is_exact(tasks_dir: Path, budget: str, micro: int) -> None:
    # 0.29 * 1e6 is 289999.99999999994 in binary floating point: truncating would lose a micro-USD.
    text = VALID_SPEC.format(task_id="t_budget").replace("0.29", budget)
    write_task(tasks_dir, "t_budget", text)
    assert load_task("t_budget", tasks_dir).budget_micro_usd == micro


def test_a_valid_spec_fills_the_defaults(tasks_dir: Path) -> None:
    write_task(tasks_dir, "t_min", VALID_SPEC.format(task_id="t_min"))
    spec = load_task("t_min", tasks_dir)
    assert spec == TaskSpec(
        id="t_min",
        prompt="Do the thing.",
        base_model=BaseModelSpec(repo_id="HuggingFaceTB/SmolLM2-135M"),
        flavors=["cpu-basic"],
        budget_usd=0.29,
        time_limit_s=3600,
        score_timeout_s=600,
        max_timeout_minutes=30,
        eval_flavor="cpu-basic",
        eval_timeout_minutes=10,
    )
    assert (spec.max_steps, spec.max_concurrent_jobs, spec.max_dev_evaluations) == (100, 2, 5)
    assert list_tasks(tasks_dir) == ["t_min"]


def test_the_local_base_model_has_its_own_revision_apart_from_the_hubs(tasks_dir: Path) -> None:
    text = VALID_SPEC.format(task_id="t_local") + (
        'revision = "v1.0"\nlocal = "tiny-arith-lm"\nlocal_revision = "' + "c" * 40 + '"\n'
    )
    write_task(tasks_dir, "t_local", text)
    model = load_task("t_local", tasks_dir).base_model
    assert (model.revision, model.local, model.local_revision) == (
        "v1.0",
        "tiny-arith-lm",
        "c" * 40,
    )
    # Unset, each follows its own `main` branch (resolved to a commit once per episode).
    assert BaseModelSpec(repo_id="org/model", local="x").local_revision == "main"


@pytest.mark.parametrize(
    ("edit", "field", "problem"),
    [
        pytest.param(
            lambda text: text.replace('prompt = "Do the thing."\n', ""),
            "prompt",
            "Field required",
            id="missing field",
        ),
        pytest.param(
            lambda text: text.replace("time_limit_s = 3600", 'time_limit_s = "3600"'),
            "time_limit_s",
            "Input should be a valid integer",
            id="quoted number",
        ),
        pytest.param(
            lambda text: text.replace('flavors = ["cpu-basic"]', 'flavors = "cpu-basic"'),
            "flavors",
            "Input should be a valid list",
            id="string for a list",
        ),
        pytest.param(
            lambda text: text.replace("max_timeout_minutes = 30", "max_timeout_minutes = true"),
            "max_timeout_minutes",
            "Input should be a valid integer",
            id="boolean for an integer",
        ),
        pytest.param(
            lambda text: text.replace("budget_usd = 0.29", "budget_usd = 0"),
            "budget_usd",
            "Input should be greater than 0",
            id="zero budget",
        ),
        pytest.param(
            lambda text: text.replace("eval_flavor =", "max_gpus = 8\neval_flavor ="),
            "max_gpus",
            "unknown key",
            id="unknown key",
        ),
        pytest.param(
            lambda text: text + 'licence = "mit"\n',
            "base_model.licence",
            "unknown key",
            id="unknown key in base_model",
        ),
        pytest.param(
            lambda text: text.replace("SmolLM2-135M", "../../etc"),
            "base_model.repo_id",
            "String should match pattern",
            id="bad repo id",
        ),
        pytest.param(
            lambda text: text.replace('[base_model]\nrepo_id = "HuggingFaceTB/SmolLM2-135M"', ""),
            "base_model",
            "Field required",
            id="missing table",
        ),
        pytest.param(
            lambda text: text.replace('id = "t_bad"', 'id = "t_other"'),
            "id",
            "'t_other' must equal the task's folder name 't_bad'",
            id="id is not the folder name",
        ),
    ],
)
def test_a_malformed_spec_fails_naming_the_file_and_the_field(
    tasks_dir: Path, edit: Callable[[str], str], field: str, problem: str
) -> None:
    write_task(tasks_dir, "t_bad", edit(VALID_SPEC.format(task_id="t_bad")))
    with pytest.raises(TaskSpecError) as caught:
        load_task("t_bad", tasks_dir)
    message = str(caught.value)
    assert message.startswith("tasks/t_bad/task.toml: ")
    assert f"field '{field}': {problem}" in message


def test_every_failing_field_is_named(tasks_dir: Path) -> None:
    text = VALID_SPEC.format(task_id="t_bad").replace("budget_usd = 0.29", "budget_usd = -1")
    write_task(tasks_dir, "t_bad", text.replace("score_timeout_s = 600\n", ""))
    with pytest.raises(TaskSpecError) as caught:
        load_task("t_bad", tasks_dir)
    assert str(caught.value) == (
        "tasks/t_bad/task.toml: field 'budget_usd': Input should be greater than 0; "
        "field 'score_timeout_s': Field required"
    )


@pytest.mark.parametrize("evaluator", ["../other/evaluator.py", "/etc/passwd", "", "a\\..\\b"])
def test_an_evaluator_outside_the_task_folder_is_refused_at_load(
    tasks_dir: Path, evaluator: str
) -> None:
    text = VALID_SPEC.format(task_id="t_bad").replace(
        "eval_flavor =", f"evaluator = '{evaluator}'\neval_flavor ="
    )
    write_task(tasks_dir, "t_bad", text)
    with pytest.raises(TaskSpecError, match=r"field 'evaluator': .* relative path inside"):
        load_task("t_bad", tasks_dir)


def test_invalid_toml_fails_naming_the_file(tasks_dir: Path) -> None:
    write_task(tasks_dir, "t_bad", VALID_SPEC.format(task_id="t_bad") + "budget_usd = = 1\n")
    with pytest.raises(TaskSpecError, match=r"^tasks/t_bad/task\.toml: not valid TOML"):
        load_task("t_bad", tasks_dir)


def test_an_unknown_task_id_names_the_known_ones() -> None:
    with pytest.raises(TaskSpecError) as caught:
        load_task("t9_nothing")
    assert str(caught.value) == f"unknown task 't9_nothing'; known tasks: {', '.join(list_tasks())}"
    assert "t0_arithmetic_format, t0_arithmetic_format_tiny, t0_artifact" in str(caught.value)


def test_a_folder_without_task_toml_is_not_a_task(tasks_dir: Path) -> None:
    (tasks_dir / "t_empty").mkdir()
    (tasks_dir / "__pycache__").mkdir()
    write_task(tasks_dir, "t_real", VALID_SPEC.format(task_id="t_real"))
    assert list_tasks(tasks_dir) == ["t_real"]
    with pytest.raises(TaskSpecError, match=r"unknown task 't_empty'; known tasks: t_real$"):
        load_task("t_empty", tasks_dir)


@pytest.mark.parametrize(
    "task_id",
    [
        "../x",
        "..",
        "t0_artifact/../t0_artifact",
        "/etc/passwd",
        "T0_ARTIFACT",
        "t0-artifact",
        "",
        "t0_artifact\n",
        "t0_artifact/task.toml",
        "./t0_artifact",
    ],
)
def test_a_task_id_that_could_be_a_path_is_refused(tasks_dir: Path, task_id: str) -> None:
    # A spec where traversal from tasks_dir would land: the id must never reach the filesystem.
    write_task(tasks_dir.parent, "x", VALID_SPEC.format(task_id="x"))
    write_task(tasks_dir, "t0_artifact", VALID_SPEC.format(task_id="t0_artifact"))
    with pytest.raises(TaskSpecError) as caught:
        load_task(task_id, tasks_dir)
    assert str(caught.value).startswith(f"invalid task id {task_id!r}: ")
    assert str(caught.value).endswith("known tasks: t0_artifact")


def test_a_missing_evaluator_gives_a_clear_error(tasks_dir: Path) -> None:
    # Load succeeds; only an evaluation could not start.
    write_task(tasks_dir, "t_none", VALID_SPEC.format(task_id="t_none"))
    spec = load_task("t_none", tasks_dir)
    with pytest.raises(TaskSpecError) as caught:
        evaluator_path(spec, tasks_dir)
    assert str(caught.value) == (
        "task 't_none' has no evaluator: tasks/t_none/evaluator.py does not exist "
        "(field 'evaluator' = 'evaluator.py' in tasks/t_none/task.toml); "
        "this task cannot be evaluated until it is added"
    )


def test_t0_artifact_has_its_evaluator() -> None:
    spec = load_task("t0_artifact")
    assert evaluator_path(spec) == TASKS_DIR / "t0_artifact" / "evaluator.py"


def test_an_existing_evaluator_is_found(tasks_dir: Path) -> None:
    write_task(tasks_dir, "t_ok", VALID_SPEC.format(task_id="t_ok"))
    (tasks_dir / "t_ok" / "evaluator.py").write_text("print('hi')\n", encoding="utf-8")
    spec = load_task("t_ok", tasks_dir)
    assert evaluator_path(spec, tasks_dir) == tasks_dir / "t_ok" / "evaluator.py"


def test_an_evaluator_symlink_leading_out_of_the_task_is_refused(tasks_dir: Path) -> None:
    write_task(tasks_dir, "t_link", VALID_SPEC.format(task_id="t_link"))
    outside = tasks_dir.parent / "outside.py"
    outside.write_text("print('hi')\n", encoding="utf-8")
    (tasks_dir / "t_link" / "evaluator.py").symlink_to(outside)
    spec = load_task("t_link", tasks_dir)
    with pytest.raises(TaskSpecError, match=re.escape("leads outside the task's folder")):
        evaluator_path(spec, tasks_dir)


def test_an_evaluator_path_built_outside_load_is_still_checked(tasks_dir: Path) -> None:
    spec = TaskSpec.model_validate(
        {
            "id": "t_hand",
            "prompt": "p",
            "base_model": {"repo_id": "a/b"},
            "flavors": ["cpu-basic"],
            "budget_usd": 1,
            "time_limit_s": 60,
            "score_timeout_s": 60,
            "max_timeout_minutes": 1,
            "eval_flavor": "cpu-basic",
            "eval_timeout_minutes": 1,
            "evaluator": "../../outside.py",
        }
    )
    with pytest.raises(TaskSpecError, match="relative path inside the task's folder"):
        evaluator_path(spec, tasks_dir)
