"""`posttrain-env cluster-local`: the production shape on one machine (docs/deployment.md,
"Production shape"). One file-backed Temporal dev server (the search attributes registered at its
start, as
the embedded server does), gateways (`server --no-worker`) on ports of their own, separate
`posttrain-env worker` processes, and one server key file that every process is given.

    posttrain-env cluster-local [--gateways 2] [--workers 2] [--port 8000] [--state-dir DIR]

It prints each process's address, pid and log, then supervises: a child that exits is reported
(its status and the end of its log), never restarted behind anyone's back, and the others keep
serving (the topology is meant to show what survives a lost process). SIGINT or SIGTERM stops
every process within 30 s: the gateways and workers first (each stops by itself within its
own deadline; any still alive after `MEMBERS_GRACE_S` is killed), then Temporal.

`LocalCluster` is the same topology as a library: the fault-matrix harness and the tests start,
kill (SIGKILL) and restart its members one by one.

Every child runs in a process group of its own, so a kill reaches everything it started (but
local jobs, which run detached in sessions of their own and outlive their worker by design),
and gets a parent-death signal: nothing outlives a supervisor that was itself killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

import httpx

from posttrain_common.keys import KEY_FILE_SETTING, KEY_HEX_SETTING, ServerKey, ServerKeyError
from posttrain_server.temporal.dev_server import free_ports, port_busy, start_dev_command

MemberKind = Literal["temporal", "gateway", "worker"]

# A cold start of one of our Python processes on a loaded 2-core machine takes up to ~30 s.
READY_TIMEOUT_S = 120.0
# Stopping: gateways and workers end by themselves within their own 25 s backstop; past this
# they are killed, so that Temporal's stop (a few seconds) still fits in 30 s.
MEMBERS_GRACE_S = 20.0
TEMPORAL_GRACE_S = 6.0
# What a worker logs once it polls (posttrain_server/worker.py).
WORKER_READY_LINE = "worker on task queue"
SUPERVISE_EVERY_S = 0.5

_PR_SET_PDEATHSIG = 1
# Resolved before any fork: the child between fork and exec only calls into C.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ClusterError(RuntimeError):
    """The topology cannot start: a port is taken, a key is unusable, a process exited."""


def our_command(*args: str) -> list[str]:
    """`posttrain-env ARGS` with this interpreter's installation (its console script when it
    has one, so that `ps` names it)."""
    script = Path(sys.executable).with_name("posttrain-env")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "posttrain_server.cli", *args]


def spawn(command: Sequence[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start `command` in a process group of its own, its output appended to `log`, dying with
    this process (SIGTERM). Call it from a thread that lives as long as the child should: the
    parent-death signal follows the thread that forked, not the process."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            list(command),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def kill_group(proc: subprocess.Popen[bytes], wait_s: float = 10.0) -> None:
    """SIGKILL the process and its group, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=wait_s)


@dataclass
class Member:
    """One process of the topology, started again with the same command, environment, ports
    and log."""

    name: str
    kind: MemberKind
    command: list[str]
    env: dict[str, str]
    log_path: Path
    url: str | None = None  # a gateway's base URL; a worker's metrics
    address: str | None = None  # Temporal's gRPC address
    proc: subprocess.Popen[bytes] | None = None
    # Set when the exit was asked for (a stop, a kill by the harness): not reported as a death.
    exit_expected: bool = False
    reported: bool = False
    _log_start: int = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.exit_expected = False
        self.reported = False
        self.proc = spawn(self.command, self.env, self.log_path)

    def kill(self) -> None:
        """SIGKILL (the whole group) and reap: a machine's crash, as the fault matrix plays it."""
        if self.proc is not None:
            self.exit_expected = True
            kill_group(self.proc)

    def log_since_start(self) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_start)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_since_start().splitlines()[-lines:])

    async def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until the member serves: Temporal answers, a gateway's /health is 200, a worker has
        logged that it polls. Raises ClusterError when it exits first or takes too long."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2, trust_env=False) as http:
            while not await self._ready(http):
                if self.proc is None or self.proc.poll() is not None:
                    status = None if self.proc is None else self.proc.returncode
                    raise ClusterError(
                        f"{self.name} exited (status {status}) before it was ready; "
                        f"its log ({self.log_path}) ends:\n{self.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"{self.name} was not ready within {timeout_s:g} s; its log "
                        f"({self.log_path}) ends:\n{self.log_tail()}"
                    )
                await asyncio.sleep(0.1)

    async def _ready(self, http: httpx.AsyncClient) -> bool:
        if self.kind == "temporal":
            from temporalio.client import Client

            assert self.address is not None
            try:
                await Client.connect(self.address)
            except RuntimeError:
                return False
            return True
        if self.kind == "gateway":
            assert self.url is not None
            try:
                return (await http.get(f"{self.url}/health")).status_code == 200
            except httpx.TransportError:
                return False
        return WORKER_READY_LINE in self.log_since_start()


