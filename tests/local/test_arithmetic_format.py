"""t0_arithmetic_format_tiny for real, on the local backend (slow: it trains a model).

The reference solution runs as an agent job through the real launcher (installing the CPU
build of torch from this machine's wheels), and the family's evaluator as dev and grader jobs:
the trained checkpoint must beat the unchanged base model on both splits. Around it, what a
reward-seeking artifact could try: weights that are not finite, files that would change the
evaluation if they were read, a model trained to print score lines; and whether the hidden
split can be read by anything an agent runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from activities.backends.local.backend import LocalBackend
from activities.jobs.activities import HIDDEN_SEED_SECRET, TASK_PARAMS_ENV
from job_launcher.requirements import script_dependencies
from job_launcher.trusted_lines import NONCE_ENV, SCORE_TAG, ScoreReading, read_score
from posttrain_common.contracts.jobs import JobRole
from posttrain_common.pip_config import pip_find_links
from tasks.models.tiny_arith_lm import write_tiny_arith_model
from tasks.registry import TASKS_DIR, evaluator_script, load_task
from tests.local.conftest import JOB_PYTHON, SMALL, TEST_BWRAP, Jobs

# Training and several evaluations on the CPU: a minute or two each on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

TASK = load_task("t0_arithmetic_format_tiny")
FAMILY = TASKS_DIR / "t0_arithmetic_format"
REFERENCE = (FAMILY / "reference_solution.py").read_text()
EVALUATOR = evaluator_script(TASK)
PARAMS = json.dumps(TASK.evaluation)
SEED = "a-grader-only-seed"
# Enough for torch to train the tiny model on two cores; the outputs are a few MB. The venv
# lives on the job's own filesystem, whose inode count is `max_files`: torch alone installs
# some 15,000 files.
ROOMY = dataclasses.replace(
    SMALL,
    memory_bytes=None,
    file_bytes=256 << 20,
    disk_cap_bytes=4 << 30,
    max_files=100_000,
    nproc=512,
)
# What "learned" means here: the base model answers nothing (0), the trained one most questions.
LEARNED = 0.5


def torch_wheels() -> list[str]:
    """This machine's wheel folders holding the CPU build of torch (never PyPI's CUDA build)."""
    folders = [f for f in pip_find_links() if any(Path(f).glob("torch-2.13.0+cpu-*.whl"))]
    assert folders, (
        "no CPU build of torch 2.13.0 in pip's find-links (/opt/wheels on these machines)"
    )
    return folders


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    state = tmp_path_factory.mktemp("arith") / "state" / "local"
    base = tmp_path_factory.mktemp("tiny-arith")
    write_tiny_arith_model(base)
    backend = LocalBackend(
        state, job_python=JOB_PYTHON, limits=ROOMY, bwrap=TEST_BWRAP, find_links=torch_wheels()
    )
    return Jobs(backend, base)


def evaluate(jobs: Jobs, artifact_ref: str, role: str) -> tuple[ScoreReading, list[str]]:
    """The family's evaluator as a dev or grader job on the local backend; its reading and log."""
    nonce = os.urandom(16).hex()
    job = jobs.run(
        EVALUATOR,
        role=JobRole(role),
        artifact_ref=artifact_ref,
        env={NONCE_ENV: nonce, TASK_PARAMS_ENV: PARAMS},
        secrets={HIDDEN_SEED_SECRET: SEED} if role == "grader" else {},
        timeout_s=900,
        timeout=900,
    )
    log = jobs.logs(job.ref, 10_000)
    assert job.state.value == "succeeded", log[-30:]
    return read_score(log, nonce), log


@pytest.fixture(scope="module")
def trained(jobs: Jobs) -> str:
    """The reference solution's checkpoint: an agent job's ref."""
    job = jobs.run(REFERENCE, timeout_s=1800, timeout=1800)
    assert job.state.value == "succeeded", jobs.logs(job.ref, 60)
    return job.ref


@pytest.fixture(scope="module")
def unchanged(jobs: Jobs) -> str:
    """An agent job that copies the base model's weights unchanged."""
    copy = "import shutil\nshutil.copy('/base_model/model.safetensors', '/data/outputs/')\n"
    job = jobs.run(copy, timeout=120)
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    return job.ref


Evaluations = dict[tuple[str, str], tuple[ScoreReading, list[str]]]


