"""Many live episodes on the split shape: latency, CPU, memory and history per live episode.

    uv run python bench/scale.py [--live 100,300,1000] [--workers 2] [--interval 5]
        [--duration 60] [--quiet 20] [--settle 10] [--sample 10] [--admit-timeout 600] [--keep]
        [--temporal-address HOST:PORT]

The split production shape (`bench/_topology.py`): a file-backed Temporal dev server,
`posttrain-env server --no-worker` and `--workers` `posttrain-env worker` processes, on the fake
jobs backend. The levels grow one set of episodes: each episode is reset and submits one job
that runs for a day, then (`bench/gateway_latency.py`'s live mode) calls `jobs_status` every
`--interval` s (jittered), rotating over OpenEnv `/ws`, `POST /mcp` and the bare Temporal update
the gateway makes, for `--duration` s; then `--quiet` s with no calls at all. The idle
topology (before any episode, `--settle` s after start-up, over `--quiet` s) is the baseline
of the CPU and memory figures. Per level:

- latency: p50/p99 of each path and the gateway paths' ratios to the bare update, the offered
  and achieved call rates (achieved short of offered: something saturated), client errors
  (calls answered with an error, sessions that could not be opened);
- CPU-seconds per episode per minute of the Temporal server, the workers, the gateway and this
  benchmark's own clients, while calling and while quiet;
- resident memory per live episode: each process's RSS over the idle topology (before the first
  episode), divided by the live episodes;
- history events per episode per hour: a sample of episodes' episode, job and session workflows
  (`describe().history_length` before and after each window) and the namespace's one watcher;
- the Hub calls the watcher would make on the hf backend for that many running jobs, from the
  looks it made here (the fake backend's watcher has the hf backend's interval);

then the first bottleneck (a Python process is capped at one core by the GIL; the machine at its
cores) and what 10,000 live episodes would need, scaled from the largest level.

`--temporal-address HOST:PORT`: the processes use that Temporal (plain gRPC, namespace
`default`, with our search attributes: run `posttrain-env temporal setup` first; a namespace no
one else uses, since every level leaves its episodes there) instead of a dev server of the
bench's own, e.g. a cluster on PostgreSQL (docs/deployment.md, "Capacity"). Its CPU and
memory are on its own hosts, not measured here: read them there over the same window (the
printed calls/s gives Temporal's CPU ms per call).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from _diagnose import cpu_now, machine_busy_s, snapshot, worker_latency  # noqa: E402 - bench/ is sys.path[0]
from _topology import Topology  # noqa: E402
from gateway_latency import (  # noqa: E402
    PATHS,
    LagWatch,
    Measured,
    Report,
    Session,
    bench_topology,
    open_sessions,
    p,
    paced,
    serve,
)
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from temporalio.service import RPCError  # noqa: E402

from activities.backends.registry import backend_info  # noqa: E402
from posttrain_common.settings import Settings  # noqa: E402
from posttrain_env.limits import TEMPORAL_PAYLOAD_LIMIT_BYTES  # noqa: E402

HF_WATCH_INTERVAL_S = backend_info("hf").capabilities.watch_interval_s
from workflows.ids import (  # noqa: E402
    episode_workflow_id,
    job_workflow_id,
    session_workflow_id,
    watcher_shard_ids,
    watcher_workflow_id,
)

GROUPS = ("temporal", "workers", "gateway", "bench")
PYTHON_CORE = 0.85  # a Python process this busy is at its one core (the GIL)
TARGET = 10_000


def group_of(label: str) -> str:
    """`worker1/...` -> `workers`; `temporal/...` -> `temporal`."""
    name = label.split("/", 1)[0]
    return "workers" if name.startswith("worker") else name


def by_group(values: dict[str, float]) -> dict[str, float]:
    summed: dict[str, float] = dict.fromkeys(GROUPS, 0.0)
    for label, value in values.items():
        summed[group_of(label)] = summed.get(group_of(label), 0.0) + value
    return summed


def by_process(values: dict[str, float]) -> dict[str, float]:
    summed: dict[str, float] = {}
    for label, value in values.items():
        name = label.split("/", 1)[0]
        summed[name] = summed.get(name, 0.0) + value
    return summed


def rss_now(topology: Topology) -> dict[str, float]:
    """Resident MiB by group (the benchmark's own clients as `bench`)."""
    rss: dict[str, float] = {}
    for proc in topology.procs:
        rss.update(proc.rss_mib())
    status = Path("/proc/self/status").read_text()
    kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    rss["bench"] = kib / 1024
    return by_group(rss)


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


async def lengths(client: Client, ids: list[str]) -> dict[str, tuple[str, int]]:
    """Each workflow's (current run, history length); a workflow not found is left out."""

    async def one(workflow_id: str) -> tuple[str, tuple[str, int] | None]:
        try:
            found = await client.get_workflow_handle(workflow_id).describe()
        except RPCError:
            return workflow_id, None
        return workflow_id, (found.run_id, found.history_length)

    got = await asyncio.gather(*(one(i) for i in ids))
    return {i: v for i, v in got if v is not None}


def grown(before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]) -> int:
    """Events added to the workflows in both, on the same run (a continued-as-new run's
    events before its end are not seen: it is left out)."""
    return sum(
        after[i][1] - before[i][1] for i in before if i in after and after[i][0] == before[i][0]
    )


