"""`server` refuses a Temporal without our search attributes, naming the command that fixes it;
`posttrain-env temporal setup` registers them (idempotently) and then the server starts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from posttrain_env.contracts.visibility import SEARCH_ATTRIBUTES
from posttrain_env.entrypoints.temporal_setup import missing_search_attributes, tcld_commands
from posttrain_env.keys import write_new_key
from tests.conftest import binary
from tests.gateway.server import ServerProcess, command


def setup_command(address: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "TEMPORAL_"))}
    env.update({"TEMPORAL_ADDRESS": address, "POSTTRAIN_STATE_DIR": str(state_dir)})
    return subprocess.run(
        [*command(), "temporal", "setup"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_server_refuses_without_attributes_and_starts_after_temporal_setup(
    tmp_path: Path,
) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary("temporal"), dev_server_log_level="error"
    )
    try:
        address = env.client.service_client.config.target_host
        missing = await missing_search_attributes(env.client)
        assert missing.names == [key.name for key in SEARCH_ATTRIBUTES]

        key = tmp_path / "server.key"
        write_new_key(key)
        extra = {"TEMPORAL_ADDRESS": address, "POSTTRAIN_SERVER_KEY_FILE": str(key)}
        server = ServerProcess(tmp_path / "state", extra_env=extra)
        with pytest.raises(RuntimeError, match="the server exited") as refused:
            server.start()
        assert server.proc is not None and server.proc.returncode == 2
        message = str(refused.value)
        assert "posttrain-env temporal setup" in message and "PtCancelPendingSince" in message
        assert "Traceback" not in message

        done = setup_command(address, tmp_path / "state")
        assert done.returncode == 0, done.stderr
        assert "registered PtTask" in done.stdout
        assert (await missing_search_attributes(env.client)).names == []
        again = setup_command(address, tmp_path / "state")  # idempotent
        assert again.returncode == 0 and "already registered" in again.stdout

        server.start()
        assert server.stop() == 0
    finally:
        await env.shutdown()


def test_setup_on_temporal_cloud_prints_the_tcld_commands(tmp_path: Path) -> None:
    done = setup_command("my-ns.abc12.tmprl.cloud:7233", tmp_path)
    assert done.returncode == 0
    lines = done.stdout.splitlines()[1:]
    assert lines == tcld_commands("default") and len(lines) == len(SEARCH_ATTRIBUTES)
    assert "--search-attribute PtCancelPendingSince=Datetime" in done.stdout
