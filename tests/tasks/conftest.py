"""Fixtures for the task tests: the tiny model, the assembled evaluator run as a job runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from job_launcher.trusted_lines import SCORE_TAG, ScoreReading, read_score
from tasks.registry import TASKS_DIR, evaluator_script, load_task
from tasks.tiny_model import write_tiny_model

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


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-model")
    write_tiny_model(folder)
    return folder


@pytest.fixture(scope="session")
def evaluator_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one file a grader job uploads, written outside the repository."""
    path = tmp_path_factory.mktemp("grader") / "evaluator.py"
    path.write_text(evaluator_script(load_task("t0_artifact")), encoding="utf-8")
    return path


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


def copy_weights(source: Path, target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for path in source.glob("*.safetensors"):
        shutil.copyfile(path, target / path.name)
    return target