def sampled_ids(sessions: list[Session]) -> list[str]:
    """The episode, its (first) job and its session workflow of each sampled session."""
    return [
        wid
        for s in sessions
        for wid in (
            episode_workflow_id(s.episode_id),
            job_workflow_id(s.episode_id, 1),
            session_workflow_id(s.session_id),
        )
    ]


@dataclass
class Window:
    wall_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # CPU-s by process label
    sample_events: int = 0  # over the sampled episodes' workflows
    machine_s: float = 0.0  # CPU-s the whole machine was busy (other work included)


@dataclass
class Level:
    name: str
    live: int
    measured: Measured
    refused: Counter[str]
    calling: Window
    quiet: Window
    rss_mib: dict[str, float]  # by group, over the idle topology
    sampled: int
    watcher_events: int
    watcher_looks: int
    largest_look_bytes: float  # the largest answer of a watcher shard's look
    idle_cores: dict[str, float]  # by group, of the topology before any episode
    wft_wait_ms: tuple[float | None, float | None]  # workflow task schedule-to-start p50, p99

    def per_ep_min(self, window: Window) -> dict[str, float]:
        """CPU-seconds per episode per minute, over the idle topology's."""
        cpu = by_group(window.cpu)
        return {
            g: (cpu[g] / window.wall_s - self.idle_cores.get(g, 0.0)) * 60 / self.live
            for g in GROUPS
        }

    def cores(self, window: Window) -> dict[str, float]:
        return {n: s / window.wall_s for n, s in by_process(window.cpu).items()}

    def events_per_ep_h(self, window: Window) -> float:
        return window.sample_events / max(1, self.sampled) / window.wall_s * 3600

    def ms_per_call(self) -> dict[str, float]:
        """CPU milliseconds per achieved call while calling, over the idle topology's (the
        episodes' standing cost included: next to the calls' it is small)."""
        cpu, rate = by_group(self.calling.cpu), self.measured.rate()
        return {
            g: (cpu[g] / self.calling.wall_s - self.idle_cores.get(g, 0.0)) / rate * 1000
            for g in GROUPS
        }

    @property
    def saturated(self) -> bool:
        return self.measured.rate() < 0.9 * (self.measured.offered_per_s or 0)

    @property
    def watcher_wall_s(self) -> float:
        return self.calling.wall_s + self.quiet.wall_s

    @property
    def looks_per_s(self) -> float:
        return self.watcher_looks / self.watcher_wall_s


async def watcher_window(
    client: Client, shard_ids: list[str], since: float, until: float
) -> tuple[int, float]:
    """The watcher shards' looks (observe activities scheduled) in [since, until] (unix time)
    and the largest answer of a look in bytes (a look answers only the jobs that changed)."""
    looks, largest = 0, 0.0
    for workflow_id in shard_ids:
        try:
            history = await client.get_workflow_handle(workflow_id).fetch_history()
        except RPCError:
            continue  # no job hashed to this shard
        for event in history.events:
            at = event.event_time.ToDatetime().timestamp() if event.HasField("event_time") else 0
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and since <= at:
                looks += at <= until
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                payloads = event.activity_task_completed_event_attributes.result.payloads
                largest = max(largest, sum(len(payload.data) for payload in payloads))
    return looks, largest


