"""The arithmetic-format family's evaluator without a model run: its splits, its parameters, and
the artifacts it refuses before any model code runs (the job interpreter alone, no torch)."""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from job_launcher.trusted_lines import SCORE_TAG, read_score
from tasks.registry import TASKS_DIR, load_task

from .conftest import JOB_PYTHON, NONCE, grader_file, load_module, local_base_model

FAMILY = TASKS_DIR / "t0_arithmetic_format"


EVALUATOR = load_module(FAMILY / "evaluator.py", "arithmetic_evaluator")
REFERENCE = load_module(FAMILY / "reference_solution.py", "arithmetic_reference")


def params(task_id: str) -> dict:
    return EVALUATOR.task_params(json.dumps(load_task(task_id).evaluation))


@pytest.mark.parametrize("task_id", ["t0_arithmetic_format", "t0_arithmetic_format_tiny"])
def test_the_hidden_split_never_holds_a_dev_question_and_follows_its_seed(task_id: str) -> None:
    p = params(task_id)
    dev = EVALUATOR.items(p, None)
    hidden = EVALUATOR.items(p, "grader-seed-1")
    assert len(dev) == p["dev_items"] and len(hidden) == p["hidden_items"]
    assert not {q for q, _ in dev} & {q for q, _ in hidden}
    assert EVALUATOR.items(p, "grader-seed-1") == hidden  # the seed decides
    assert EVALUATOR.items(p, "grader-seed-2") != hidden
    assert EVALUATOR.items(p, None) == dev  # the public split is fixed


def test_questions_follow_the_members_distributions() -> None:
    tiny = EVALUATOR.items(params("t0_arithmetic_format_tiny"), "s")
    for text, answer in tiny:
        a, op, b = text.removeprefix("What is ").removesuffix("?").split()
        assert 0 <= int(a) <= 20 and 0 <= int(b) <= 20 and op in "+-"
        assert answer == (int(a) + int(b) if op == "+" else int(a) - int(b))
    full = EVALUATOR.items(params("t0_arithmetic_format"), "s")
    assert any("(" in text for text, _ in full) and any("*" in text for text, _ in full)
    for text, answer in full:
        expression = text.removeprefix("What is ").removesuffix("?")
        assert eval(expression, {"__builtins__": {}}) == answer


@pytest.mark.parametrize("task_id", ["t0_arithmetic_format", "t0_arithmetic_format_tiny"])
def test_the_reference_solution_trains_on_the_evaluators_distribution(task_id: str) -> None:
    profile = REFERENCE.PROFILES["tiny" if task_id.endswith("tiny") else "full"]
    p = params(task_id)
    for key in ("max_operand", "operators", "max_operations"):
        assert profile[key] == p[key]
    for seed in range(3):
        a, b = random.Random(seed), random.Random(seed)
        assert [EVALUATOR.question(a, p) for _ in range(50)] == [
            REFERENCE.question(b, profile) for _ in range(50)
        ]


# -- the evaluator as a job runs it, on artifacts it refuses before any model code --------------


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return local_base_model("t0_arithmetic_format_tiny", tmp_path_factory)


@pytest.fixture(scope="module")
def evaluator_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return grader_file("t0_arithmetic_format_tiny", tmp_path_factory)


def run_evaluator(
    evaluator_file: Path, base: Path, model: Path, *, seed: str | None = None, raw_params=None
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "POSTTRAIN_NONCE": NONCE,
        "POSTTRAIN_MODEL_DIR": str(model),
        "POSTTRAIN_BASE_MODEL_DIR": str(base),
        "POSTTRAIN_TASK_PARAMS": raw_params
        if raw_params is not None
        else json.dumps(load_task("t0_arithmetic_format_tiny").evaluation),
    }
    if seed is not None:
        env["POSTTRAIN_HIDDEN_SPLIT_SEED"] = seed
    return subprocess.run(
        [JOB_PYTHON, "-I", str(evaluator_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def refused(run: subprocess.CompletedProcess[str]) -> dict:
    """The score line's payload, which must say: score 0, artifact invalid."""
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith(SCORE_TAG)]
    assert len(lines) == 1, run.stdout
    reading = read_score(run.stdout.splitlines(), NONCE)
    assert reading.valid and reading.score == 0.0
    assert reading.details["artifact_valid"] is False
    assert reading.details["n"] > 0 and reading.details["correct"] == 0
    return reading.details


def test_pickle_only_weights_are_never_opened_and_score_0(
    evaluator_file: Path, base_model: Path, tmp_path: Path
) -> None:
    artifact = tmp_path / "pickled"
    artifact.mkdir()
    # A pickle that would run code if anything unpickled it.
    (artifact / "pytorch_model.bin").write_bytes(b"cos\nsystem\n(S'touch /tmp/pwned'\ntR.")
    details = refused(run_evaluator(evaluator_file, base_model, artifact))
    assert "no .safetensors file" in details["reason"]


def test_wrong_shapes_score_0_before_any_model_code(
    evaluator_file: Path, base_model: Path, tmp_path: Path
) -> None:
    from tasks.evaluator_kit import read_tensor_set, write_safetensors

    tensors = {}
    for name, info in read_tensor_set(base_model).items():
        shape = (info.shape[0] + 1, *info.shape[1:]) if name == "lm_head.weight" else info.shape
        count = 1
        for dim in shape:
            count *= dim
        tensors[name] = ("F32", shape, b"\0" * 4 * count)
    artifact = tmp_path / "reshaped"
    artifact.mkdir()
    write_safetensors(artifact / "model.safetensors", tensors)
    details = refused(run_evaluator(evaluator_file, base_model, artifact))
    assert "lm_head.weight" in details["reason"] and "dtype or shape" in details["reason"]


def header_file(artifact: Path, entries: list[str]) -> None:
    """One model.safetensors whose header holds the given tensor entries (raw JSON)."""
    artifact.mkdir()
    raw = ("{" + ", ".join(entries) + "}").encode()
    (artifact / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)


def entry(name: str, shape: str) -> str:
    return f'"{name}": {{"dtype": "F32", "shape": {shape}, "data_offsets": [0, 4]}}'


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        # The header found in review (25.8 MB): past the header budget the base model sets.
        ([entry("lm_head.weight", "[" + ", ".join(["9" * 4299] * 6000) + "]")], "bytes left of"),
        ([entry("lm_head.weight", json.dumps([2] * 40))], "dimensions"),
        ([entry("lm_head.weight", json.dumps([10**19] * 16))], "need more than"),
        # Huge dimension counts across many tensors, within the budget (~0.6 MB): refused by
        # the first tensor's size, whatever follows.
        ([entry(f"t{n}", json.dumps([10**19] * 16)) for n in range(1500)], "need more than"),
        # The same beyond the budget (~6 MB): refused before the header is read.
        ([entry(f"t{n}", json.dumps([10**19] * 16)) for n in range(15_000)], "bytes left of"),
    ],
    ids=[
        "review",
        "many-dimensions",
        "huge-dimensions",
        "many-tensors",
        "many-tensors-past-budget",
    ],
)
def test_a_header_that_claims_huge_tensors_scores_0_within_seconds(
    evaluator_file: Path, base_model: Path, tmp_path: Path, entries: list[str], problem: str
) -> None:
    artifact = tmp_path / "crafted"
    header_file(artifact, entries)
    started = time.monotonic()
    details = refused(run_evaluator(evaluator_file, base_model, artifact))
    assert problem in details["reason"]
    assert time.monotonic() - started < 30  # not the grader's timeout


