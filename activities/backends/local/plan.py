"""What one local job runs: its files, phases (bubblewrap command lines) and environments.

Every job runs the launcher exactly as on Hugging Face (DESIGN §6 item 4), split in two phases:
`--phase install` with network (wheels into /env/venv, through the shared uv cache), then
`--phase run` with no network, where the launcher's root supervisor installs the seccomp filter,
closes fds and drops to the job's uid (or, without root, verifies the uid bwrap set). An agent
job's script is the agent's; an evaluation's is the task's trusted evaluator (its PEP 723
dependencies installed, its `exclude-newer` honoured), which the launcher gives the nonce, the
task's parameters and, for graders, the hidden-split seed in its environment, with the agent
job's artifact at /model. An evaluation's venv is built once per evaluator and mounted read-only
(activities/backends/local/evaluator_venvs.py: warm grading) when the machine keeps them.

Nothing secret is planned here: secrets go to the supervisor on stdin (`secret_env`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from activities.backends.interface import JobRequest
from activities.backends.local.evaluator_venvs import EvaluatorVenvs, venv_key
from activities.backends.local.sandbox import Mount, Sandbox, outside_usr
from activities.backends.local.scratch import FS, SHM
from job_launcher.builder import LauncherConfig, build_launcher
from job_launcher.requirements import script_exclude_newer
from posttrain_common.contracts.jobs import JobRole

UV_IN_SANDBOX = "/opt/posttrain/uv"
VENV = "/env/venv"
_PATH = "/usr/local/bin:/usr/bin:/bin"
# The install phase's own settings: its paths, and a uv cache on another mount than the venv
# (uv copies, so a job's venv shares no file with the cache, and, told so, does not warn).
INSTALLER_FIXED_ENV = {
    "PATH": _PATH,
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "UV_CACHE_DIR": "/uv-cache",
    "UV_LINK_MODE": "copy",
}
# Passed from the server's environment to install phases only: what reaching PyPI may need.
# Together with INSTALLER_FIXED_ENV this is the launcher's INSTALLER_ENV (a test binds them):
# the launcher drops whatever else reaches it.
INSTALLER_PASS_THROUGH = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)


@dataclass(frozen=True)
class Machine:
    """Backend-wide facts a plan needs (the same for every job)."""

    bwrap: str
    job_python: str
    job_python_version: str  # "3.11": agent scripts must parse as this version
    uv: str
    uv_cache: Path
    privileged: bool
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    host_env: Mapping[str, str] = field(default_factory=dict)
    # Where evaluations' venvs are built once and shared read-only (evaluator_venvs.py); None:
    # each evaluation installs its own, as an agent job does.
    evaluator_venvs: Path | None = None


@dataclass
class JobPlan:
    files: dict[str, tuple[bytes, int]]  # path under the job folder -> (content, mode)
    phases: list[dict[str, Any]]
    secret_env: dict[str, dict[str, str]]  # phase name -> environment, sent on stdin
    collect: bool  # agent jobs: outputs become the artifact
    data_owner: int | None  # the owner of /data (root: an evaluator's scratch), else root's


def secret_env(request: JobRequest) -> dict[str, dict[str, str]]:
    """What the job's supervisor is sent on stdin, by phase: the job's environment (its nonce)
    in both, and an evaluation's secrets (the grader's seed) in its run phase only."""
    run = dict(request.env) if request.role is JobRole.agent else {**request.env, **request.secrets}
    return {"install": dict(request.env), "run": run}


def plan_job(
    request: JobRequest,
    folder: Path,
    machine: Machine,
    uid: int,
    base_model: Path,
    datasets: Sequence[tuple[str, Path]],
    artifact: Path | None,
) -> JobPlan:
    """Raises ToolError(invalid_script / invalid_dependency) as jobs_submit would."""
    inputs = [Mount(str(base_model), "/base_model")]
    inputs += [Mount(str(path), f"/datasets/{repo_id}") for repo_id, path in datasets]
    if artifact is not None:
        inputs.append(Mount(str(artifact), "/model"))
    fs = folder / FS  # the job's own filesystem (activities/backends/local/scratch.py)
    scratch = [
        Mount(str(fs / "tmp"), "/tmp", writable=True),
        Mount(str(folder / SHM), "/dev/shm", writable=True),
        Mount(str(fs / "data"), "/data", writable=True),
        Mount(str(fs / "env"), "/env"),
        Mount(str(folder / "job"), "/job"),
    ]
    python_prefix = outside_usr(machine.job_python)
    run_host = [python_prefix] if python_prefix else []
    is_agent = request.role is JobRole.agent
    config = launcher_config(request, machine, uid)
    packages = request.dependencies if is_agent else []
    launcher = build_launcher(request.script, packages, config, python=machine.job_python_version)
    # Root: the launcher hides itself from the job's uid. It holds nothing but the script (the
    # agent's own, or the task's evaluator) and settings, so a job sharing our uid (no root)
    # may read it.
    files = {"job/launcher.py": (launcher.encode(), 0o600 if machine.privileged else 0o644)}
    failure = (
        "the job exited with status {code}; see its log"
        if is_agent
        else "the evaluator exited with status {code}; see its log"
    )
    install = _install_phase(machine, uid, folder, run_host)
    if not is_agent and machine.evaluator_venvs is not None:
        # Warm grading: the evaluator's shared venv, built by the first job of its key.
        venvs = EvaluatorVenvs(machine.evaluator_venvs)
        key = evaluator_key(request.script, machine)
        shared = str(venvs.folder(key))
        install = venvs.build_phase(
            key, _install_phase(machine, uid, folder, run_host, env=shared), machine.job_python
        )
        scratch = [m if m.target != "/env" else Mount(shared, "/env") for m in scratch]
    phases = [install, _run_phase(machine, uid, [*scratch, *inputs], run_host, failure)]
    return JobPlan(
        files=files,
        phases=phases,
        secret_env=secret_env(request),
        collect=is_agent,
        data_owner=None if is_agent or not machine.privileged else uid,
    )


def evaluator_key(script: str, machine: Machine) -> str:
    """The key of an evaluator's shared venv on this machine."""
    return venv_key(
        script,
        job_python=machine.job_python,
        job_python_version=machine.job_python_version,
        find_links=machine.find_links,
        no_index=machine.no_index,
    )


