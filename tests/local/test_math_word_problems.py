"""math_word_problems_tiny for real, on the local backend (slow: it trains a model).

The family's reference solution runs as an agent job through the real launcher (installing the
CPU build of torch from this machine's wheels), and the family's evaluator as dev and grader
jobs: the trained checkpoint must beat the unchanged base model on both splits. A run that
trains on the public test set leaves it in its outputs, where the contamination check finds it
(read through the local backend, as the check reads it); the reference run's outputs hold no
test problem. The generation kit's engine switch, in the evaluator's own venv: "vllm" where
vLLM is not installed is the grader's fault (exit 2, no score), "auto" takes transformers on the
CPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from activities.backends.local.backend import LocalBackend
from activities.contamination.activities import load_test_items
from activities.contamination.scan import Scan
from activities.jobs.activities import HIDDEN_SEED_SECRET, TASK_PARAMS_ENV
from job_launcher.trusted_lines import NONCE_ENV, SCORE_TAG, ScoreReading, read_score
from posttrain_common.contracts.jobs import JobRole
from tasks.models.tiny_math_lm import generate
from tasks.registry import TASKS_DIR, evaluator_script, load_task, test_items_path
from tests.local.conftest import JOB_PYTHON, TEST_BWRAP, Jobs
from tests.local.test_arithmetic_format import ROOMY, model_python, torch_wheels

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

TASK = load_task("math_word_problems_tiny")
FAMILY = TASKS_DIR / "math_word_problems"
REFERENCE = (FAMILY / "reference_solution.py").read_text()
# The same solution trained on the public test set (and briefly: its outputs are what counts).
CONTAMINATED = REFERENCE.replace('TRAIN_SPLIT = "train"', 'TRAIN_SPLIT = "test"').replace(
    '"steps": 1200', '"steps": 5'
)
EVALUATOR = evaluator_script(TASK)
PARAMS = json.dumps(TASK.evaluation)
# What "learned" means here: the base model answers nothing (0); trained, it must do clearly
# better than guessing a number from 0 to 40.
LEARNED = 0.2

__all__ = ["model_python"]  # the venv fixture, shared with the arithmetic family's tests


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    state = tmp_path_factory.mktemp("math") / "state" / "local"
    base = tmp_path_factory.mktemp("tiny-math")
    generate(base)
    backend = LocalBackend(
        state, job_python=JOB_PYTHON, limits=ROOMY, bwrap=TEST_BWRAP, find_links=torch_wheels()
    )
    return Jobs(backend, base)


def evaluate(jobs: Jobs, artifact_ref: str, role: str) -> tuple[ScoreReading, list[str]]:
    nonce = os.urandom(16).hex()
    job = jobs.run(
        EVALUATOR,
        role=JobRole(role),
        artifact_ref=artifact_ref,
        env={NONCE_ENV: nonce, TASK_PARAMS_ENV: PARAMS},
        secrets={HIDDEN_SEED_SECRET: "a-grader-only-seed"} if role == "grader" else {},
        timeout_s=900,
        timeout=900,
    )
    log = jobs.logs(job.ref, 10_000)
    assert job.state.value == "succeeded", log[-30:]
    return read_score(log, nonce), log


@pytest.fixture(scope="module")
def trained(jobs: Jobs) -> str:
    job = jobs.run(REFERENCE, timeout_s=1800, timeout=1800)
    assert job.state.value == "succeeded", jobs.logs(job.ref, 60)
    return job.ref


@pytest.fixture(scope="module")
def unchanged(jobs: Jobs) -> str:
    copy = "import shutil\nshutil.copy('/base_model/model.safetensors', '/data/outputs/')\n"
    job = jobs.run(copy, timeout=120)
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    return job.ref


def test_the_reference_solution_beats_the_base_model_on_both_splits(
    jobs: Jobs, trained: str, unchanged: str
) -> None:
    scores, seconds = {}, {}
    for name, ref in (("trained", trained), ("base", unchanged)):
        for role in ("dev", "grader"):
            reading, log = evaluate(jobs, ref, role)
            assert reading.valid, (reading.reason, log[-20:])
            assert reading.details["artifact_valid"] is True
            assert (
                reading.details["n"]
                == TASK.evaluation["dev_items" if role == "dev" else "test_items"]
            )
            scores[name, role] = reading.score
            seconds[name, role] = reading.details["elapsed_s"]
    print(f"scores: {scores}; evaluator seconds (checks and generation): {seconds}")
    assert scores["base", "dev"] == 0.0 and scores["base", "grader"] == 0.0
    assert scores["trained", "dev"] >= LEARNED and scores["trained", "grader"] >= LEARNED


def scan_outputs(jobs: Jobs, ref: str) -> list[str]:
    """The test problems the contamination check finds in the job's outputs (read through the
    backend, as the check reads them), under the task's n-gram and threshold."""
    spec = TASK.contamination
    assert spec is not None
    items = load_test_items(test_items_path(TASK.id, TASK.family, spec))
    scan = Scan(items, spec.ngram, spec.threshold)
    read = asyncio.run(jobs.backend.read_outputs(ref, 32 << 20))
    assert not read.cut and "train.jsonl" in [path for path, _ in read.files]
    for path, data in read.files:
        scan.feed_bytes(f"outputs/{path}", data)
    return [match.item_id for match in scan.matches()]


