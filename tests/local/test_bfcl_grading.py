"""The real tool-calling member grades on CPU here (issue 44; slow: it installs torch into a venv
and generates 125,000 tokens): `t1_tool_call`'s own evaluator, assembled from its own spec after
`posttrain-env tasks fetch t1_tool_call` (BFCL v4's files from the bfcl-eval wheel embedded in
the one file a grader runs), with its own parameters (`engine = "auto"`, batches of 32, 256 new
tokens), on a tiny generated model. What differs from its GPU flavor is only what the engine
finds: no CUDA and no vLLM here, so "auto" takes transformers on the CPU, as it does on a GPU
where vLLM cannot start. The environment has the evaluator's pinned packages except the GPU
engine (vLLM's GPU build cannot install here; tests/local/test_vllm_engine.py runs vLLM's CPU
build). Measured at load ~2 on two cores: the hidden split, 400 items and 100,022 generated
tokens, in 12.3-21.8 s of evaluator time; the dev split, 100 items, in 10.1-10.6 s."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from job_launcher.requirements import script_dependencies
from job_launcher.trusted_lines import SCORE_TAG, ScoreReading, read_score
from posttrain_server.commands.tasks_fetch import default_cache, run_fetch
from tasks.models.tiny_tool_lm import write_tiny_tool_model
from tasks.registry import TASKS_DIR, evaluator_script, load_task
from tests.local.conftest import JOB_PYTHON
from tests.local.test_arithmetic_format import torch_wheels

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

NONCE = "nonce-bfcl"


@pytest.fixture(scope="module")
def fetched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tasks_dir = tmp_path_factory.mktemp("bfcl") / "tasks"
    shutil.copytree(TASKS_DIR, tasks_dir, ignore=shutil.ignore_patterns("__pycache__", "bfcl*"))
    args = argparse.Namespace(tasks_command="fetch", task="t1_tool_call", cache=default_cache())
    assert run_fetch(args, tasks_dir) == 0
    return tasks_dir


@pytest.fixture(scope="module")
def script(fetched: Path) -> str:
    return evaluator_script(load_task("t1_tool_call", fetched), fetched)


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory, script: str) -> Path:
    """A venv with the real evaluator's pinned packages but the GPU engine (vLLM)."""
    packages = [d for d in script_dependencies(script) if not d.startswith("vllm")]
    assert any(d.startswith("vllm") for d in script_dependencies(script))  # "auto" asks for it
    venv = tmp_path_factory.mktemp("bfcl-venv") / "venv"
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    subprocess.run([uv, "venv", "-q", "-p", JOB_PYTHON, str(venv)], check=True, timeout=120)
    links = [arg for folder in torch_wheels() for arg in ("--find-links", folder)]
    subprocess.run(
        [uv, "pip", "install", "-q", "-p", str(venv / "bin" / "python"), *links, *packages],
        check=True,
        timeout=900,
    )
    return venv / "bin" / "python"


def grade(python: Path, script: str, folder: Path, *, hidden: bool) -> ScoreReading:
    """The evaluator as a grader (or dev) job runs it, on the tiny model's own weights."""
    base, model = folder / "base", folder / "model"
    write_tiny_tool_model(base)
    model.mkdir()
    shutil.copy(base / "model.safetensors", model)
    (folder / "evaluator.py").write_text(script)
    spec = load_task("t1_tool_call")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(folder),
        "HF_HUB_OFFLINE": "1",
        "POSTTRAIN_NONCE": NONCE,
        "POSTTRAIN_MODEL_DIR": str(model),
        "POSTTRAIN_BASE_MODEL_DIR": str(base),
        "POSTTRAIN_TASK_PARAMS": json.dumps(spec.evaluation),
        **({"POSTTRAIN_HIDDEN_SPLIT_SEED": "a-grader-only-seed"} if hidden else {}),
    }
    done = subprocess.run(
        [str(python), str(folder / "evaluator.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len([line for line in lines if line.startswith(SCORE_TAG)]) == 1
    return read_score(lines, NONCE)


@pytest.mark.parametrize(("hidden", "n"), [(True, 400), (False, 100)])
def test_the_real_member_grades_a_tiny_model_on_bfcls_items_from_the_wheel(
    python: Path, script: str, tmp_path: Path, hidden: bool, n: int
) -> None:
    reading = grade(python, script, tmp_path, hidden=hidden)
    details = reading.details
    print(f"split {details['split']}: {details}")
    assert reading.valid and details["artifact_valid"] is True
    assert details["split"] == ("hidden" if hidden else "dev") and details["n"] == n
    assert details["engine"] == "transformers" and details["device"] == "cpu"
    # An untrained model calls nothing: every reply scored, none a call.
    assert details["generated_tokens"] > n * 100 and reading.score == 0.0
    assert details["parsed"] == 0 and details["correct"] == 0