async def measure_level(
    topology: Topology,
    client: Client,
    sessions: list[Session],
    live: int,
    args: argparse.Namespace,
    idle_rss: dict[str, float],
    idle_cores: dict[str, float],
    report: Report,
    lag: LagWatch,
    refused: Counter[str],
) -> Level:
    chosen = sessions[:live]
    sample = chosen[: args.sample]
    ids = sampled_ids(sample)
    stem = watcher_workflow_id(client.namespace, Settings().task_queue)
    shards = watcher_shard_ids(stem, Settings().watch_shards)
    watcher_then = await lengths(client, shards)
    before, events0 = snapshot(topology), await lengths(client, ids)
    machine0 = machine_busy_s()
    got = Measured()
    lag.lags = []
    await paced(chosen, args.interval, args.duration, got)
    cpu1, machine1, events1 = cpu_now(topology), machine_busy_s(), await lengths(client, ids)
    calling = Window(
        got.wall_s, delta(cpu1, before.cpu), grown(events0, events1), machine1 - machine0
    )
    wait = worker_latency(topology, before, "temporal_workflow_task_schedule_to_start_latency")
    report.level(f"live{len(chosen)}", got, before, lag.lags)
    quiet_from = time.time()
    cpu2, machine2 = cpu_now(topology), machine_busy_s()
    await asyncio.sleep(args.quiet)
    cpu3, events2 = cpu_now(topology), await lengths(client, ids)
    quiet = Window(
        time.time() - quiet_from,
        delta(cpu3, cpu2),
        grown(events1, events2),
        machine_busy_s() - machine2,
    )
    looks, largest = await watcher_window(client, shards, got.started, time.time())
    return Level(
        name=f"live{len(chosen)}",
        live=len(chosen),
        measured=got,
        refused=refused,
        calling=calling,
        quiet=quiet,
        rss_mib=delta(rss_now(topology), idle_rss),
        sampled=len(sample),
        watcher_events=grown(watcher_then, await lengths(client, shards)),
        watcher_looks=looks,
        largest_look_bytes=largest,
        idle_cores=idle_cores,
        wft_wait_ms=(
            None if wait[0] is None else wait[0] * 1000,
            None if wait[1] is None else wait[1] * 1000,
        ),
    )


def print_tables(levels: list[Level], args: argparse.Namespace) -> None:
    print("\n== calls: offered vs achieved, latency (ms) and ratio to the bare update")
    print(
        f"{'level':>9} {'offered/s':>9} {'achieved/s':>10} {'errors':>6} {'refused':>7} "
        + " ".join(f"{f'{path} p50':>8} {f'{path} p99':>8}" for path in PATHS)
        + f" {'ws x50':>6} {'ws x99':>6} {'mcp x50':>7} {'mcp x99':>7}"
    )
    for level in levels:
        got = level.measured
        cells = []
        for path in PATHS:
            values = got.latencies[path] or [math.nan]
            cells.append(f"{statistics.median(values):8.1f} {p(values, 0.99):8.1f}")
        bare = got.latencies["bare"] or [math.nan]
        ratios = []
        for path in ("ws", "mcp"):
            values = got.latencies[path] or [math.nan]
            ratios += [
                statistics.median(values) / statistics.median(bare),
                p(values, 0.99) / p(bare, 0.99),
            ]
        errors = sum(sum(c.values()) for c in got.errors.values())
        print(
            f"{level.name:>9} {got.offered_per_s or 0:9.1f} {got.rate():10.1f} {errors:6d} "
            f"{sum(level.refused.values()):7d} "
            + " ".join(cells)
            + f" {ratios[0]:5.2f}x {ratios[1]:5.2f}x {ratios[2]:6.2f}x {ratios[3]:6.2f}x"
        )
    print(
        f"\n== CPU-seconds per episode per minute over the idle topology's (calling every "
        f"{args.interval:g} s | quiet) and resident KiB per live episode over the idle topology"
    )
    print(
        f"{'level':>9} "
        + " ".join(f"{g[:8]:>8}" for g in GROUPS)
        + " | "
        + " ".join(f"{g[:8]:>8}" for g in GROUPS)
        + " | "
        + " ".join(f"{g[:8] + ' KiB':>12}" for g in GROUPS)
    )
    for level in levels:
        calling, quiet = level.per_ep_min(level.calling), level.per_ep_min(level.quiet)
        print(
            f"{level.name:>9} "
            + " ".join(f"{calling[g]:8.4f}" for g in GROUPS)
            + " | "
            + " ".join(f"{quiet[g]:8.4f}" for g in GROUPS)
            + " | "
            + " ".join(f"{level.rss_mib[g] * 1024 / level.live:12.0f}" for g in GROUPS)
        )
    print(
        "\n== history events per episode per hour (episode + job + session workflows of "
        f"{args.sample} sampled episodes; the watcher shards shared) and Hub calls"
    )
    print(
        f"{'level':>9} {'calling':>8} {'quiet':>8} {'watcher/ep':>10} {'looks/min':>9} "
        f"{'hub calls/s':>11} {'look KiB max':>13}"
    )
    for level in levels:
        watcher = level.watcher_events / level.watcher_wall_s * 3600 / level.live
        print(
            f"{level.name:>9} {level.events_per_ep_h(level.calling):8.0f} "
            f"{level.events_per_ep_h(level.quiet):8.0f} {watcher:10.1f} "
            f"{level.looks_per_s * 60:9.1f} {level.looks_per_s:11.3f} "
            f"{level.largest_look_bytes / 1024:13.1f}"
        )
    print(
        f"hub calls/s on the hf backend = namespaces x ceil(N / P) / {HF_WATCH_INTERVAL_S:g} s"
        " (one list_jobs per namespace per interval, shared by the shards' aligned looks, of "
        "ceil(N/P) pages of P jobs, the Hub's page size) + one inspect_job per job that ends: "
        "for N running jobs in one namespace, the looks/s above (per page), whatever N"
    )
    for level in levels:
        for path in PATHS:
            for error, count in level.measured.errors[path].most_common(3):
                print(f"{level.name} {path} error {count}x: {error}")
        for error, count in level.refused.most_common(3):
            print(f"{level.name} refused at admission {count}x: {error}")