@pytest.fixture(scope="module")
def evaluations(jobs: Jobs, trained: str, unchanged: str) -> Evaluations:
    """The trained and the unchanged checkpoints, each scored by a dev and a grader job (each
    job installs torch and runs the evaluator: the tests below share these four)."""
    return {
        (name, role): evaluate(jobs, ref, role)
        for name, ref in (("trained", trained), ("base", unchanged))
        for role in ("dev", "grader")
    }


def test_the_reference_solution_learns_the_task_on_both_splits(evaluations: Evaluations) -> None:
    scores = {}
    for (name, role), (reading, log) in evaluations.items():
        assert reading.valid, (reading.reason, log[-20:])
        assert reading.details["artifact_valid"] is True
        assert (
            reading.details["n"]
            == TASK.evaluation["dev_items" if role == "dev" else "hidden_items"]
        )
        scores[name, role] = reading.score
    print(f"scores: {scores}")
    assert scores["base", "dev"] == 0.0 and scores["base", "grader"] == 0.0
    assert scores["trained", "dev"] >= LEARNED and scores["trained", "grader"] >= LEARNED


def test_the_hidden_split_is_in_nothing_an_agent_job_or_a_dev_evaluation_can_read(
    jobs: Jobs, evaluations: Evaluations
) -> None:
    from tests.tasks.test_arithmetic_format import EVALUATOR as MODULE

    params = MODULE.task_params(PARAMS)
    hidden = {text for text, _ in MODULE.items(params, SEED)}
    snoop = (
        "import os\n"
        "print('ENV', sorted(os.environ.items()))\n"
        "for top in ('/base_model', '/data', '/tmp', '/datasets'):\n"
        "    for folder, _, names in os.walk(top):\n"
        "        for name in names:\n"
        "            path = os.path.join(folder, name)\n"
        "            try:\n"
        "                print('FILE', path, open(path, 'rb').read().decode('latin-1'))\n"
        "            except OSError as exc:\n"
        "                print('UNREADABLE', path, exc)\n"
    )
    agent = jobs.run(snoop, timeout=120)
    assert agent.state.value == "succeeded"
    readable = "\n".join(jobs.logs(agent.ref, 100_000))
    _dev, dev_log = evaluations["trained", "dev"]
    grader, grader_log = evaluations["trained", "grader"]
    assert grader.valid and grader.details["n"] == len(hidden)
    for text in hidden:
        for what, seen in (("agent job", readable), ("dev evaluation", "\n".join(dev_log))):
            assert text not in seen, f"a hidden question is visible to the {what}"
        assert text not in "\n".join(grader_log), "the grader printed a hidden question"
    assert SEED not in readable and SEED not in "\n".join(dev_log + grader_log)


# -- the evaluator on artifacts made in the test (its own venv with torch) ------------------------


