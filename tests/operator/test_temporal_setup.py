"""`server` refuses a Temporal without our search attributes, naming the command that fixes it;
`posttrain-env temporal setup` registers them (idempotently) and then the server starts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from posttrain_common.keys import write_new_key
from posttrain_server.temporal.setup import missing_search_attributes, tcld_commands
from tests.conftest import binary
from tests.gateway.server import ServerProcess, command
from tests.startup import DEV_SERVER_STARTUP
from workflows.operations.search_attributes import SEARCH_ATTRIBUTES


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
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
        dev_server_existing_path=binary("temporal"),
        dev_server_log_level="error",
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


# What `tcld namespace search-attributes add` accepts, as its source declares it (temporalio/tcld,
# app/namespace.go): --namespace (-n), --search-attribute (--sa, repeated, "name=type"),
# --request-id (-r), --resource-version (-v); the types it knows.
TCLD_FLAGS = {"--namespace", "--search-attribute", "--request-id", "--resource-version"}
TCLD_TYPES = {"Keyword", "Text", "Int", "Double", "Datetime", "Bool", "KeywordList"}


def test_setup_on_temporal_cloud_prints_one_tcld_command_that_adds_every_attribute(
    tmp_path: Path,
) -> None:
    done = setup_command("my-ns.abc12.tmprl.cloud:7233", tmp_path)
    assert done.returncode == 0
    assert done.stdout.splitlines()[1:] == tcld_commands("default")
    # Run as printed, by a shell, with a stand-in `tcld` that records its arguments.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "tcld"
    stand_in.write_text(
        "#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n"
    )
    stand_in.chmod(0o755)
    ran = subprocess.run(
        ["bash", "-c", done.stdout],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    (called,) = [json.loads(line) for line in ran.stdout.splitlines()]  # one command
    assert called[:3] == ["namespace", "search-attributes", "add"]
    flags, values = called[3::2], called[4::2]
    assert set(flags) <= TCLD_FLAGS and flags.count("--namespace") == 1
    assert values[flags.index("--namespace")] == "default"
    added = [v for f, v in zip(flags, values, strict=True) if f == "--search-attribute"]
    pairs = [value.split("=") for value in added]
    assert {name for name, _ in pairs} == {key.name for key in SEARCH_ATTRIBUTES}
    assert {kind for _, kind in pairs} <= TCLD_TYPES and len(pairs) == len(SEARCH_ATTRIBUTES)
    assert "PtCancelPendingSince=Datetime" in added and "PtReward=Double" in added