def test_without_torch_the_grader_fails_unscored_never_the_artifact(
    evaluator_file: Path, base_model: Path, tmp_path: Path
) -> None:
    """The job interpreter has no torch: the value check cannot run, which is the grader's
    fault (exit 2, no score line: score_failed), not a 0 for a valid artifact."""
    missing = subprocess.run([JOB_PYTHON, "-I", "-c", "import torch"], capture_output=True)
    assert missing.returncode != 0, "this test needs an interpreter without torch"
    artifact = tmp_path / "copy"
    artifact.mkdir()
    shutil.copy(base_model / "model.safetensors", artifact)
    run = run_evaluator(evaluator_file, base_model, artifact)
    assert run.returncode == 2 and SCORE_TAG not in run.stdout
    assert "the grader cannot import torch" in run.stderr
    assert "No module named 'torch'" in run.stderr


def test_a_check_child_past_its_cpu_time_on_the_artifact_scores_0_as_invalid(
    base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the artifact is bounded whatever its bytes say; if it ever were not, the check
    child's CPU-time cap ends it as the artifact's fault (a reader that never ends stands in for
    an artifact that makes it work forever)."""
    artifact = tmp_path / "endless"
    artifact.mkdir()
    shutil.copy(base_model / "model.safetensors", artifact)
    real_reader = EVALUATOR.read_tensor_set

    def reader(folder: Path, **options):
        while folder == artifact:
            pass
        return real_reader(folder, **options)

    monkeypatch.setattr(EVALUATOR, "read_tensor_set", reader)
    monkeypatch.setattr(EVALUATOR, "CHECK_CPU_SECONDS", 1)
    environ = {
        "POSTTRAIN_NONCE": NONCE,
        "POSTTRAIN_MODEL_DIR": str(artifact),
        "POSTTRAIN_BASE_MODEL_DIR": str(base_model),
        "POSTTRAIN_TASK_PARAMS": json.dumps(load_task("t0_arithmetic_format_tiny").evaluation),
    }
    reading = read_score([EVALUATOR.evaluate(environ)], NONCE)
    assert reading.valid and reading.score == 0.0
    assert reading.details["artifact_valid"] is False
    assert reading.details["reason"] == "the evaluation used up its 1 s of CPU time"


def test_malformed_parameters_are_the_graders_fault(
    evaluator_file: Path, base_model: Path, tmp_path: Path
) -> None:
    artifact = tmp_path / "copy"
    artifact.mkdir()
    shutil.copy(base_model / "model.safetensors", artifact)
    run = run_evaluator(evaluator_file, base_model, artifact, raw_params='{"unknown": 1}')
    assert run.returncode == 2 and SCORE_TAG not in run.stdout


@pytest.mark.parametrize("stage", ["", "base model"])
def test_a_check_child_that_fails_before_the_artifact_is_the_graders_fault(stage: str) -> None:
    """Out of memory while checking the base model's own weights (or before anything) says
    nothing about the artifact: score_failed, never a 0."""
    from tasks.evaluator_kit import Isolated

    failed = Isolated(False, None, "the evaluation ran out of memory", stage)
    with pytest.raises(EVALUATOR.GraderFault, match="failed before reading the artifact"):
        EVALUATOR.verdict(failed, "the value check")
    on_artifact = failed._replace(stage=EVALUATOR.ON_ARTIFACT)
    assert EVALUATOR.verdict(on_artifact, "the value check") == {
        "artifact_valid": False,
        "reason": "the evaluation ran out of memory",
    }
