"""`posttrain-env server` as a process: clean shutdown with its embedded Temporal server, the
Temporal child dying with it even on SIGKILL, a busy port reported instead of reused, and every
process kind (the all-in-one server, the gateway alone, a worker) stopping within 30 s of
SIGTERM whatever calls are open."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from tests.gateway.production import (
    SHUTDOWN_LIMIT_S,
    gateway,
    key_file,
    kill_group,
    long_calls_open,
    seconds_to_exit,
    start_worker,
    temporal_client,
    workflow_task_failing,
)
from tests.gateway.server import ServerProcess, command
from tests.startup import START_REFUSAL_S
from tests.workflows.test_worker_restart import dev_server


def gone(pid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists():
        try:  # a zombie child of ours still has a /proc entry: reap it
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().split()[2] == "Z":
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_sigterm_stops_the_server_and_its_temporal_and_exits_0(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "state")
    server.start()
    assert server.proc is not None
    temporal_pid = int((server.state_dir / "temporal.pid").read_text())
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    assert gone(temporal_pid)
    assert not (server.state_dir / "temporal.pid").exists()


def test_the_embedded_temporal_dies_with_a_sigkilled_server_and_a_restart_works(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path / "state")
    server.start()
    assert server.proc is not None
    temporal_pid = int((server.state_dir / "temporal.pid").read_text())
    server.proc.kill()  # the server alone: its Temporal child gets the parent-death signal
    server.proc.wait(timeout=10)
    assert gone(temporal_pid)
    server.start()  # same state dir, same ports: the pid file is stale, nothing is reused
    assert int((server.state_dir / "temporal.pid").read_text()) != temporal_pid
    assert server.stop() == 0


def test_a_busy_temporal_port_is_reported_not_reused(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "state")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", server.temporal_port))
        holder.listen()
        done = subprocess.run(
            [*command(), "server", "--port", str(server.port)],
            env=server.env(),
            capture_output=True,
            text=True,
            timeout=START_REFUSAL_S,
            check=False,
        )
    assert done.returncode == 1
    assert f"port {server.temporal_port}" in done.stderr and "TEMPORAL_ADDRESS" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_backend_setting_is_a_clear_start_up_error(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "state", extra_env={"POSTTRAIN_BACKEND": "hf"})
    done = subprocess.run(
        [*command(), "server", "--port", str(server.port)],
        env=server.env(),
        capture_output=True,
        text=True,
        timeout=START_REFUSAL_S,
        check=False,
    )
    assert done.returncode == 1 and "HF_TOKEN" in done.stderr
    assert "Traceback" not in done.stderr


def test_uv_run_server_is_the_same_command_with_its_options() -> None:
    done = subprocess.run(
        [*command("server"), "--help"],
        capture_output=True,
        text=True,
        timeout=START_REFUSAL_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--host" in done.stdout and "--port" in done.stdout and "--no-worker" in done.stdout


# -- SIGTERM within 30 s, whatever is open (docs/deployment.md "Stopping") -------------------------

LONG_JOBS = FakeScenario(jobs=[FakeJobScript(queue_s=0, run_s=3600)])


async def test_sigterm_stops_the_all_in_one_server_within_30_s_with_long_calls_open_and_a_workflow_task_failing(  # noqa: E501
    tmp_path: Path,
) -> None:
    """Before the gateway's grace period, a `jobs_wait` of 300 s over /ws kept the server alive
    296 s after SIGTERM (uvicorn waited for every open call)."""
    server = ServerProcess(tmp_path / "state", scenario=LONG_JOBS)
    server.start()
    assert server.proc is not None
    temporal_pid = int((server.state_dir / "temporal.pid").read_text())
    try:
        client = await temporal_client(server.temporal_address)
        async with (
            long_calls_open(server, client),
            workflow_task_failing(server, client, server.log_path),
        ):
            took = await seconds_to_exit(server.proc)
        assert server.proc.returncode == 0, server.log()
        assert took < SHUTDOWN_LIMIT_S, (took, server.log())
        assert gone(temporal_pid)
    finally:
        kill_group(server.proc)


async def test_sigterm_stops_a_gateway_and_a_worker_of_an_external_temporal_within_30_s_each(
    tmp_path: Path,
) -> None:
    """The production processes: `server --no-worker` with a 300 s `jobs_wait` open over /ws
    and over MCP, then `posttrain-env worker` with those waits in flight in its episodes and
    another episode's workflow task failing."""
    key = key_file(tmp_path / "keys" / "server.key")
    async with dev_server(tmp_path / "temporal.db") as (address, client):
        server = gateway(tmp_path / "state", address, key, LONG_JOBS)
        worker_log = tmp_path / "worker.log"
        worker = start_worker(server.env(), worker_log)
        try:
            server.start("--no-worker")
            assert server.proc is not None
            async with (
                long_calls_open(server, client),
                workflow_task_failing(server, client, worker_log),
            ):
                took = await seconds_to_exit(server.proc)
                assert server.proc.returncode == 0, server.log()
                assert took < SHUTDOWN_LIMIT_S, (took, server.log())
                took = await seconds_to_exit(worker)
                log = worker_log.read_text(errors="replace")[-3000:]
                assert worker.returncode == 0, log
                assert took < SHUTDOWN_LIMIT_S, (took, log)
        finally:
            kill_group(worker)
            if server.proc is not None:
                kill_group(server.proc)
