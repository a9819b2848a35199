"""What one local job runs: its files, phases (bubblewrap command lines) and environments.

Agent jobs run the launcher exactly as on Hugging Face, split in two phases: `--phase install`
with network (wheels into /env/venv, through the shared uv cache), then `--phase run` with no
network, where the launcher's root supervisor drops to the job's uid (or, without root, verifies
the uid bwrap set). Evaluations run the task's trusted evaluator with the job Python directly —
after an install phase only when its PEP 723 header declares dependencies — with the nonce and,
for graders, the hidden-split seed in its environment, the agent job's artifact at /model.

Nothing secret is planned here: secrets go to the supervisor on stdin (`secret_env`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from activities.backends.interface import JobRequest
from activities.backends.local.sandbox import Mount, Sandbox, outside_usr
from activities.backends.local.scratch import FS, SHM
from job_launcher.builder import LauncherConfig, build_launcher
from job_launcher.requirements import merged_dependencies
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
# Root inside an evaluation's sandbox only needs to switch to the evaluator's uid.
_DROP_TO_UID = (
    "import os, sys; uid, gid = int(sys.argv[1]), int(sys.argv[2]); os.setgroups([]); "
    "os.setresgid(gid, gid, gid); os.setresuid(uid, uid, uid); "
    "assert 0 not in os.getresuid() + os.getresgid(); os.execv(sys.argv[3], sys.argv[3:])"
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
    script = request.script
    packages = request.dependencies if is_agent else []
    deps = merged_dependencies(script, packages)  # validates, as the launcher's builder does
    config = LauncherConfig(
        python=machine.job_python,
        data_dir="/data",
        venv_dir=VENV,
        uid=uid,
        gid=uid,
        find_links=machine.find_links,
        no_index=machine.no_index,
        installer="uv",
        uv=UV_IN_SANDBOX,
    )
    files: dict[str, tuple[bytes, int]] = {}
    phases: list[dict[str, Any]] = []
    if is_agent or deps:
        launcher = build_launcher(
            script, packages, config, python=machine.job_python_version
        ).encode()
        # Root: the launcher hides itself from the job's uid. It holds nothing but the agent's
        # own script and settings, so a job sharing our uid (no root) may read it.
        files["job/launcher.py"] = (launcher, 0o600 if machine.privileged else 0o644)
        phases.append(_install_phase(machine, uid, folder, run_host))
    keep_caps: Sequence[str] | None = None
    if is_agent:
        run_env = {"PATH": _PATH, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
        command = [machine.job_python, "/job/launcher.py", "--phase", "run"]
        failure = "the job exited with status {code}; see its log"
    else:
        files["job/script.py"] = (script.encode(), 0o644)
        python = f"{VENV}/bin/python" if deps else machine.job_python
        run_env = {
            "PATH": _PATH,
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "HF_HUB_OFFLINE": "1",
        }
        command = [python, "/job/script.py"]
        if machine.privileged:
            keep_caps = ("CAP_SETUID", "CAP_SETGID")
            command = [machine.job_python, "-I", "-S", "-c", _DROP_TO_UID, str(uid), str(uid)]
            command += [python, "/job/script.py"]
        failure = "the evaluator exited with status {code}; see its log"
    run = Sandbox(
        bwrap=machine.bwrap,
        privileged=machine.privileged,
        uid=uid,
        gid=uid,
        network=False,
        command=command,
        mounts=[*scratch, *inputs],
        host_paths=run_host,
        keep_caps=keep_caps,
        chdir="/data",
    )
    phases.append(
        {"name": "run", "argv": run.argv(), "env": run_env, "limits": True, "failure": failure}
    )
    return JobPlan(
        files=files,
        phases=phases,
        secret_env=secret_env(request),
        collect=is_agent,
        data_owner=None if is_agent or not machine.privileged else uid,
    )


def _install_phase(machine: Machine, uid: int, folder: Path, host: list[str]) -> dict[str, Any]:
    """`launcher.py --phase install` with network: the venv at /env/venv, wheels only."""
    host_paths = [*host, *machine.find_links]
    env = dict(INSTALLER_FIXED_ENV)
    for name in INSTALLER_PASS_THROUGH:
        value = machine.host_env.get(name)
        if value is None:
            continue
        env[name] = value
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
            Mount(str(folder / FS / "env"), "/env", writable=True),
            Mount(str(folder / "job"), "/job"),
            Mount(str(machine.uv_cache), "/uv-cache", writable=True),
            Mount(machine.uv, UV_IN_SANDBOX),
        ],
        host_paths=list(dict.fromkeys(host_paths)),
    )
    return {
        "name": "install",
        "argv": sandbox.argv(),
        "env": env,
        "limits": False,
        "failure": "installing the job's packages failed (status {code}); see its log",
    }