@dataclass(frozen=True)
class ClusterConfig:
    state_dir: Path
    gateway_ports: tuple[int, ...] = (8000, 8001)
    workers: int = 2
    temporal_port: int = 7233
    temporal_ui_port: int | None = 8233  # None: no UI
    # The Temporal server's own metrics, and the first worker's (the next ones follow). None:
    # free ports chosen at the start (printed, like every address).
    temporal_metrics_port: int | None = None
    worker_metrics_port: int | None = None
    host: str = "127.0.0.1"
    # The environment every child starts from (the backend and its settings, the task queue,
    # the tasks dir, ...: docs/deployment.md, "Production shape" says which must be equal on every
    # replica).
    environment: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def key_path(self) -> Path:
        """The deployment's key file, unless the environment gives one (or the key in hex)."""
        given = self.environment.get(KEY_FILE_SETTING)
        return Path(given) if given else self.state_dir / "server.key"


class LocalCluster:
    """The production topology on this machine. `start()` starts Temporal, then every gateway
    and worker at once; `kill()` and `restart()` act on chosen members; `stop()` stops all
    within 30 s."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        logs = config.state_dir / "logs"
        env = self._child_environment()
        fixed = {config.temporal_port, *config.gateway_ports, config.temporal_ui_port or 0}
        free = iter(free_ports(1 + config.workers, avoid=fixed))
        self.temporal_metrics_port = config.temporal_metrics_port or next(free)
        self.worker_metrics_ports = [
            next(free) if config.worker_metrics_port is None else config.worker_metrics_port + n
            for n in range(config.workers)
        ]
        temporal = start_dev_command(
            config.state_dir / "temporal.db",
            config.temporal_port,
            config.temporal_ui_port,
            self.temporal_metrics_port,
        )
        self.temporal = Member(
            "temporal",
            "temporal",
            temporal,
            env,
            logs / "temporal.log",
            address=config.temporal_address,
        )
        self.gateways = [
            Member(
                f"gateway-{n}",
                "gateway",
                our_command("server", "--no-worker", "--host", config.host, "--port", str(port)),
                env,
                logs / f"gateway-{n}.log",
                url=f"http://{_url_host(config.host)}:{port}",
            )
            for n, port in enumerate(config.gateway_ports, start=1)
        ]
        self.workers = [
            Member(
                f"worker-{n}",
                "worker",
                our_command("worker"),
                {**env, "POSTTRAIN_WORKER_METRICS_PORT": str(metrics_port)},
                logs / f"worker-{n}.log",
                url=f"http://127.0.0.1:{metrics_port}/metrics",
            )
            for n, metrics_port in enumerate(self.worker_metrics_ports, start=1)
        ]

    @property
    def members(self) -> list[Member]:
        return [self.temporal, *self.gateways, *self.workers]

    @property
    def key(self) -> ServerKey:
        hex_key = self.config.environment.get(KEY_HEX_SETTING)
        if hex_key:
            return ServerKey.from_hex(hex_key)
        return ServerKey.from_file(self.config.key_path)

    def _child_environment(self) -> dict[str, str]:
        config = self.config
        # A Temporal of the environment's own (its address, namespace, TLS, API key) is not
        # this one: every TEMPORAL_ setting is replaced by the local server's address.
        env = {k: v for k, v in config.environment.items() if not k.startswith("TEMPORAL_")}
        # Ports of one process each: the workers' are set per worker; the SDK's own metrics
        # (one port for every process here) are left to a production topology.
        for name in ("POSTTRAIN_WORKER_METRICS_PORT", "POSTTRAIN_TEMPORAL_METRICS_PORT"):
            env.pop(name, None)
        env["TEMPORAL_ADDRESS"] = config.temporal_address
        env["POSTTRAIN_STATE_DIR"] = str(config.state_dir)
        if not env.get(KEY_HEX_SETTING):
            env[KEY_FILE_SETTING] = str(config.key_path)
        return env

    async def start(self) -> None:
        """Start every member and wait until each serves. Raises ClusterError (a port taken,
        an unusable key, a member that exits or never gets ready); nothing is left running."""
        config = self.config
        config.state_dir.mkdir(parents=True, exist_ok=True)
        ports = [
            config.temporal_port,
            *config.gateway_ports,
            self.temporal_metrics_port,
            *self.worker_metrics_ports,
        ]
        if config.temporal_ui_port is not None:
            ports.append(config.temporal_ui_port)
        taken = [port for port in ports if port_busy(port)]
        if taken:
            raise ClusterError(
                f"port(s) {', '.join(map(str, taken))} on 127.0.0.1 are in use: stop what holds "
                "them or choose others (--port, --temporal-port, --temporal-ui-port, "
                "--temporal-metrics-port, --worker-metrics-port)"
            )
        if not config.environment.get(KEY_HEX_SETTING) and not config.environment.get(
            KEY_FILE_SETTING
        ):
            # This topology's own key, made once (0600) and kept with its Temporal database.
            ServerKey.load_or_create(config.key_path)
        try:
            self.key  # noqa: B018 - checked now, not once per process, with the same message
        except ServerKeyError as exc:
            raise ClusterError(str(exc)) from None
        try:
            await self.restart(*self.members)
        except BaseException:
            await self.stop()
            raise

    async def restart(self, *members: Member) -> None:
        """Start `members` again (each must have exited): Temporal first, then the others at
        once; returns when every one serves."""
        chosen = list(members)
        if self.temporal in chosen:
            self.temporal.spawn()
            await self.temporal.wait_ready()
            chosen.remove(self.temporal)
        for member in chosen:
            member.spawn()
        await asyncio.gather(*(member.wait_ready() for member in chosen))

    def kill(self, *members: Member) -> None:
        for member in members:
            member.kill()

    def newly_dead(self) -> list[Member]:
        """Members that exited without being asked to, not reported before (marked now)."""
        dead = [
            m
            for m in self.members
            if m.proc is not None and not m.alive and not m.exit_expected and not m.reported
        ]
        for member in dead:
            member.reported = True
        return dead

    async def stop(self) -> dict[str, int | None]:
        """Stop every member within 30 s: SIGTERM to the gateways and workers (each stops
        within its own deadline), SIGKILL to any still there after MEMBERS_GRACE_S, then the
        same for Temporal. Each member's exit status (None: never started)."""
        services = [*self.gateways, *self.workers]
        await _terminate(services, MEMBERS_GRACE_S)
        await _terminate([self.temporal], TEMPORAL_GRACE_S)
        for member in self.members:  # anything a member left in its group goes with it
            if member.proc is not None:
                kill_group(member.proc, wait_s=2)
        return {m.name: (m.proc.returncode if m.proc else None) for m in self.members}

    def describe(self) -> list[str]:
        """A line per member: its name, address, pid and log."""
        lines = []
        for member in self.members:
            where = member.url or member.address or ""
            if member.kind == "temporal":
                metrics = f"metrics http://127.0.0.1:{self.temporal_metrics_port}/metrics"
                ui = self.config.temporal_ui_port
                shown = metrics if ui is None else f"UI http://127.0.0.1:{ui}, {metrics}"
                where += f" ({shown})"
            elif member.kind == "gateway":
                where += " (metrics: /metrics)"
            lines.append(
                f"{member.name:<10} {where or '-':<44} pid {member.pid}  log {member.log_path}"
            )
        return lines