def launcher_config(request: JobRequest, machine: Machine, uid: int) -> LauncherConfig:
    """The launcher's settings for one job. Every role runs the launcher (DESIGN §6 item 4):
    an evaluation's script is the task's evaluator, which gets its own inputs from the
    launcher's environment (`pass_env`: the nonce, the task's parameters and a grader's seed,
    sent on stdin) and has its header's `exclude-newer` honoured, as `uv run` would."""
    evaluation = request.role is not JobRole.agent
    return LauncherConfig(
        python=machine.job_python,
        data_dir="/data",
        venv_dir=VENV,
        uid=uid,
        gid=uid,
        find_links=machine.find_links,
        no_index=machine.no_index,
        installer="uv",
        uv=UV_IN_SANDBOX,
        pass_env=tuple(sorted({*request.env, *request.secrets})) if evaluation else (),
        exclude_newer=script_exclude_newer(request.script) if evaluation else None,
    )


def _run_phase(
    machine: Machine, uid: int, mounts: list[Mount], host: list[str], failure: str
) -> dict[str, Any]:
    """`launcher.py --phase run` with no network: the supervisor drops to the job's uid (or,
    without root, verifies the uid bwrap set) and runs the script with the venv at /env/venv,
    which this phase only reads (a venv made elsewhere and mounted read-only there would do)."""
    sandbox = Sandbox(
        bwrap=machine.bwrap,
        privileged=machine.privileged,
        uid=uid,
        gid=uid,
        network=False,
        command=[machine.job_python, "/job/launcher.py", "--phase", "run"],
        mounts=mounts,
        host_paths=host,
        chdir="/data",
    )
    env = {"PATH": _PATH, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    return {"name": "run", "argv": sandbox.argv(), "env": env, "limits": True, "failure": failure}


def _install_phase(
    machine: Machine, uid: int, folder: Path, host: list[str], env: str | None = None
) -> dict[str, Any]:
    """`launcher.py --phase install` with network: the venv at /env/venv, wheels only; `env`:
    the host folder bound at /env (default: the job's own)."""
    host_paths = [*host, *machine.find_links]
    installer_env = dict(INSTALLER_FIXED_ENV)
    for name in INSTALLER_PASS_THROUGH:
        value = machine.host_env.get(name)
        if value is None:
            continue
        installer_env[name] = value
        if name.startswith("SSL_CERT") and os.path.exists(value) and not value.startswith("/etc/"):
            host_paths.append(value)
    sandbox = Sandbox(
        bwrap=machine.bwrap,
        privileged=machine.privileged,
        uid=uid,
        gid=uid,
        network=True,
        command=[machine.job_python, "/job/launcher.py", "--phase", "install"],
        mounts=[
            Mount(str(folder / FS / "tmp"), "/tmp", writable=True),
            Mount(env or str(folder / FS / "env"), "/env", writable=True),
            Mount(str(folder / "job"), "/job"),
            Mount(str(machine.uv_cache), "/uv-cache", writable=True),
            Mount(machine.uv, UV_IN_SANDBOX),
        ],
        host_paths=list(dict.fromkeys(host_paths)),
    )
    return {
        "name": "install",
        "argv": sandbox.argv(),
        "env": installer_env,
        "limits": False,
        "failure": "installing the job's packages failed (status {code}); see its log",
    }
