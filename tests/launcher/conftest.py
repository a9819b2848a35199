"""Fixtures for the launcher tests: real jobs on this machine, run as root like the local backend.

Every job here is a script the launcher runs as an agent's would: built by `build_launcher`,
run with /usr/bin/python3 (executable by the dropped uid, unlike a pyenv Python under /root),
packages only from a generated wheel folder (`--no-index`), never from live PyPI.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import io
import json
import os
import secrets
import shutil
import subprocess
import tarfile
import tempfile
import textwrap
import threading
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from activities.backends.local.backend import python_version
from job_launcher.builder import NONCE_ENV, LauncherConfig, build_launcher
from job_launcher.trusted_lines import LAUNCHER_TAG, trusted_payloads

JOB_PYTHON = "/usr/bin/python3"
CONTAINER_PROFILE = Path(__file__).with_name("container_profile.py")


def _require_root_linux() -> None:
    # These tests exercise setuid and seccomp for real; the project's CI runs them as root.
    if os.geteuid() != 0 or not Path("/proc/self/status").exists():
        raise RuntimeError("the launcher tests must run as root on Linux")
    if not os.access(JOB_PYTHON, os.X_OK):
        raise RuntimeError(f"{JOB_PYTHON} is needed as the job interpreter")


def uv_binary() -> str:
    path = shutil.which("uv")
    if path is None:
        raise RuntimeError("uv is not on PATH; run the tests with `uv run pytest`")
    return path


# ---------------------------------------------------------------------------------------------
# A local wheel folder: pt-probe 1.0 (wheel), pt-probe 2.0 (sdist only), pt-sdist-only (sdist)
# ---------------------------------------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def make_wheel(folder: Path, name: str, version: str, module_text: str) -> Path:
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": module_text.encode(),
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n"
        ).encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: posttrain-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    record += f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name_in_zip, data in files.items():
            zf.writestr(name_in_zip, data)
        zf.writestr(f"{info}/RECORD", record)
    return path


def make_sdist(folder: Path, name: str, version: str) -> Path:
    dist = name.replace("-", "_")
    base = f"{dist}-{version}"
    members = {
        f"{base}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{base}/pyproject.toml": (
            f'[project]\nname = "{name}"\nversion = "{version}"\n'
            '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        ),
        f"{base}/{dist}/__init__.py": "RAN_FROM_SDIST = True\n",
    }
    path = folder / f"{base}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for member, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="session")
def wheelhouse() -> Iterator[Path]:
    _require_root_linux()
    folder = Path(tempfile.mkdtemp(prefix="posttrain-wheels-"))
    os.chmod(folder, 0o755)
    make_wheel(folder, "pt-probe", "1.0", "VALUE = 'probe-1.0'\n")
    make_sdist(folder, "pt-probe", "2.0")
    make_sdist(folder, "pt-sdist-only", "1.0")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Running a job
# ---------------------------------------------------------------------------------------------


@dataclass
class JobResult:
    returncode: int
    stdout: str
    stderr: str
    nonce: str
    root: Path
    launcher: Path
    config: LauncherConfig
    payloads: list[dict[str, Any]] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines()

    @property
    def final(self) -> dict[str, Any]:
        assert self.payloads, f"no trusted line at all:\n{self.stdout}\n{self.stderr}"
        return self.payloads[-1]

    def report(self) -> dict[str, Any]:
        """The JSON the test script printed on its `REPORT ` line."""
        for line in self.lines:
            if line.startswith("REPORT "):
                return json.loads(line[len("REPORT ") :])
        raise AssertionError(f"the script printed no report:\n{self.stdout}\n{self.stderr}")

    @property
    def data_dir(self) -> Path:
        return Path(self.config.data_dir)


@pytest.fixture
def job_root() -> Iterator[Path]:
    """A job's folder, traversable by the dropped uid (pytest's tmp_path is under a 0700 dir)."""
    _require_root_linux()
    root = Path(tempfile.mkdtemp(prefix="posttrain-job-test-"))
    os.chmod(root, 0o755)
    (root / "data").mkdir(mode=0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def job_config(root: Path, wheelhouse: Path | None = None, **overrides: Any) -> LauncherConfig:
    config = LauncherConfig(
        python=JOB_PYTHON,
        data_dir=str(root / "data"),
        venv_dir=str(root / "venv"),
        find_links=(str(wheelhouse),) if wheelhouse else (),
        no_index=True,
        uv=uv_binary(),
    )
    return replace(config, **overrides)


@functools.cache
def _version_of(python: str) -> str:
    return python_version(python)


def job_python_version(config: LauncherConfig) -> str:
    """The version of the Python a job built with `config` runs (its script is checked for it)."""
    return _version_of(config.python or JOB_PYTHON)


def write_launcher(
    root: Path, script: str, packages: Sequence[str], config: LauncherConfig
) -> Path:
    path = root / "launcher.py"
    path.write_text(build_launcher(script, packages, config, python=job_python_version(config)))
    os.chmod(path, 0o644)  # the launcher must hide itself from the job's uid
    return path


def run_launcher(
    root: Path,
    launcher: Path,
    config: LauncherConfig,
    *,
    phase: str = "all",
    env: Mapping[str, str] | None = None,
    nonce: str | None = None,
    timeout: float = 60,
    command: Sequence[str] | None = None,
    **popen: Any,
) -> JobResult:
    nonce = secrets.token_hex(16) if nonce is None else nonce
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
    }
    if nonce:
        full_env[NONCE_ENV] = nonce
    full_env.update(env or {})
    cmd = list(command) if command else [JOB_PYTHON, str(launcher), "--phase", phase]
    popen.setdefault("stdout", subprocess.PIPE)
    proc = subprocess.run(
        cmd, env=full_env, stderr=subprocess.PIPE, timeout=timeout, check=False, **popen
    )
    stdout = (proc.stdout or b"").decode(errors="replace")
    result = JobResult(
        proc.returncode, stdout, proc.stderr.decode(errors="replace"), nonce, root, launcher, config
    )
    if nonce:
        result.payloads = trusted_payloads(stdout.splitlines(), LAUNCHER_TAG, nonce)
    return result


class JobRunner:
    """run_job(script, packages=(), *, env=..., nonce=..., **config overrides) -> JobResult."""

    def __init__(self, root: Path, wheelhouse: Path) -> None:
        self.root = root
        self.wheelhouse = wheelhouse

    def __call__(
        self,
        script: str,
        packages: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        nonce: str | None = None,
        timeout: float = 60,
        profile: str | None = None,
        **overrides: Any,
    ) -> JobResult:
        """`profile`: run the launcher as a container's root would run it
        (tests/launcher/container_profile.py: "seccomp+caps" or "caps")."""
        config = job_config(self.root, self.wheelhouse, **overrides)
        if config.venv_dir and os.path.exists(config.venv_dir):
            shutil.rmtree(config.venv_dir)  # a second job in one test gets a fresh venv
        launcher = write_launcher(self.root, textwrap.dedent(script), packages, config)
        command = [JOB_PYTHON, str(launcher), "--phase", "all"]
        if profile is not None:
            command = [JOB_PYTHON, str(CONTAINER_PROFILE), profile, "--", *command]
        return run_launcher(
            self.root, launcher, config, env=env, nonce=nonce, timeout=timeout, command=command
        )


@pytest.fixture
def run_job(job_root: Path, wheelhouse: Path) -> JobRunner:
    return JobRunner(job_root, wheelhouse)


# A prelude for test scripts: raw syscalls through ctypes and a REPORT line.
SCRIPT_PRELUDE = '''
import ctypes, errno, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def sys_errno(nr, *args):
    """errno of a raw syscall, 0 when it succeeded."""
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return ctypes.get_errno() if rc == -1 else 0

def report(**values):
    print("REPORT " + json.dumps(values), flush=True)
'''


def assert_ran(result: JobResult) -> None:
    """The script ran to its end and the supervisor's exit line is the final trusted line."""
    assert result.final.get("stage") == "exit", (result.stdout, result.stderr)
    assert result.final["exit_code"] == 0, (result.stdout, result.stderr)
    assert result.returncode == 0


class RecordingServer:
    """An HTTP server on 127.0.0.1 that counts the requests it receives."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append(self.path)
                self.send_response(404)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def http_server() -> Iterator[RecordingServer]:
    server = RecordingServer()
    yield server
    server.close()
