"""The server processes a benchmark measures, in either production shape, with `_probe.py`.

- `allinone`: `posttrain-env server` (gateway, in-process worker, embedded Temporal dev server);
- `split`: a Temporal dev server, one `posttrain-env server --no-worker` and `workers`
  `posttrain-env worker` processes, sharing one state dir (the fake backend's files) and one
  server key file. With `external_temporal` (`host:port`, plain gRPC, namespace `default`,
  our search attributes registered by `posttrain-env temporal setup`), no dev server is started:
  the processes use that Temporal, whose own CPU and memory are then not measured here.

Every process runs under `bench/_probe.py`: its event-loop lag, the gateway's Temporal update
times and the SDK's Prometheus metrics are read back by `Probes`.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from activities.backends.fake.backend import FakeScenario
from posttrain_server.temporal.dev_server import start_dev_command

PROBE = Path(__file__).with_name("_probe.py")
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    probe_out: Path | None = None
    metrics_port: int | None = None
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> float:
        """SIGTERM, wait; seconds it took (SIGKILL of the group after STOP_TIMEOUT_S)."""
        if self.popen is None:
            return 0.0
        started = time.monotonic()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        took = time.monotonic() - started
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return took

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user+system) so far of this process and of each of its descendants,
        by command name (the embedded Temporal server is the all-in-one server's child)."""
        if self.popen is None:
            return {}
        return tree_cpu_s(self.popen.pid, self.name)

    def rss_mib(self) -> dict[str, float]:
        return {} if self.popen is None else tree_rss_mib(self.popen.pid, self.name)


def tree_rss_mib(root: int, name: str) -> dict[str, float]:
    """Resident memory (MiB) of a process and of each of its descendants, by command name."""
    found: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None:
            continue
        ancestor, chain = pid, 0
        while ancestor != root and chain < 50:
            parent = _stat(ancestor)
            if parent is None:
                break
            ancestor, chain = parent[1], chain + 1
        if ancestor != root:
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        kib = next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0
        )
        label = name if pid == root else f"{name}/{stat[0]}"
        found[label] = found.get(label, 0.0) + kib / 1024
    return found


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(command, parent pid, CPU seconds) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    command = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw.rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return command, int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks


def tree_cpu_s(root: int, name: str) -> dict[str, float]:
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = found
    cpu: dict[str, float] = {}
    for pid, (command, _, seconds) in stats.items():
        ancestor, chain = pid, 0
        while ancestor != root and ancestor in stats and chain < 50:
            ancestor, chain = stats[ancestor][1], chain + 1
        if ancestor == root:
            label = name if pid == root else f"{name}/{command}"
            cpu[label] = cpu.get(label, 0.0) + seconds
    return cpu


@dataclass
class Topology:
    shape: str  # "allinone" | "split"
    state: Path
    scenario: FakeScenario
    tasks_dir: Path
    workers: int = 2
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    temporal_port: int = field(default_factory=free_port)
    external_temporal: str | None = None
    procs: list[Proc] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def temporal_address(self) -> str:
        return self.external_temporal or f"127.0.0.1:{self.temporal_port}"

    @property
    def gateway(self) -> Proc:
        return next(p for p in self.procs if p.name == "gateway")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "TEMPORAL_"))}
        env.pop("HF_TOKEN", None)
        scenario = self.state / "scenario.json"
        scenario.write_text(self.scenario.model_dump_json())
        env.update(
            {
                "POSTTRAIN_BACKEND": "fake",
                "POSTTRAIN_STATE_DIR": str(self.state),
                "POSTTRAIN_SERVER_KEY_FILE": str(self.state / "server.key"),
                "POSTTRAIN_FAKE_SCENARIO": str(scenario),
                "POSTTRAIN_TASKS_DIR": str(self.tasks_dir),
                "POSTTRAIN_TEMPORAL_PORT": str(self.temporal_port),
                "POSTTRAIN_TEMPORAL_UI_PORT": str(free_port()),
                "PYTHONUNBUFFERED": "1",
                **self.extra_env,
            }
        )
        return env

    def _probed(self, name: str, *args: str, env: dict[str, str]) -> Proc:
        out = self.state / f"probe-{name}.jsonl"
        metrics = free_port()
        return Proc(
            name,
            [sys.executable, str(PROBE), *args],
            {**env, "BENCH_PROBE_OUT": str(out), "BENCH_METRICS_PORT": str(metrics)},
            self.state / f"{name}.log",
            probe_out=out,
            metrics_port=metrics,
        )

    def start(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        key = self.state / "server.key"
        if not key.exists():  # one key for every process of the deployment
            key.write_bytes(secrets.token_bytes(32))
            key.chmod(0o600)
        env = self.env()
        gateway_args = ["server", "--port", str(self.port)]
        if self.shape == "split":
            if self.external_temporal is None:
                temporal = Proc(
                    "temporal",
                    start_dev_command(self.state / "temporal.db", self.temporal_port),
                    env,
                    self.state / "temporal.log",
                )
                self.procs.append(temporal)
                temporal.start()
                _wait_port(self.temporal_port, temporal)
            env = {**env, "TEMPORAL_ADDRESS": self.temporal_address}
            for n in range(self.workers):
                worker = self._probed(f"worker{n}", "worker", env=env)
                self.procs.append(worker)
                worker.start()
            gateway_args.append("--no-worker")
        gateway = self._probed("gateway", *gateway_args, env=env)
        self.procs.append(gateway)
        gateway.start()
        self._wait_healthy(gateway)
        for worker in (p for p in self.procs if p.name.startswith("worker")):
            _wait_log(worker, "worker on task queue")

    def restart_gateway(self) -> None:
        """SIGTERM the gateway and start it again on the same port: a gateway with nothing
        cached, as a restarted or another replica is (split shape: the workers stay)."""
        gateway = self.gateway
        gateway.stop()
        gateway.start()
        self._wait_healthy(gateway)

    def _wait_healthy(self, gateway: Proc) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if not gateway.alive():
                raise RuntimeError(f"the gateway exited:\n{gateway.tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start:\n{gateway.tail()}")
            time.sleep(0.2)

    def stop(self) -> dict[str, float]:
        """Stop the gateway, then the workers, then Temporal; each one's SIGTERM-to-exit time."""
        order = sorted(self.procs, key=lambda p: {"gateway": 0, "temporal": 2}.get(p.name, 1))
        return {p.name: p.stop() for p in order}

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.tail()}" for p in self.procs)


