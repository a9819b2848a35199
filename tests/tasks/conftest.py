"""Fixtures for the task tests: the tiny model, the assembled evaluator run as a job runs it."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from job_launcher.trusted_lines import SCORE_TAG, ScoreReading, read_score
from tasks.registry import TASKS_DIR, evaluator_script, generated_model, load_task

NONCE = "n0nce-0123456789abcdef"
REFERENCE_SOLUTION = TASKS_DIR / "t0_artifact" / "reference_solution.py"
# The interpreter local jobs use (DESIGN §9); the evaluator must run on it with nothing installed.
JOB_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


@dataclass(frozen=True)
class EvaluatorRun:
    returncode: int
    stdout: str
    stderr: str
    reading: ScoreReading

    @property
    def score_lines(self) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith(SCORE_TAG)]


Evaluate = Callable[..., EvaluatorRun]


def local_base_model(task_id: str, factory: pytest.TempPathFactory) -> Path:
    """The base model that the task declares for the local backend, generated in a new folder."""
    local = load_task(task_id).base_model.local
    generate = generated_model(local) if local else None
    assert generate is not None, f"{task_id} declares no generated local base model"
    folder = factory.mktemp(local)
    generate(folder)
    return folder


def grader_file(task_id: str, factory: pytest.TempPathFactory) -> Path:
    """The one file a grader job of the task uploads, written outside the repository."""
    path = factory.mktemp("grader") / "evaluator.py"
    path.write_text(evaluator_script(load_task(task_id)), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return local_base_model("t0_artifact", tmp_path_factory)


@pytest.fixture(scope="session")
def evaluator_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return grader_file("t0_artifact", tmp_path_factory)


def solve(base: Path, outputs: Path) -> Path:
    """Run the reference solution as a job would (its paths given on the command line)."""
    subprocess.run(
        [JOB_PYTHON, "-I", str(REFERENCE_SOLUTION), str(base), str(outputs)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return outputs


@pytest.fixture(scope="session")
def solved(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return solve(tiny_model, tmp_path_factory.mktemp("outputs"))


@pytest.fixture
def evaluate(evaluator_file: Path, tiny_model: Path) -> Evaluate:
    """Run the assembled evaluator with `python3 -I` (no repository on the path)."""

    def run(
        model_dir: Path,
        *,
        base_dir: Path | None = None,
        seed: str | None = None,
        nonce: str | None = NONCE,
    ) -> EvaluatorRun:
        env = {
            "PATH": "/usr/bin:/bin",
            "POSTTRAIN_MODEL_DIR": str(model_dir),
            "POSTTRAIN_BASE_MODEL_DIR": str(base_dir or tiny_model),
        }
        if nonce is not None:
            env["POSTTRAIN_NONCE"] = nonce
        if seed is not None:
            env["POSTTRAIN_HIDDEN_SPLIT_SEED"] = seed
        done = subprocess.run(
            [JOB_PYTHON, "-I", str(evaluator_file)],
            env=env,
            cwd=evaluator_file.parent,
            capture_output=True,
            text=True,
            timeout=120,
        )
        reading = read_score(done.stdout.splitlines(), nonce or NONCE)
        return EvaluatorRun(done.returncode, done.stdout, done.stderr, reading)

    return run


def load_module(path: Path, name: str) -> ModuleType:
    """A task's script (an evaluator, a reference solution) imported as module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_weights(source: Path, target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for path in source.glob("*.safetensors"):
        shutil.copyfile(path, target / path.name)
    return target
