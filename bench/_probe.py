"""Run a `posttrain-env` command with measuring instruments, for the benchmarks only.

    python bench/_probe.py server --port 8000        # any `posttrain-env` arguments

What it adds to the process (nothing here is part of the product):

- an event-loop lag monitor: a task that sleeps 10 ms and records by how much it overslept,
  i.e. how long the loop was kept from running ready callbacks (a loop shared with a busy
  worker, a slow callback, the GIL held by another thread);
- in a gateway, the duration of every Temporal update it makes for a tool call (wrapping
  `mcp_gateway.sessions.call_tool`), so a benchmark can split a call's time into "Temporal
  answered the gateway" and "the gateway answered the client";
- what the loop's thread was running whenever the loop stalled over 150 ms, and every garbage
  collection over 5 ms;
- Temporal's SDK metrics on a Prometheus endpoint (`BENCH_METRICS_PORT`), e.g. the worker's
  workflow task schedule-to-start and execution latencies and its sticky cache hits.

Samples go to `BENCH_PROBE_OUT` as JSON lines `{"t": unix time, "kind": ..., "ms": ...}`
(lag samples only above 20 ms, every update), flushed every half second.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAG_TICK_S = 0.01
LAG_KEEP_MS = 20.0
STALL_S = 0.15
STACK_DEPTH = 80
# Finer buckets than the SDK's defaults where the benchmarks read a p99 from them.
BUCKETS_S = [
    0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
]  # fmt: skip
FINE_HISTOGRAMS = (
    "workflow_task_schedule_to_start_latency",
    "workflow_task_execution_latency",
    "workflow_task_replay_latency",
    "workflow_endtoend_latency",
    "activity_schedule_to_start_latency",
    "activity_execution_latency",
    "request_latency",
    "long_request_latency",
)


class Samples:
    """Append-only samples, written out by a thread so the loop being measured never waits on
    the disk."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._pending: list[str] = []
        self._lock = threading.Lock()
        if path:
            threading.Thread(target=self._flush_forever, daemon=True).start()

    def add(self, kind: str, ms: float, detail: str | None = None) -> None:
        if self._path:
            sample: dict[str, Any] = {"t": time.time(), "kind": kind, "ms": round(ms, 3)}
            if detail is not None:
                sample["detail"] = detail
            line = json.dumps(sample)
            with self._lock:
                self._pending.append(line)

    def _flush_forever(self) -> None:
        assert self._path is not None
        while True:
            time.sleep(0.5)
            with self._lock:
                lines, self._pending = self._pending, []
            if lines:
                with open(self._path, "a") as out:
                    out.write("\n".join(lines) + "\n")


SAMPLES = Samples(os.environ.get("BENCH_PROBE_OUT"))


class StallCatcher:
    """A thread that, when the loop has not ticked for STALL_S, records what the loop's thread
    is running (its innermost frames): the code that kept the loop from serving requests."""

    def __init__(self, loop_thread: int) -> None:
        self.beat = time.monotonic()
        self._loop_thread = loop_thread
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        reported = 0.0
        while True:
            time.sleep(0.02)
            beat = self.beat
            if time.monotonic() - beat > STALL_S and beat != reported:
                reported = beat
                frame = sys._current_frames().get(self._loop_thread)
                SAMPLES.add("stall_stack", 0.0, detail=_where(frame))


def _where(frame: Any) -> str:
    found = []
    while frame is not None and len(found) < STACK_DEPTH:
        code = frame.f_code
        found.append(f"{Path(code.co_filename).name}:{frame.f_lineno}:{code.co_name}")
        frame = frame.f_back
    return " < ".join(found)


def time_gc() -> None:
    """Every garbage collection that takes over 5 ms, by generation."""
    import gc

    started: dict[str, float] = {}

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            ms = (time.perf_counter() - started.pop("t")) * 1000
            if ms > 5:
                SAMPLES.add(f"gc{info['generation']}", ms)

    gc.callbacks.append(callback)


async def watch_loop_lag() -> None:
    loop = asyncio.get_running_loop()
    catcher = StallCatcher(threading.get_ident())
    while True:
        started = loop.time()
        catcher.beat = time.monotonic()
        await asyncio.sleep(LAG_TICK_S)
        lag_ms = (loop.time() - started - LAG_TICK_S) * 1000
        if lag_ms > LAG_KEEP_MS:
            SAMPLES.add("loop_lag", lag_ms)


def instrument_runtime() -> None:
    """The project's one runtime per process, with Prometheus metrics beside its log forwarding."""
    port = os.environ.get("BENCH_METRICS_PORT")
    if not port:
        return
    import logging

    from temporalio.runtime import (
        LogForwardingConfig,
        LoggingConfig,
        PrometheusConfig,
        Runtime,
        TelemetryConfig,
        TelemetryFilter,
    )

    from posttrain_server.temporal import client as temporal_client

    runtime = Runtime(
        telemetry=TelemetryConfig(
            logging=LoggingConfig(
                filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                forwarding=LogForwardingConfig(
                    logger=logging.getLogger(temporal_client.CORE_LOGGER),
                    append_target_to_name=False,
                ),
            ),
            metrics=PrometheusConfig(
                bind_address=f"127.0.0.1:{port}",
                durations_as_seconds=True,
                histogram_bucket_overrides={name: BUCKETS_S for name in FINE_HISTOGRAMS},
            ),
        )
    )
    temporal_client.core_runtime = lambda: runtime  # type: ignore[assignment]


def instrument_gateway_calls() -> None:
    from mcp_gateway import sessions

    original = sessions.call_tool

    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            SAMPLES.add("gateway_update", (time.perf_counter() - started) * 1000)

    sessions.call_tool = timed  # type: ignore[assignment]


def with_lag_watch(entry: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def run(*args: Any, **kwargs: Any) -> Any:
        watcher = asyncio.get_running_loop().create_task(watch_loop_lag())
        try:
            return await entry(*args, **kwargs)
        finally:
            watcher.cancel()

    return run


def main() -> None:
    instrument_runtime()
    time_gc()
    from posttrain_server import cli, server, worker

    server.serve = with_lag_watch(server.serve)  # type: ignore[assignment]
    worker.run_worker = with_lag_watch(worker.run_worker)  # type: ignore[assignment]
    if sys.argv[1:2] == ["server"]:
        instrument_gateway_calls()
    cli.main(sys.argv[1:])


if __name__ == "__main__":
    main()
