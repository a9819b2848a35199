"""The math word problems family's evaluator without a model run: its splits, the shipped test
set, final-answer extraction and exact match, its parameters, and the artifacts it refuses
before any model code runs (the job interpreter alone, no torch)."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from job_launcher.requirements import script_dependencies
from job_launcher.trusted_lines import SCORE_TAG, read_score
from tasks.generation_kit import VLLM_REQUIREMENT
from tasks.registry import TASKS_DIR, evaluator_script, load_task

from .conftest import JOB_PYTHON, NONCE, grader_file, load_module, local_base_model
from .test_arithmetic_format import entry, header_file

FAMILY = TASKS_DIR / "math_word_problems"
TINY = "math_word_problems_tiny"
EVALUATOR = load_module(FAMILY / "evaluator.py", "math_evaluator")
REFERENCE = load_module(FAMILY / "reference_solution.py", "math_reference")


def params(task_id: str) -> dict:
    return EVALUATOR.task_params(json.dumps(load_task(task_id).evaluation))


def test_the_tiny_splits_are_fixed_public_and_disjoint() -> None:
    p = params(TINY)
    dev = EVALUATOR.items(p, hidden=False)
    hidden = EVALUATOR.items(p, hidden=True)
    assert len(dev) == p["dev_items"] == 100 and len(hidden) == p["test_items"] == 200
    assert EVALUATOR.items(p, hidden=True) == hidden  # no seed: the public test set
    assert not {q for _, q, _ in dev} & {q for _, q, _ in hidden}
    # The dev split is a slice of the train set, whose people are never the test set's.
    assert dev == EVALUATOR.tiny_problems("train", 5000)[:100]
    for _, question, _ in dev:
        assert question.split()[0] not in EVALUATOR.TEST_NAMES
    for _, question, answer in hidden:
        assert question.split()[0] in EVALUATOR.TEST_NAMES and int(answer) >= 0


def test_every_tiny_problem_is_the_prompts_distribution_and_its_answer_is_right() -> None:
    pattern = (
        r"(\w+) (?:has|had) (\d+) (\w+)(?:\. \1 gets| and found| and gives|, then lost)"
        r" (\d+)"
    )
    for _, question, answer in EVALUATOR.tiny_problems("train", 2000) + EVALUATOR.items(
        params(TINY), hidden=True
    ):
        match = re.match(pattern, question)
        assert match, question
        a, b = int(match.group(2)), int(match.group(4))
        assert 0 <= a <= 20 and 0 <= b <= 20 and match.group(3) in EVALUATOR.THINGS
        adds = "more" in question
        assert int(answer) == (a + b if adds else a - b)
        assert len(question) <= 72  # the tiny model's 128 positions hold the prompt and reply


def test_the_shipped_test_set_is_the_evaluators_hidden_split() -> None:
    shipped = [json.loads(line) for line in (FAMILY / "tiny_test.jsonl").read_text().splitlines()]
    hidden = EVALUATOR.items(params(TINY), hidden=True)
    assert [(i["id"], i["text"], i["answer"]) for i in shipped] == hidden
    spec = load_task(TINY).contamination
    assert spec is not None and spec.test_items == "tiny_test.jsonl"


def test_the_reference_solution_trains_on_the_evaluators_train_set() -> None:
    for split in ("train", "test"):
        theirs = REFERENCE.tiny_problems(split, 300)
        assert [q for q, _ in theirs] == [q for _, q, _ in EVALUATOR.tiny_problems(split, 300)]
        for (_, question, answer), (_, reply) in zip(
            EVALUATOR.tiny_problems(split, 300), theirs, strict=True
        ):
            assert EVALUATOR.is_correct(reply, answer), (question, reply)
    assert REFERENCE.TRAIN_SPLIT == "train"
    assert REFERENCE.INSTRUCTION == load_task("math_word_problems").evaluation["instruction"]
    for seed in range(3):
        a, b = random.Random(seed), random.Random(seed)
        names = EVALUATOR.NAMES
        assert [EVALUATOR.tiny_problem(a, names) for _ in range(50)] == [
            REFERENCE.tiny_problem(b, names) for _ in range(50)
        ]


@pytest.mark.parametrize(
    ("reply", "reference", "right"),
    [
        ("#### 7", "7", True),
        ("3 + 4 = 7\n#### 7", "7", True),
        ("#### 6\nno wait\n#### 7", "7", True),  # the last one counts
        ("#### 7\n#### 6", "7", False),
        ("####7.", "7", True),
        ("#### 1,234", "1234", True),
        ("#### 18.00", "18", True),
        ("#### -3", "-3", True),
        ("#### 7.5", "7", False),
        ("The answer is 7", "7", False),  # no ####: no answer
        ("####", "7", False),
        ("#### seven", "7", False),
    ],
)
def test_the_final_answer_is_the_number_after_the_last_marker(
    reply: str, reference: str, right: bool
) -> None:
    assert EVALUATOR.is_correct(reply, reference) is right


def test_malformed_parameters_are_the_graders_fault() -> None:
    for raw in ('{"unknown": 1}', '{"source": "web"}', '{"dev_items": 0}', "[", '{"engine": "x"}'):
        with pytest.raises(EVALUATOR.GraderFault):
            p = EVALUATOR.task_params(raw)
            EVALUATOR.settings_from({k: p[k] for k in EVALUATOR.GENERATION_KEYS})


def test_the_gsm8k_member_reads_its_mounted_dataset_and_says_so_when_it_is_not_there(
    tmp_path: Path,
) -> None:
    spec = load_task("math_word_problems")
    (mounted,) = spec.evaluation_datasets
    assert (mounted.repo_id, mounted.revision) == (
        "openai/gsm8k",
        "740312add88f781978c0658806c59bc2815b9866",
    )
    p = params("math_word_problems")
    assert p["data_dir"] == f"/datasets/{mounted.repo_id}" and p["engine"] == "auto"
    with pytest.raises(EVALUATOR.GraderFault, match=r"no GSM8K test split|pyarrow"):
        EVALUATOR.items({**p, "data_dir": str(tmp_path)}, hidden=True)


# -- the evaluator as a job runs it, on artifacts it refuses before any model code --------------


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return local_base_model(TINY, tmp_path_factory)


@pytest.fixture(scope="module")
def evaluator_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return grader_file(TINY, tmp_path_factory)


def run_evaluator(
    evaluator_file: Path, base: Path, model: Path, *, seed: str | None = "s"
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "POSTTRAIN_NONCE": NONCE,
        "POSTTRAIN_MODEL_DIR": str(model),
        "POSTTRAIN_BASE_MODEL_DIR": str(base),
        "POSTTRAIN_TASK_PARAMS": json.dumps(load_task(TINY).evaluation),
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
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith(SCORE_TAG)]
    assert len(lines) == 1, run.stdout
    reading = read_score(run.stdout.splitlines(), NONCE)
    assert reading.valid and reading.score == 0.0
    assert reading.details["artifact_valid"] is False
    assert reading.details["n"] == 200 and reading.details["correct"] == 0
    assert reading.details["split"] == "hidden"
    return reading.details


def test_the_assembled_evaluator_is_one_file_without_vllm() -> None:
    script = evaluator_script(load_task(TINY))
    assert not re.search(r"^\s*(from|import) tasks\b", script, re.MULTILINE)
    assert "vllm" not in script_dependencies(script)[0]  # the CPU member installs no vLLM
    full = script_dependencies(evaluator_script(load_task("math_word_problems")))
    assert full[:2] == [VLLM_REQUIREMENT, "pyarrow==26.0.1"]


def test_pickle_only_weights_are_never_opened_and_score_0(
    evaluator_file: Path, base_model: Path, tmp_path: Path
) -> None:
    artifact = tmp_path / "pickled"
    artifact.mkdir()
    (artifact / "pytorch_model.bin").write_bytes(b"cos\nsystem\n(S'touch /tmp/pwned'\ntR.")
    details = refused(run_evaluator(evaluator_file, base_model, artifact))
    assert "no .safetensors file" in details["reason"]


def test_weights_of_another_shape_score_0(
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
    assert "lm_head.weight" in details["reason"]


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        ([entry("lm_head.weight", "[" + ", ".join(["9" * 4299] * 6000) + "]")], "bytes left of"),
        ([entry("lm_head.weight", json.dumps([10**19] * 16))], "need more than"),
        ([entry(f"t{n}", json.dumps([10**19] * 16)) for n in range(1500)], "need more than"),
    ],
    ids=["huge-header", "huge-dimensions", "many-tensors"],
)
def test_a_hostile_header_scores_0_within_seconds(
    evaluator_file: Path, base_model: Path, tmp_path: Path, entries: list[str], problem: str
) -> None:
    artifact = tmp_path / "crafted"
    header_file(artifact, entries)
    started = time.monotonic()
    details = refused(run_evaluator(evaluator_file, base_model, artifact))
    assert problem in details["reason"]
    assert time.monotonic() - started < 30  # not the grader's timeout


def test_a_symlink_to_the_base_weights_is_not_read(
    evaluator_file: Path, base_model: Path, tmp_path: Path
) -> None:
    artifact = tmp_path / "linked"
    artifact.mkdir()
    (artifact / "model.safetensors").symlink_to(base_model / "model.safetensors")
    details = refused(run_evaluator(evaluator_file, base_model, artifact))
    assert "no .safetensors file" in details["reason"]


def test_without_torch_a_valid_artifact_is_the_graders_fault_never_a_0(
    evaluator_file: Path, base_model: Path, tmp_path: Path
) -> None:
    missing = subprocess.run([JOB_PYTHON, "-I", "-c", "import torch"], capture_output=True)
    assert missing.returncode != 0, "this test needs an interpreter without torch"
    artifact = tmp_path / "copy"
    artifact.mkdir()
    shutil.copy(base_model / "model.safetensors", artifact)
    run = run_evaluator(evaluator_file, base_model, artifact)
    assert run.returncode == 2 and SCORE_TAG not in run.stdout
    assert "the grader cannot import torch" in run.stderr
