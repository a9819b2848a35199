"""The real server as a test runs it: `posttrain-env server` in its own process group, with the
embedded file-backed Temporal dev server, an in-process worker and the fake backend, on free
ports and a state dir of the test's own. `kill()` is a SIGKILL of the whole group."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core.env_server.mcp_types import CallToolAction
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.backends.fake.backend import FakeBackend, FakeScenario
from activities.backends.interface import JobRequest
from posttrain_common.contracts.episode_calls import EpisodeStatus
from posttrain_common.contracts.jobs import JobRole
from tests.payload_limits import assert_no_violation_in
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import episode_workflow_id

START_TIMEOUT_S = 120.0  # a cold start on a loaded 2-core machine (4 test workers) takes ~30 s


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def command(name: str = "posttrain-env") -> list[str]:
    exe = Path(sys.executable).with_name(name)
    return [str(exe)] if exe.exists() else [shutil.which(name) or name]


class PortTaken(RuntimeError):
    """One of the server's ports was taken between choosing it and binding it."""


@dataclass
class ServerProcess:
    state_dir: Path
    scenario: FakeScenario = field(default_factory=FakeScenario)
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    temporal_port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "server.log"

    def env(self) -> dict[str, str]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        scenario = self.state_dir / "scenario.json"
        scenario.write_text(self.scenario.model_dump_json())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "TEMPORAL_"))}
        env.pop("HF_TOKEN", None)
        env.update(
            {
                "POSTTRAIN_BACKEND": "fake",
                "POSTTRAIN_STATE_DIR": str(self.state_dir),
                "POSTTRAIN_FAKE_SCENARIO": str(scenario),
                "POSTTRAIN_WATCH_INTERVAL_S": "1",
                "POSTTRAIN_TEMPORAL_PORT": str(self.temporal_port),
                "POSTTRAIN_TEMPORAL_UI_PORT": str(self.ui_port),
                # Storage is free here unless a test prices it: these tests' money figures are
                # their jobs' (tests/workflows/test_storage.py prices it).
                "POSTTRAIN_STORAGE_USD_PER_TB_MONTH": "0",
                **self.extra_env,
            }
        )
        return env

    def start(self, *args: str) -> None:
        """Start and wait for /health. On a first start, a port taken in the meantime (tests
        run in parallel) is replaced; a restart keeps its ports, as clients expect."""
        first = self.proc is None
        for attempt in range(3):
            try:
                self._start_once(*args)
                return
            except PortTaken:
                if not first or attempt == 2:
                    raise
                self.port, self.temporal_port, self.ui_port = free_port(), free_port(), free_port()

    def _start_once(self, *args: str) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*command(), "server", "--port", str(self.port), *args],
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                if "already in use" in self.log_path.read_text(errors="replace")[log_start:]:
                    raise PortTaken(self.log())
                raise RuntimeError(f"the server exited:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{self.log()}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the whole server: gateway, worker and embedded Temporal."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.check_payload_limits()

    def stop(self) -> int:
        """SIGTERM and wait; the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        with_group = self.proc.pid
        try:  # nothing of ours may outlive the server
            os.killpg(with_group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.check_payload_limits()
        return self.proc.returncode

    def check_payload_limits(self) -> None:
        """Fail if the server's worker ever had a payload refused for its size (TMPRL1103):
        the same check the in-process tests make (tests/conftest.py)."""
        assert_no_violation_in(self.log_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    # -- what the fake backend and Temporal saw -----------------------------------------------

    def requests(self, role: JobRole | None = None) -> list[JobRequest]:
        backend = FakeBackend(self.state_dir / "fake", self.scenario)
        return [r for r in backend.requests() if role is None or r.role is role]

    async def episode_status(self, episode_id: str) -> EpisodeStatus:
        client = await Client.connect(self.temporal_address, data_converter=pydantic_data_converter)
        handle = client.get_workflow_handle_for(
            EpisodeWorkflow.run, episode_workflow_id(episode_id)
        )
        return await handle.query(EpisodeWorkflow.status)

    async def answered(self, episode_id: str, request_id: str) -> bool:
        """Whether the episode has answered the request (its update has returned)."""
        client = await Client.connect(self.temporal_address, data_converter=pydantic_data_converter)
        handle = client.get_workflow_handle_for(
            EpisodeWorkflow.run, episode_workflow_id(episode_id)
        )
        return await handle.query(EpisodeWorkflow.answered, request_id)

    def wait_status(
        self,
        episode_id: str,
        until: Callable[[EpisodeStatus], bool] | None = None,
        timeout_s: float = 60.0,
    ) -> EpisodeStatus:
        """The episode's status once `until(status)` holds (from a sync test)."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = asyncio.run(self.episode_status(episode_id))
            if until is None or until(status):
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"episode {episode_id} never reached the state: {status}")
            time.sleep(0.2)


def serving(
    tmp_path_factory: pytest.TempPathFactory, scenario: FakeScenario
) -> Iterator[ServerProcess]:
    """The body of a module's server fixture: a server of `scenario`, stopped after the tests."""
    proc = ServerProcess(tmp_path_factory.mktemp("server"), scenario=scenario)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def ws_url(server: ServerProcess, query: str = "") -> str:
    return f"ws://127.0.0.1:{server.port}/ws" + (f"?{query}" if query else "")


def frame(kind: str, data: dict[str, Any] | None = None) -> str:
    return json.dumps({"type": kind, **({"data": data} if data is not None else {})})


def wait_until_ended(env: Any, job_id: str, timeout_s: int = 300) -> tuple[Any, list[str]]:
    """`jobs_wait` (OpenEnv `step`) until the job leaves queued/running: the last result and
    every state the waits returned, in order."""
    states: list[str] = []
    while True:
        waited = env.step(
            CallToolAction(
                tool_name="jobs_wait", arguments={"job_id": job_id, "timeout_s": timeout_s}
            )
        )
        states.append(waited.observation.result["data"]["state"])
        if states[-1] not in {"queued", "running"}:
            return waited, states