def _wait_port(port: int, proc: Proc) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} did not listen:\n{proc.tail()}")
        time.sleep(0.1)


def _wait_log(proc: Proc, marker: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while marker not in proc.log.read_text(errors="replace"):
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} did not start:\n{proc.tail()}")
        time.sleep(0.2)


# -- reading the probes back ------------------------------------------------------------------


def probe_samples(proc: Proc, kind: str, since: float, until: float) -> list[dict]:
    """The probe's samples of `kind` taken in [since, until] (unix time)."""
    if proc.probe_out is None or not proc.probe_out.exists():
        return []
    found = []
    for line in proc.probe_out.read_text().splitlines():
        try:
            sample = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if sample["kind"] == kind and since <= sample["t"] <= until:
            found.append(sample)
    return found


def samples(proc: Proc, kind: str, since: float, until: float) -> list[float]:
    return [sample["ms"] for sample in probe_samples(proc, kind, since, until)]


Histogram = dict[str, dict[float, float]]  # metric -> upper bound -> cumulative count


def metrics_text(proc: Proc) -> str | None:
    """The process's Prometheus endpoint as text; None without one or when it does not answer."""
    if proc.metrics_port is None:
        return None
    try:
        return httpx.get(f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None


def scrape(proc: Proc) -> Histogram:
    """Every histogram of the process's Prometheus endpoint, summed over label sets."""
    text = metrics_text(proc)
    if text is None:
        return {}
    found: Histogram = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        if name.endswith("_bucket"):
            le = series.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            bucket = found.setdefault(name[: -len("_bucket")], {})
            bucket[bound] = bucket.get(bound, 0.0) + float(value)
        else:  # counters and gauges, and a histogram's _sum and _count
            counter = found.setdefault(name, {})
            counter[0.0] = counter.get(0.0, 0.0) + float(value)
    return found


def labelled(proc: Proc, name: str, labels: tuple[str, ...]) -> dict[str, float]:
    """A counter of the process's Prometheus endpoint, summed by the values of `labels`."""
    text = metrics_text(proc)
    if text is None:
        return {}
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            series, value = line.rsplit(" ", 1)
            key = ":".join(
                series.split(f'{label}="', 1)[1].split('"', 1)[0] if f'{label}="' in series else "?"
                for label in labels
            )
            found[key] = found.get(key, 0.0) + float(value)
    return found


FAILURES = ("temporal_request_failure", "temporal_long_request_failure")


def request_failures(proc: Proc) -> dict[str, float]:
    """The process's failed Temporal requests (those the SDK retried included), by
    operation and status code."""
    found: dict[str, float] = {}
    for name in FAILURES:
        for key, count in labelled(proc, name, ("operation", "status_code")).items():
            found[key] = found.get(key, 0.0) + count
    return found


def failures_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    return {k: int(v - before.get(k, 0.0)) for k, v in after.items() if v - before.get(k, 0.0)}


def histogram_delta(before: Histogram, after: Histogram, name: str) -> dict[float, float]:
    then, now = before.get(name, {}), after.get(name, {})
    return {bound: now[bound] - then.get(bound, 0.0) for bound in sorted(now)}


def quantile(cumulative: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile `q` (None without samples)."""
    if not cumulative:
        return None
    total = max(cumulative.values())
    if total <= 0:
        return None
    for bound in sorted(cumulative):
        if cumulative[bound] >= q * total:
            return bound
    return None


def counter_delta(before: Histogram, after: Histogram, name: str) -> float:
    return after.get(name, {}).get(0.0, 0.0) - before.get(name, {}).get(0.0, 0.0)