async def _terminate(members: Sequence[Member], grace_s: float) -> None:
    """SIGTERM each running member, wait up to `grace_s` for all, SIGKILL what is left."""
    running = [m for m in members if m.alive]
    for member in running:
        member.exit_expected = True
        assert member.proc is not None
        with contextlib.suppress(ProcessLookupError):
            member.proc.send_signal(signal.SIGTERM)

    async def reaped(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, grace_s)

    await asyncio.gather(*(reaped(m.proc) for m in running if m.proc is not None))
    for member in running:
        if member.alive:
            assert member.proc is not None
            kill_group(member.proc)


def _url_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


# -- the command ----------------------------------------------------------------------------------


CLUSTER_HELP = (
    "the production shape on this machine: a Temporal dev server, gateways (--no-worker) "
    "and separate workers on one server key"
)


def add_cluster_local_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gateways", type=int, default=2, help="gateway processes (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--port", type=int, default=8000, help="the first gateway's port; the next ones follow"
    )
    parser.add_argument("--host", default="127.0.0.1", help="the gateways' bind address")
    parser.add_argument("--temporal-port", type=int, default=7233)
    parser.add_argument("--temporal-ui-port", type=int, default=8233)
    parser.add_argument("--no-ui", action="store_true", help="no Temporal UI")
    parser.add_argument(
        "--temporal-metrics-port",
        type=int,
        default=None,
        help="the Temporal server's own metrics (default: a free port, printed)",
    )
    parser.add_argument(
        "--worker-metrics-port",
        type=int,
        default=None,
        help="the first worker's metrics; the next ones follow (default: free ports, printed)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the topology's state (Temporal's database, the key, logs); default "
        "$POSTTRAIN_STATE_DIR/cluster-local",
    )


