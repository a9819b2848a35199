"""The agent worker starts as docs/campaigns.md says, with the page's own commands (read from
it), and refuses, saying why, wherever it could read the server's key: with the server's state
dir, or with a campaigns folder beside the server's key (the default `<state dir>/campaigns`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from posttrain_common.keys import ServerKey
from tests.gateway.server import command

REPO = Path(__file__).resolve().parents[2]
STARTED = "agent worker on task queue"


def page_lines() -> tuple[str, str]:
    """The page's `export POSTTRAIN_CAMPAIGNS_DIR=...` line and its agent-worker line, as
    written (comments dropped)."""
    text = (REPO / "docs" / "campaigns.md").read_text()
    (export,) = re.findall(r"^(export POSTTRAIN_CAMPAIGNS_DIR=\S+)", text, re.M)
    (agent,) = re.findall(r"^(\S.*uv run posttrain-env agent-worker)\b", text, re.M)
    return export, agent


def environment(home: Path, temporal: str) -> dict[str, str]:
    """A user's shell: HOME, PATH, the Temporal address; nothing of ours or of the broker's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "TEMPORAL_"))}
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "XDG_STATE_HOME"):
        env.pop(name, None)
    return {**env, "HOME": str(home), "TEMPORAL_ADDRESS": temporal}


def shell(*lines: str) -> str:
    """The lines as one shell script, `uv run posttrain-env` being this venv's command."""
    here = " ".join(command())
    return "\n".join(line.replace("uv run posttrain-env", f"exec {here}") for line in lines)


def test_the_agent_worker_starts_with_the_pages_commands_and_refuses_beside_the_key(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    server_state = home / ".local" / "state" / "posttrain-env"  # the server's default state dir
    ServerKey.load_or_create(server_state / "server.key")
    env = environment(home, time_skipping_env.client.service_client.config.target_host)
    export, agent = page_lines()
    assert "POSTTRAIN_STATE_DIR=" in agent

    log = tmp_path / "agent-worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            ["bash", "-c", shell(export, agent)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while STARTED not in log.read_text() and worker.poll() is None:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert worker.poll() is None, log.read_text()
        assert f"campaigns in {home}/posttrain-campaigns" in log.read_text()
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
    assert worker.returncode == 0, log.read_text()

    # The same user with the server's state dir, or the server's default campaigns folder
    # (beside its key): refused, naming the key, before it connects.
    for lines in (
        [export, "uv run posttrain-env agent-worker"],
        [f"export POSTTRAIN_CAMPAIGNS_DIR={server_state}/campaigns", agent],
    ):
        done = subprocess.run(
            ["bash", "-c", shell(*lines)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert done.returncode == 2, (lines, done.stderr)
        assert f"the server key {server_state}/server.key is readable" in done.stderr
        assert "Traceback" not in done.stderr
