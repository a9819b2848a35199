"""`posttrain-env server` as a process: clean shutdown with its embedded Temporal server, the
Temporal child dying with it even on SIGKILL, and a busy port reported instead of reused."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.gateway.server import ServerProcess, command


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
            timeout=60,
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
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "HF_TOKEN" in done.stderr
    assert "Traceback" not in done.stderr


def test_uv_run_server_is_the_same_command_with_its_options() -> None:
    done = subprocess.run(
        [*command("server"), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "--host" in done.stdout and "--port" in done.stdout and "--no-worker" in done.stdout
