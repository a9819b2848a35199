"""The dev server's campaign stack as separate processes: `posttrain-env worker` and
`posttrain-env agent-worker` beside a `ServerProcess` started with `--no-worker`, the campaign
CLI, and the rollout status query. Shared by the tests that SIGKILL the workers mid-campaign."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from tests.gateway.server import ServerProcess, command
from tests.payload_limits import assert_no_violation_in
from workflows.campaign.contract import CampaignStatus
from workflows.campaign.rollout import RolloutWorkflow
from workflows.campaign.rollout_contract import RolloutStatus
from workflows.ids import rollout_workflow_id

REPO = Path(__file__).resolve().parents[2]


class Workers:
    """The worker and the agent worker, started and SIGKILLed as a test wants."""

    def __init__(self, server: ServerProcess, campaigns: Path, agent_state: Path) -> None:
        self.server = server
        self.campaigns = campaigns
        self.agent_state = agent_state
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def env(self) -> dict[str, str]:
        return {
            **self.server.env(),
            "TEMPORAL_ADDRESS": self.server.temporal_address,
            # The deployment's key: the one the server made in its state dir (with
            # TEMPORAL_ADDRESS set, a worker never makes one itself).
            "POSTTRAIN_SERVER_KEY_FILE": str(self.server.state_dir / "server.key"),
            "POSTTRAIN_CAMPAIGNS_DIR": str(self.campaigns),
        }

    def agent_env(self) -> dict[str, str]:
        # No broker secret: its own state dir (no server key), the shared campaigns folder.
        env = {**self.env(), "POSTTRAIN_STATE_DIR": str(self.agent_state)}
        env.pop("POSTTRAIN_FAKE_SCENARIO", None)
        env.pop("POSTTRAIN_SERVER_KEY_FILE")
        return env

    def start(self) -> None:
        for name, env in (("worker", self.env()), ("agent-worker", self.agent_env())):
            log = (self.server.state_dir / f"{name}.log").open("ab")
            self.procs[name] = subprocess.Popen(
                [*command(), name],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        for proc in self.procs.values():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        self.check_payload_limits()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.check_payload_limits()

    def check_payload_limits(self) -> None:
        """Fail if a worker had a payload refused for its size (TMPRL1103), as the server's
        own log is checked (ServerProcess.check_payload_limits)."""
        assert_no_violation_in(*(self.server.state_dir / f"{name}.log" for name in self.procs))


@contextmanager
def campaign_stack(
    tmp_path: Path, extra_env: dict[str, str] | None = None, **server: Any
) -> Iterator[Workers]:
    """`posttrain-env server --no-worker` (its campaigns folder under `tmp_path`) and the
    controls of its two workers, everything stopped at the end."""
    env = {"POSTTRAIN_CAMPAIGNS_DIR": str(tmp_path / "campaigns"), **(extra_env or {})}
    process = ServerProcess(tmp_path / "server", extra_env=env, **server)
    process.start("--no-worker")
    workers = Workers(process, tmp_path / "campaigns", tmp_path / "agents")
    try:
        yield workers
    finally:
        workers.stop()
        process.stop()


def cli(workers: Workers, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`posttrain-env campaign <args>` against the workers' Temporal."""
    return subprocess.run(
        [*command(), "campaign", *args],
        env=workers.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def campaign_status(workers: Workers, campaign_id: str) -> CampaignStatus:
    done = cli(workers, "status", campaign_id, "--json")
    assert done.returncode == 0, done
    return CampaignStatus.model_validate_json(done.stdout)


def started_rollout_status(workers: Workers, rollout_id: str) -> RolloutStatus | None:
    """As `rollout_status`, or None while the rollout's workflow does not exist yet: the
    campaign counts a rollout in flight from the moment it starts starting it."""
    try:
        return rollout_status(workers, rollout_id)
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return None
        raise


def rollout_status(workers: Workers, rollout_id: str) -> RolloutStatus:
    """The status query of the rollout's first attempt (it needs a live worker)."""

    async def query() -> RolloutStatus:
        client = await Client.connect(
            workers.server.temporal_address, data_converter=pydantic_data_converter
        )
        handle = client.get_workflow_handle_for(
            RolloutWorkflow.run, rollout_workflow_id(rollout_id, 1)
        )
        return await handle.query(RolloutWorkflow.status)

    return asyncio.run(query())
