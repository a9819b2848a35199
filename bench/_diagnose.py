"""Where a benchmark's time went, from the probes of `_topology.py`'s processes.

`Snapshot` before a measured window, `diagnostics(...)` after it: CPU per process (cores),
event-loop stalls, garbage collections, what a stalled loop was running, the workers' workflow
and activity task latencies, sticky cache misses, failed workflow tasks, and every Temporal
request that failed (the SDK retries some of them silently: a refused update retried with
backoff shows here and nowhere else).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from _topology import (
    Histogram,
    Proc,
    Topology,
    counter_delta,
    failures_delta,
    histogram_delta,
    probe_samples,
    quantile,
    request_failures,
    samples,
    scrape,
)

LATENCIES = (
    ("temporal_workflow_task_schedule_to_start_latency", "wft sched-to-start"),
    ("temporal_workflow_task_execution_latency", "wft execution"),
    ("temporal_activity_schedule_to_start_latency", "act sched-to-start"),
)


@dataclass
class Snapshot:
    at: float
    metrics: dict[str, Histogram]
    failures: dict[str, dict[str, float]]
    cpu: dict[str, float]


def snapshot(topology: Topology) -> Snapshot:
    probed = [p for p in topology.procs if p.metrics_port]
    return Snapshot(
        at=time.time(),
        metrics={p.name: scrape(p) for p in probed},
        failures={p.name: request_failures(p) for p in probed},
        cpu=cpu_now(topology),
    )


def cpu_now(topology: Topology) -> dict[str, float]:
    """CPU seconds so far of this benchmark process and of every server process."""
    cpu = {"bench": sum(os.times()[:2])}
    for proc in topology.procs:
        cpu.update(proc.cpu_s())
    return cpu


def workers(topology: Topology) -> list[Proc]:
    """The processes that run workflows (the all-in-one server's gateway runs its worker)."""
    return [p for p in topology.procs if p.name.startswith("worker")] or [topology.gateway]


def worker_latency(
    topology: Topology, before: Snapshot, name: str
) -> tuple[float | None, float | None]:
    """p50 and p99 (s, bucket upper bounds) of a latency histogram of the workers since
    `before`, all workers merged (None without samples)."""
    merged: dict[float, float] = {}
    for proc in workers(topology):
        delta = histogram_delta(before.metrics.get(proc.name, {}), scrape(proc), name)
        for bound, count in delta.items():
            merged[bound] = merged.get(bound, 0.0) + count
    return quantile(merged, 0.5), quantile(merged, 0.99)


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every core; /proc/stat, idle and iowait
    left out): beside `cpu_now`, what other work on a shared machine took."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def diagnostics(topology: Topology, before: Snapshot, *, stacks: bool = False) -> list[str]:
    until = time.time()
    wall = until - before.at
    now = cpu_now(topology)
    used = sorted(
        ((n, (s - before.cpu.get(n, 0.0)) / wall) for n, s in now.items()), key=lambda x: -x[1]
    )
    lines = ["cpu (cores): " + ", ".join(f"{n} {share:.2f}" for n, share in used if share > 0.01)]
    rss: dict[str, float] = {}
    for proc in topology.procs:
        rss.update(proc.rss_mib())
    lines.append("rss (MiB): " + ", ".join(f"{n} {mib:.0f}" for n, mib in sorted(rss.items())))
    for proc in topology.procs:
        if proc.probe_out is None:
            continue
        lags = samples(proc, "loop_lag", before.at, until)
        long = sum(x > 100 for x in lags)
        lines.append(
            f"{proc.name} loop: {sum(lags) / 1000:.1f} s stalled of {wall:.0f} s, "
            f"{len(lags)} stalls >20 ms, {long} >100 ms, longest {max(lags, default=0):.0f} ms"
        )
        collections = {g: samples(proc, f"gc{g}", before.at, until) for g in (0, 1, 2)}
        if any(collections.values()):
            lines.append(
                f"{proc.name} gc >5 ms: "
                + ", ".join(
                    f"gen{g} {len(v)}x max {max(v):.0f} ms" for g, v in collections.items() if v
                )
            )
        if stacks:
            found = Counter(
                s["detail"] for s in probe_samples(proc, "stall_stack", before.at, until)
            )
            for stack, count in found.most_common(5):
                lines.append(f"{proc.name} stalled {count}x in: {stack}")
    for name, label in LATENCIES:
        q50, q99 = worker_latency(topology, before, name)
        if q50 is not None and q99 is not None:
            lines.append(f"{label}: p50 <= {q50 * 1000:.0f} ms, p99 <= {q99 * 1000:.0f} ms")
    misses = failed = 0.0
    for proc in workers(topology):
        after, then = scrape(proc), before.metrics.get(proc.name, {})
        misses += counter_delta(then, after, "temporal_sticky_cache_miss")
        failed += counter_delta(then, after, "temporal_workflow_task_execution_failed")
    cached = sum(
        scrape(p).get("temporal_sticky_cache_size", {}).get(0.0, 0.0) for p in workers(topology)
    )
    lines.append(
        f"sticky cache misses {misses:.0f}, cached workflows {cached:.0f}, "
        f"failed workflow tasks {failed:.0f}"
    )
    for proc in topology.procs:
        if proc.metrics_port:
            refused = failures_delta(before.failures.get(proc.name, {}), request_failures(proc))
            if refused:
                lines.append(f"{proc.name} failed Temporal requests: {refused}")
    lines.append(f"load average {os.getloadavg()[0]:.1f}")
    return lines