def bottleneck(levels: list[Level], wanted: list[int]) -> None:
    """Per level, the cores each process used while calling, beside the whole machine's
    (other work on it included), and the first level where something saturated."""
    cores = os.cpu_count() or 1
    found = None
    for level in levels:
        used = level.cores(level.calling)
        busiest = max((n for n in used if n != "bench"), key=lambda n: used[n])
        ours = sum(used.values())
        machine = level.calling.machine_s / level.calling.wall_s
        short = level.saturated
        python = [n for n in used if n not in ("temporal", "bench") and used[n] >= PYTHON_CORE]
        wait50, wait99 = level.wft_wait_ms
        waiting = wait50 is not None and wait50 > 100
        shares = ", ".join(f"{n} {c:.2f}" for n, c in sorted(used.items(), key=lambda x: -x[1]))
        print(
            f"{level.name}: cores {shares}; {ours:.2f} ours, machine {machine:.2f} of {cores} "
            f"({max(0.0, machine - ours):.2f} other work); workflow task schedule-to-start "
            f"p50 <= {wait50 or 0:.0f} ms, p99 <= {wait99 or 0:.0f} ms; CPU ms per call: "
            + ", ".join(f"{g} {ms:.1f}" for g, ms in level.ms_per_call().items())
        )
        # Saturated: the calls fell behind, or workflow tasks queued, or a Python process or
        # our processes together used up the cores; a machine busy with other work is the
        # context, not by itself a bottleneck of ours.
        if found is None and (python or ours >= 0.9 * cores or short or waiting):
            why = []
            if python:
                why.append(f"{', '.join(python)} at its one core")
            if machine >= 0.9 * cores:
                why.append(
                    f"the machine at {machine:.2f} of {cores} cores ({ours:.2f} of them ours)"
                )
            if waiting:
                why.append(f"workflow tasks waited p50 {wait50:.0f} ms from scheduled to started")
            if short:
                why.append(
                    f"{level.measured.rate():.0f} calls/s of {level.measured.offered_per_s:.0f} "
                    "offered"
                )
            found = f"{level.name}: {'; '.join(why)} (busiest server process: {busiest})"
    print(f"first bottleneck: {found or f'none up to {levels[-1].name}' if levels else 'none'}")
    if len(levels) < len(wanted) or (levels and levels[-1].live < wanted[-1]):
        print(f"not reached: asked for {wanted}, measured {[level.live for level in levels]}")


def extrapolate(levels: list[Level], interval_s: float, external: str | None = None) -> None:
    """10,000 episodes: the idle topology, plus the calls' CPU (per call, from the largest
    level that kept up with its offered calls) at 10,000 / interval calls/s, plus each
    episode's standing CPU while quiet and its memory (from the largest level)."""
    if not levels:
        return
    top = levels[-1]
    kept_up = [level for level in levels if not level.saturated]
    calls_from = kept_up[-1] if kept_up else top
    per_call, quiet = calls_from.ms_per_call(), top.per_ep_min(top.quiet)
    rate = TARGET / interval_s
    print(
        f"\n== {TARGET:,} live episodes calling every {interval_s:g} s ({rate:.0f} calls/s): "
        f"CPU per call from {calls_from.name}"
        + ("" if kept_up else " (it did not keep up: a floor)")
        + f", standing CPU and memory per episode from {top.name}"
    )
    measured = GROUPS[:3] if external is None else GROUPS[1:3]
    if external is not None:
        print(f"temporal: at {external}, not measured here (see its own hosts)")
    for group in measured:
        base = top.idle_cores.get(group, 0.0)
        standing = max(0.0, quiet[group]) * TARGET / 60
        busy = base + standing + per_call[group] / 1000 * rate
        print(
            f"{group}: {busy:.1f} cores calling ({standing:.1f} of them standing), "
            f"{base + standing:.1f} quiet; "
            f"+{top.rss_mib[group] / top.live * TARGET / 1024:.1f} GiB resident"
        )
    limit = TEMPORAL_PAYLOAD_LIMIT_BYTES / 2**20
    print(
        f"the largest answer of a watcher shard's look: {top.largest_look_bytes / 1024:.1f} KiB "
        f"(only the jobs that changed; Temporal's payload limit: {limit:.0f} MiB)"
    )


