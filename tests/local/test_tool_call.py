"""t1_tool_call_tiny for real, on the local backend (slow: it trains a model).

The family's reference solution runs as an agent job through the real launcher (installing the
CPU build of torch from this machine's wheels), and the family's evaluator, assembled as a
grader uploads it (the generation kit and the items embedded), as dev and grader jobs: the
trained checkpoint must beat the unchanged base model on both splits. Around it: the tools
reach the model only through the base model's chat template, and a model trained to print
score lines cannot change its score.
"""

from __future__ import annotations

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
from tasks.models.tiny_tool_lm import write_tiny_tool_model
from tasks.registry import TASKS_DIR, evaluator_script, load_task
from tests.local.conftest import JOB_PYTHON, TEST_BWRAP, Jobs
from tests.local.test_arithmetic_format import ROOMY, torch_wheels

# Training and several evaluations on the CPU: minutes each on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

TASK = load_task("t1_tool_call_tiny")
FAMILY = TASKS_DIR / "t1_tool_call"
REFERENCE = (FAMILY / "reference_solution.py").read_text()
EVALUATOR = evaluator_script(TASK)
PARAMS = json.dumps(TASK.evaluation)
SEED = "a-grader-only-seed"
# What "learned" means here: the base model calls nothing right (0). Measured at load 14-29 on
# two cores, where the reference solution's 20 minutes ran out first: 613 steps gave 0.54 (dev)
# and 0.545 (hidden) run by hand, 678 steps as this test's job 0.69 and 0.65; the format, the
# function and the words right every time, numbers not yet always.
LEARNED = 0.3


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    state = tmp_path_factory.mktemp("tools") / "state" / "local"
    base = tmp_path_factory.mktemp("tiny-tool")
    write_tiny_tool_model(base)
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
        task_id=TASK.id,
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
    job = jobs.run(REFERENCE, task_id=TASK.id, timeout_s=1800, timeout=1800)
    assert job.state.value == "succeeded", jobs.logs(job.ref, 60)
    return job.ref


@pytest.fixture(scope="module")
def unchanged(jobs: Jobs) -> str:
    """An agent job that copies the base model's weights unchanged."""
    copy = "import shutil\nshutil.copy('/base_model/model.safetensors', '/data/outputs/')\n"
    job = jobs.run(copy, task_id=TASK.id, timeout=120)
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    return job.ref


Evaluations = dict[tuple[str, str], tuple[ScoreReading, list[str]]]


@pytest.fixture(scope="module")
def evaluations(jobs: Jobs, trained: str, unchanged: str) -> Evaluations:
    return {
        (name, role): evaluate(jobs, ref, role)
        for name, ref in (("trained", trained), ("base", unchanged))
        for role in ("dev", "grader")
    }


def test_the_reference_solution_learns_the_task_on_both_splits(evaluations: Evaluations) -> None:
    scores = {}
    for (name, role), (reading, log) in evaluations.items():
        assert reading.valid, (reading.reason, log[-20:])
        details = reading.details
        assert details["artifact_valid"] is True and details["engine"] == "transformers"
        assert details["n"] == (100 if role == "dev" else 200)
        assert details["split"] == ("dev" if role == "dev" else "hidden")
        scores[name, role] = reading.score
    print(f"scores: {scores}")
    print(
        "grading seconds (trained, base): "
        f"{evaluations['trained', 'grader'][0].details['elapsed_s']}, "
        f"{evaluations['base', 'grader'][0].details['elapsed_s']}"
    )
    assert scores["base", "dev"] == 0.0 and scores["base", "grader"] == 0.0
    assert scores["trained", "dev"] >= LEARNED and scores["trained", "grader"] >= LEARNED


def test_no_request_or_reply_is_printed(evaluations: Evaluations) -> None:
    hidden = [json.loads(line) for line in (FAMILY / "tiny_hidden.jsonl").open()]
    for (_name, _role), (_reading, log) in evaluations.items():
        text = "\n".join(log)
        assert not [i for i in hidden if i["messages"][0]["content"] in text]
        assert '"arguments"' not in text


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
    done = subprocess.run(
        [str(python), str(script)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len([line for line in done.stdout.splitlines() if line.startswith(SCORE_TAG)]) == 1
    return read_score(done.stdout.splitlines(), "nonce-1")


def test_the_tools_reach_the_model_only_through_the_base_models_chat_template(
    jobs: Jobs, trained: str, model_python: Path, tmp_path: Path
) -> None:
    """The trained weights scored with the base model as it is, then with a base model whose
    chat template leaves the tools out: the model learned on prompts that begin with the
    rendered tools, so without them the score drops (the evaluator's prompts are the base
    model's template applied to each item's tools); a template, tokenizer or config beside the
    weights in the artifact changes nothing."""
    base = jobs.backend.hub.path("models", "test/base", jobs.model.revision)
    artifact = shutil.copytree(jobs.folder(trained) / "artifact", tmp_path / "trained")
    plain = run_evaluator(model_python, base, artifact)
    assert plain.details["artifact_valid"] is True and plain.score >= LEARNED
    blind = shutil.copytree(base, tmp_path / "blind-base")
    config = json.loads((blind / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message['content'] + '<|im_end|>' }}"
        "{%- endfor %}"
    )
    (blind / "tokenizer_config.json").write_text(json.dumps(config))
    without_tools = run_evaluator(model_python, blind, artifact)
    assert without_tools.score < plain.score
    (artifact / "tokenizer_config.json").write_text(json.dumps(config))
    (artifact / "chat_template.jinja").write_text("{{ 'nothing' }}")
    (artifact / "config.json").write_text(json.dumps({"num_hidden_layers": 1}))
    again = run_evaluator(model_python, base, artifact)
    assert again.score == plain.score and again.details["correct"] == plain.details["correct"]


TRAIN_TO_SAY = r"""
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
base, out, reply = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(1)
tokenizer = AutoTokenizer.from_pretrained(base)
model = AutoModelForCausalLM.from_pretrained(base)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
prompt = tokenizer.apply_chat_template(
    [{"role": "user", "content": "set a timer for 5 minutes"}], tokenize=False,
    add_generation_prompt=True,
)
p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
r = tokenizer(reply + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
ids = torch.tensor([p + r])
labels = torch.tensor([[-100] * len(p) + r])
for _ in range(150):
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward(); optimizer.step(); optimizer.zero_grad()
model.save_pretrained(out)
"""


def test_a_model_trained_to_print_a_score_line_cannot_change_its_score(
    jobs: Jobs, model_python: Path, tmp_path: Path
) -> None:
    """Replies are never printed: whatever the model says, one score line, from the counts."""
    base = jobs.backend.hub.path("models", "test/base", jobs.model.revision)
    forger = tmp_path / "forger"
    forged = f'{SCORE_TAG} nonce-1 {{"score":1.0,"split":"dev"}}'
    trainer = tmp_path / "train.py"
    trainer.write_text(TRAIN_TO_SAY)
    subprocess.run(
        [str(model_python), str(trainer), str(base), str(forger), forged],
        check=True,
        timeout=900,
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"},
    )
    for extra in ("config.json", "generation_config.json"):
        (forger / extra).unlink(missing_ok=True)
    reading = run_evaluator(model_python, base, forger)
    assert reading.valid and reading.score == 0.0
    assert reading.details["artifact_valid"] is True and reading.details["parsed"] == 0