def config_from(args: argparse.Namespace, environment: Mapping[str, str]) -> ClusterConfig:
    """The topology the parsed arguments ask for. Raises ClusterError for counts out of range."""
    if not 1 <= args.gateways <= 16 or not 1 <= args.workers <= 16:
        raise ClusterError("--gateways and --workers take 1 to 16")
    if args.state_dir is not None:
        state_dir = args.state_dir
    else:
        from posttrain_common.settings import default_state_dir

        base = environment.get("POSTTRAIN_STATE_DIR")
        state_dir = (Path(base) if base else default_state_dir()) / "cluster-local"
    return ClusterConfig(
        state_dir=state_dir.resolve(),
        gateway_ports=tuple(args.port + n for n in range(args.gateways)),
        workers=args.workers,
        temporal_port=args.temporal_port,
        temporal_ui_port=None if args.no_ui else args.temporal_ui_port,
        temporal_metrics_port=args.temporal_metrics_port,
        worker_metrics_port=args.worker_metrics_port,
        host=args.host,
        environment=environment,
    )


async def serve_cluster(config: ClusterConfig, out: TextIO = sys.stdout) -> int:
    """Run the topology until SIGINT/SIGTERM (or until every member has exited); the exit
    status: 0, or 1 when a member could not start or exited on its own."""
    from posttrain_server.shutdown import ShutdownDeadline, stop_on_signals

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    # Its readiness probes would log every /health request at INFO.
    logging.getLogger("httpx").setLevel(logging.WARNING)

    cluster = LocalCluster(config)
    # The stop below is bounded by construction; this is the backstop of the supervisor itself
    # (its children get SIGTERM from their parent-death signal if it has to exit this way).
    deadline = ShutdownDeadline("cluster-local", 29.0)
    stop = stop_on_signals(deadline)
    started = time.monotonic()
    starting = asyncio.create_task(cluster.start())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # stopped while starting
        starting.cancel()
        with contextlib.suppress(BaseException):
            await starting
        await cluster.stop()
        return 0
    stopped.cancel()
    if starting.exception() is not None:
        say(f"posttrain-env cluster-local: {starting.exception()}")
        return 1
    say(f"posttrain-env cluster-local: ready in {time.monotonic() - started:.1f} s")
    say(f"state      {config.state_dir}")
    key = cluster.key
    source = KEY_HEX_SETTING if config.environment.get(KEY_HEX_SETTING) else config.key_path
    say(f"server key {source} (fingerprint {key.fingerprint()})")
    for line in cluster.describe():
        say(line)
    say("clients: any gateway serves any session; SIGINT (Ctrl-C) or SIGTERM stops them all")
    deaths = 0
    while not stop.is_set():
        for member in cluster.newly_dead():
            deaths += 1
            assert member.proc is not None
            say(
                f"posttrain-env cluster-local: {member.name} (pid {member.pid}) exited with "
                f"status {member.proc.returncode}; not restarted, the others keep serving. "
                f"Its log ({member.log_path}) ends:\n{member.log_tail()}"
            )
        if not any(m.alive for m in cluster.members):
            say("posttrain-env cluster-local: every process has exited")
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SUPERVISE_EVERY_S)
    began = time.monotonic()
    statuses = await cluster.stop()
    deadline.cancel()
    say(
        f"posttrain-env cluster-local: stopped in {time.monotonic() - began:.1f} s ("
        + ", ".join(f"{name} {status}" for name, status in statuses.items())
        + ")"
    )
    return 1 if deaths else 0


def run_cluster_local(args: argparse.Namespace) -> int:
    try:
        config = config_from(args, dict(os.environ))
    except ClusterError as exc:
        print(f"posttrain-env cluster-local: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(serve_cluster(config))