async def scale(topology: Topology, args: argparse.Namespace) -> None:
    client = await Client.connect(topology.temporal_address, data_converter=pydantic_data_converter)
    await asyncio.sleep(args.settle)  # past the processes' start-up work
    idle_rss = rss_now(topology)
    cpu0, idle_from = cpu_now(topology), time.time()
    await asyncio.sleep(max(2.0, args.quiet))
    cpu1 = cpu_now(topology)
    idle_cores = {g: s / (time.time() - idle_from) for g, s in by_group(delta(cpu1, cpu0)).items()}
    print(
        "idle topology: rss (MiB) "
        + ", ".join(f"{g} {v:.0f}" for g, v in idle_rss.items())
        + "; cores "
        + ", ".join(f"{g} {v:.3f}" for g, v in idle_cores.items())
    )
    most = max(args.live)
    limits = httpx.Limits(max_connections=most + 10, max_keepalive_connections=most + 10)
    lag = LagWatch()
    lag.start()
    report = Report(topology)
    levels: list[Level] = []
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        sessions: list[Session] = []
        report.header()
        for live in args.live:
            refused: Counter[str] = Counter()
            took = await open_sessions(
                sessions,
                live,
                args.open_at_once,
                lambda: Session(topology.base_url, http, client),
                refused=refused,
                deadline=time.monotonic() + args.admit_timeout,
            )
            print(f"{'':>9} opened {len(sessions)} live episodes in {took:.0f} s")
            if not sessions:
                break
            levels.append(
                await measure_level(
                    topology,
                    client,
                    sessions,
                    live,
                    args,
                    idle_rss,
                    idle_cores,
                    report,
                    lag,
                    refused,
                )
            )
            if len(sessions) < live:
                print(f"{'':>9} admitted {len(sessions)} of {live}: stopping here")
                break
        await asyncio.gather(*(s.close() for s in sessions))
    lag.stop()
    print_tables(levels, args)
    print()
    bottleneck(levels, args.live)
    extrapolate(levels, args.interval, args.temporal_address)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--live", default="100,300,1000", help="live episodes per level")
    parser.add_argument("--workers", type=int, default=2, help="posttrain-env worker processes")
    parser.add_argument("--interval", type=float, default=5.0, help="s between a live call")
    parser.add_argument("--duration", type=float, default=60.0, help="s of calls per level")
    parser.add_argument("--quiet", type=float, default=20.0, help="s without calls per level")
    parser.add_argument(
        "--settle", type=float, default=10.0, help="s after start-up before the idle figures"
    )
    parser.add_argument("--sample", type=int, default=10, help="episodes whose history is read")
    parser.add_argument("--open-at-once", type=int, default=10, help="sessions opened at once")
    parser.add_argument(
        "--admit-timeout", type=float, default=600.0, help="s to open a level's new episodes"
    )
    parser.add_argument("--keep", action="store_true", help="keep the state dir (logs, probes)")
    parser.add_argument(
        "--temporal-address",
        help="a Temporal of your own (host:port, plain, namespace default, set up) instead of a "
        "dev server: its CPU and memory are not measured here",
    )
    args = parser.parse_args()
    args.live = sorted(int(x) for x in args.live.split(",") if x)
    state = Path(tempfile.mkdtemp(prefix="scale-"))
    topology = bench_topology(state, "split", args.workers, {})
    topology.external_temporal = args.temporal_address
    where = args.temporal_address or "a dev server of its own (SQLite)"
    print(
        f"temporal: {where}; shape: split, {args.workers} workers; {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}; calls every {args.interval:g} s (jittered) "
        f"for {args.duration:g} s, then {args.quiet:g} s quiet, per level"
    )
    serve(topology, state, lambda: scale(topology, args), keep=args.keep)


if __name__ == "__main__":
    main()