def test_a_run_on_the_test_set_is_found_in_its_outputs_and_the_reference_run_is_not(
    jobs: Jobs, trained: str
) -> None:
    contaminated = jobs.run(CONTAMINATED, timeout_s=1800, timeout=1800)
    assert contaminated.state.value == "succeeded", jobs.logs(contaminated.ref, 60)
    assert len(scan_outputs(jobs, contaminated.ref)) == TASK.evaluation["test_items"]
    assert scan_outputs(jobs, trained) == []


def evaluator_process(
    python: Path, base: Path, model: Path, params: str
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(model.parent),
        "HF_HUB_OFFLINE": "1",
        "POSTTRAIN_NONCE": "nonce-1",
        "POSTTRAIN_MODEL_DIR": str(model),
        "POSTTRAIN_BASE_MODEL_DIR": str(base),
        "POSTTRAIN_TASK_PARAMS": params,
    }
    script = model.parent / "evaluator.py"
    script.write_text(EVALUATOR)
    return subprocess.run(
        [str(python), str(script)], env=env, capture_output=True, text=True, timeout=900
    )


def test_the_engine_switch_in_the_evaluators_own_venv(
    jobs: Jobs, model_python: Path, tmp_path: Path
) -> None:
    base = jobs.backend.hub.path("models", "test/base", jobs.model.revision)
    artifact = tmp_path / "copy"
    artifact.mkdir()
    shutil.copy(base / "model.safetensors", artifact)
    asked = json.dumps({**TASK.evaluation, "engine": "vllm"})
    done = evaluator_process(model_python, base, artifact, asked)
    assert done.returncode == 2 and SCORE_TAG not in done.stdout
    assert "engine 'vllm' was asked for but vLLM is not installed" in done.stderr
    auto = json.dumps({**TASK.evaluation, "engine": "auto"})
    done = evaluator_process(model_python, base, artifact, auto)
    assert done.returncode == 0, done.stderr[-3000:]
    reading = read_score(done.stdout.splitlines(), "nonce-1")
    assert reading.valid and reading.details["engine"] == "transformers"
    assert reading.details["device"] == "cpu" and reading.details["artifact_valid"] is True


def test_weights_that_are_not_finite_score_0_before_the_model_runs(
    jobs: Jobs, model_python: Path, tmp_path: Path
) -> None:
    from tasks.evaluator_kit import read_tensor_set, write_safetensors

    base = jobs.backend.hub.path("models", "test/base", jobs.model.revision)
    tensors = {}
    for name, info in read_tensor_set(base).items():
        with open(info.path, "rb") as source:
            source.seek(info.begin)
            data = source.read(info.nbytes)
        if name == "model.norm.weight":
            data = b"\x00\x00\xc0\x7f" + data[4:]  # a NaN
        tensors[name] = (info.dtype, info.shape, data)
    poisoned = tmp_path / "nan" / "outputs"
    poisoned.mkdir(parents=True)
    write_safetensors(poisoned / "model.safetensors", tensors)
    done = evaluator_process(model_python, base, poisoned, PARAMS)
    assert done.returncode == 0, done.stderr[-3000:]
    reading = read_score(done.stdout.splitlines(), "nonce-1")
    assert reading.score == 0.0 and reading.details["artifact_valid"] is False
    assert "NaN or inf" in reading.details["reason"]