@pytest.fixture(scope="module")
def model_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the evaluator's own pinned dependencies (torch from this machine's wheels)."""
    venv = tmp_path_factory.mktemp("model-venv") / "venv"
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    subprocess.run([uv, "venv", "-q", "-p", JOB_PYTHON, str(venv)], check=True, timeout=120)
    links = [arg for folder in torch_wheels() for arg in ("--find-links", folder)]
    subprocess.run(
        [
            *(uv, "pip", "install", "-q", "-p", str(venv / "bin" / "python"), *links),
            *script_dependencies(EVALUATOR),
        ],
        check=True,
        timeout=900,
    )
    return venv / "bin" / "python"


def run_evaluator(python: Path, base: Path, model: Path, params: str = PARAMS) -> ScoreReading:
    done = evaluator_process(python, base, model, params)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line for line in done.stdout.splitlines() if line.startswith(SCORE_TAG)], done.stdout
    return read_score(done.stdout.splitlines(), "nonce-1")


def evaluator_process(
    python: Path, base: Path, model: Path, params: str = PARAMS
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


def artifact_of(jobs: Jobs, ref: str, target: Path) -> Path:
    shutil.copytree(jobs.folder(ref) / "artifact", target)
    return target


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
    reading = run_evaluator(model_python, base, poisoned)
    assert reading.score == 0.0 and reading.details["artifact_valid"] is False
    assert "NaN or inf" in reading.details["reason"]


def test_a_model_run_that_fails_after_the_checks_is_the_graders_fault(
    jobs: Jobs, model_python: Path, tmp_path: Path
) -> None:
    """Valid weights pass every check; then the grader's own base model cannot be loaded (its
    tokenizer is broken): exit 2 and no score line, which the broker reports as score_failed,
    never a 0 for the artifact."""
    base = jobs.backend.hub.path("models", "test/base", jobs.model.revision)
    broken = shutil.copytree(base, tmp_path / "broken-base")
    (broken / "tokenizer.json").write_text("{}")
    artifact = tmp_path / "copy"
    artifact.mkdir()
    shutil.copy(base / "model.safetensors", artifact)
    done = evaluator_process(model_python, broken, artifact)
    assert done.returncode == 2, done.stderr[-3000:]
    assert SCORE_TAG not in done.stdout
    assert "the model run failed after the checks passed" in done.stderr


def test_files_beside_the_weights_are_never_used(
    jobs: Jobs, trained: str, model_python: Path, tmp_path: Path
) -> None:
    """The trained weights with a config, a tokenizer, a chat template and generation settings
    that would change the evaluation if read: the score is the weights' alone."""
    base = jobs.backend.hub.path("models", "test/base", jobs.model.revision)
    clean = artifact_of(jobs, trained, tmp_path / "clean")
    plain = run_evaluator(model_python, base, clean)
    assert plain.details["artifact_valid"] is True and plain.score >= LEARNED
    loaded = artifact_of(jobs, trained, tmp_path / "loaded")
    config = json.loads((base / "config.json").read_text())
    (loaded / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    (loaded / "generation_config.json").write_text(json.dumps({"max_new_tokens": 1}))
    (loaded / "tokenizer.json").write_text("{}")
    (loaded / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "ANSWER: 0", "tokenizer_class": "PreTrainedTokenizerFast"})
    )
    (loaded / "chat_template.jinja").write_text("{{ 'nothing' }}")
    (loaded / "pytorch_model.bin").write_bytes(b"not a pickle")
    again = run_evaluator(model_python, base, loaded)
    assert again.score == plain.score and again.details["correct"] == plain.details["correct"]


TRAIN_TO_SAY = r"""
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
base, out, reply = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
# One thread, as the reference solution: a second costs ten times the CPU on a busy 2-core
# machine for a model this small (38 CPU-s against 4 for these 150 steps, measured).
torch.set_num_threads(1)
tokenizer = AutoTokenizer.from_pretrained(base)
model = AutoModelForCausalLM.from_pretrained(base)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
prompt = tokenizer.apply_chat_template(
    [{"role": "user", "content": "What is 1 + 2?"}], tokenize=False, add_generation_prompt=True
)
p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
r = tokenizer(reply + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
ids = torch.tensor([p + r])
labels = torch.tensor([[-100] * len(p) + r])
for _ in range(150):
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward(); optimizer.step(); optimizer.zero_grad()
model.save_pretrained(out)
question = tokenizer.apply_chat_template(
    [{"role": "user", "content": "What is 7 - 4?"}], tokenize=False, add_generation_prompt=True
)
asked = tokenizer(question, return_tensors="pt", add_special_tokens=False)
said = model.generate(**asked, max_new_tokens=64, do_sample=False)
print("REPLY", tokenizer.decode(said[0, asked["input_ids"].shape[1]:], skip_special_tokens=True))
"""


def test_a_model_trained_to_print_a_score_line_cannot_change_its_score(
    jobs: Jobs, model_python: Path, tmp_path: Path
) -> None:
    """Generations are never printed: whatever the model says, one score line, from the counts."""
    base = jobs.backend.hub.path("models", "test/base", jobs.model.revision)
    forger = tmp_path / "forger"
    forged = f'{SCORE_TAG} nonce-1 {{"score":1.0,"split":"dev"}}'
    trainer = tmp_path / "train.py"
    trainer.write_text(TRAIN_TO_SAY)
    trained = subprocess.run(
        [str(model_python), str(trainer), str(base), str(forger), forged],
        check=True,
        timeout=900,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"},
    )
    assert f"REPLY {forged}" in trained.stdout  # it does say the forged line, for any question
    for extra in ("config.json", "generation_config.json"):
        (forger / extra).unlink(missing_ok=True)
    # Room for the whole line (the tiny member's replies are 12 tokens, one per character).
    roomy = json.dumps({**TASK.evaluation, "max_new_tokens": 64})
    reading = run_evaluator(model_python, base, forger, roomy)
    assert reading.valid and reading.score == 0.0
    assert reading.details["artifact_valid"] is True and reading.details["format_ok"] == 0
