"""Latency of `jobs_status` through the gateway, beside the bare Temporal update, p50 and p99.

    uv run python bench/gateway_latency.py [--shape allinone|split] [--workers 2]
        [--levels 1,50] [--calls 600] [--live 100,300,1000] [--interval 5] [--duration 60]
        [--cold] [--order interleaved|sequential] [--stacks] [--metrics on|off]

The server runs in its own processes, in one of the production shapes (`bench/_topology.py`):
`allinone` is `posttrain-env server` (gateway, in-process worker, embedded file-backed Temporal);
`split` is a Temporal dev server, `server --no-worker` and `--workers` `posttrain-env worker`
processes. The fake jobs backend; every episode holds one running job. Every session is reset
(and its job submitted) before any timing starts.

Three paths, interleaved: every caller sends its calls in a shuffled rotation of

- `ws`: OpenEnv `step` frames over the session's `/ws` (what `PostTrainEnv.step` does);
- `mcp`: JSON-RPC `tools/call` over `POST /mcp` (what `call_tool` does);
- `bare`: the `EpisodeWorkflow.call_tool` update the gateway makes, sent straight to Temporal
  from this process: the floor any gateway pays.

so the three see the same load at the same moments and their ratios mean something on a
machine shared with other work. Two kinds of level:

- `--levels`: that many sessions, each with one call in flight at all times (closed loop);
- `--live`: that many live episodes, each making one call every `--interval` s (jittered) for
  `--duration` s: the load of many agents thinking between calls. The offered and achieved call
  rates are printed; where achieved falls short, the machine saturated.

A call answered with an error (or a dropped socket) is counted in `errors`, not timed: a
client without retries would have seen it. `--cold` (split): each session's first call through
a restarted gateway, whose session -> episode cache is empty. `--order sequential`: every
session's bare calls, then ws, then mcp, as this benchmark measured before issue 18.

Beside each level, where the time went (`bench/_diagnose.py`): each process's CPU and memory,
its event-loop stalls and garbage collections (`--stacks`: what a stalled loop was running),
the gateway's own Temporal update time (`gw-upd`), the workers' workflow task latencies, sticky
cache misses and failed Temporal requests.

Targets (issues 4, 18): ws and mcp at most 1.3x the bare update at p50 and 1.5x at p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from _diagnose import Snapshot, diagnostics, snapshot  # noqa: E402 - bench/ is sys.path[0]
from _topology import Topology, samples  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from tool_latency import TASK, TASK_ID  # noqa: E402
from websockets.asyncio.client import ClientConnection, connect  # noqa: E402

from activities.backends.fake.backend import FakeJobScript, FakeScenario  # noqa: E402
from mcp_gateway.episode_calls import update_id  # noqa: E402
from posttrain_common.contracts.episode_calls import ToolCall  # noqa: E402
from workflows.episode.workflow import EpisodeWorkflow  # noqa: E402
from workflows.ids import episode_workflow_id  # noqa: E402

PATHS = ("bare", "ws", "mcp")
WARMUP_ROUNDS = 3
SUBMIT = {"script": "RUN_LONG = 1\n", "flavor": "cpu-basic", "timeout_minutes": 60}
P50_TARGET, P99_TARGET = 1.3, 1.5


class CallRefused(RuntimeError):
    """The gateway answered a call with an error."""


class Session:
    def __init__(self, base_url: str, http: httpx.AsyncClient, temporal: Client) -> None:
        self.base_url = base_url
        self.ws_base = base_url.replace("http://", "ws://")
        self.http = http
        self.temporal = temporal
        self.session_id = ""
        self.episode_id = ""
        self.ws: ClientConnection | None = None

    async def open(self) -> None:
        created = await self.http.post(f"{self.base_url}/mcp", json=_rpc("openenv/session/create"))
        self.session_id = created.json()["result"]["session_id"]
        self.ws = await connect(
            f"{self.ws_base}/ws?session_id={self.session_id}", max_size=None, ping_interval=None
        )
        reset = await self._frame({"type": "reset", "data": {"task_id": TASK_ID}})
        self.episode_id = reset["data"]["metadata"]["episode_id"]
        submitted = await self._frame(_step("jobs_submit", SUBMIT))
        assert "job_id" in submitted["data"]["observation"]["result"]["data"], submitted

    async def _frame(self, message: dict) -> dict:
        assert self.ws is not None
        await self.ws.send(json.dumps(message))
        reply = json.loads(await self.ws.recv())
        if reply["type"] == "error":
            raise CallRefused(str(reply["data"]))
        return reply

    async def call(self, path: str) -> None:
        if path == "ws":
            reply = await self._frame(_step("jobs_status", {}))
            assert "jobs" in reply["data"]["observation"]["result"]["data"], reply
        elif path == "mcp":
            params = {"name": "jobs_status", "arguments": {}, "session_id": self.session_id}
            response = await self.http.post(f"{self.base_url}/mcp", json=_rpc("tools/call", params))
            body = response.json()
            if "result" not in body:
                raise CallRefused(str(body.get("error") or body))
            assert "jobs" in body["result"]["data"], response.text
        else:
            handle = self.temporal.get_workflow_handle_for(
                EpisodeWorkflow.run, episode_workflow_id(self.episode_id)
            )
            request = ToolCall(request_id=uuid.uuid4().hex, tool="jobs_status")
            await handle.execute_update(
                EpisodeWorkflow.call_tool,
                request,
                id=update_id(self.episode_id, request.request_id),
            )

    async def reconnect(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        self.ws = await connect(
            f"{self.ws_base}/ws?session_id={self.session_id}", max_size=None, ping_interval=None
        )

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


def _rpc(method: str, params: dict | None = None) -> dict:
    return {"jsonrpc": "2.0", "method": method, "params": params or {}, "id": 1}


def _step(tool: str, arguments: dict) -> dict:
    return {
        "type": "step",
        "data": {"type": "call_tool", "tool_name": tool, "arguments": arguments},
    }


@dataclass
class Measured:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PATHS})
    errors: dict[str, Counter[str]] = field(default_factory=lambda: {p: Counter() for p in PATHS})
    started: float = 0.0  # unix time
    ended: float = 0.0
    offered_per_s: float | None = None

    @property
    def wall_s(self) -> float:
        return self.ended - self.started

    def rate(self) -> float:
        return sum(len(v) for v in self.latencies.values()) / self.wall_s


async def timed(session: Session, path: str, into: Measured) -> None:
    """One call; its latency, or (a refusal, an error reply, a dropped socket) its error."""
    started = time.perf_counter()
    try:
        await session.call(path)
    except Exception as exc:  # what a client without retries would have seen
        into.errors[path][f"{type(exc).__name__}: {str(exc)[:160]}"] += 1
        if path == "ws":
            await session.reconnect()
        return
    into.latencies[path].append((time.perf_counter() - started) * 1000)


async def closed_loop(
    sessions: list[Session], calls: int, into: Measured, *, sequential: bool = False
) -> None:
    """`calls` calls per path, spread over the sessions, each with one call in flight:
    interleaved (each session rotates through the paths in a shuffled order), or `sequential`
    (every session's bare calls, then ws, then mcp: how this benchmark measured before issue
    18, which lets a passing disturbance land on one path only)."""
    rounds = max(1, calls // len(sessions))

    async def run(session: Session, paths: tuple[str, ...]) -> None:
        for _ in range(rounds):
            for path in random.sample(paths, len(paths)):
                await timed(session, path, into)

    into.started = time.time()
    for paths in [(p,) for p in PATHS] if sequential else [PATHS]:
        await asyncio.gather(*(run(s, paths) for s in sessions))
    into.ended = time.time()


async def paced(
    sessions: list[Session], interval_s: float, duration_s: float, into: Measured
) -> None:
    """Each session calls every `interval_s` (jittered) for `duration_s`, rotating the paths."""
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + duration_s
    into.offered_per_s = len(sessions) / interval_s

    async def run(session: Session) -> None:
        order = random.sample(PATHS, len(PATHS))
        await asyncio.sleep(random.uniform(0, interval_s))
        turn = 0
        while loop.time() < stop_at:
            started = loop.time()
            await timed(session, order[turn % len(order)], into)
            turn += 1
            pause = interval_s * random.uniform(0.8, 1.2) - (loop.time() - started)
            # Not past the end: a last pause would stretch the window the rate is taken over.
            await asyncio.sleep(max(0.0, min(pause, stop_at - loop.time())))

    into.started = time.time()
    await asyncio.gather(*(run(s) for s in sessions))
    into.ended = time.time()


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


async def cold_calls(topology: Topology, sessions: list[Session], report: Report) -> None:
    """Each session's first call through a restarted gateway (its session -> episode cache is
    empty, so the call first asks the session's workflow), beside a bare update each."""
    topology.restart_gateway()
    await asyncio.gather(*(s.reconnect() for s in sessions))
    before, got = snapshot(topology), Measured()
    got.started = time.time()

    async def first_calls(session: Session) -> None:
        for path in random.sample(("bare", "ws"), 2):
            await timed(session, path, got)

    await asyncio.gather(*(first_calls(s) for s in sessions))
    got.ended = time.time()
    report.level(f"cold{len(sessions)}", got, before, [])


class LagWatch:
    """This process's own loop lag: a saturated benchmark client would inflate every path."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(0.01)
            self.lags.append((loop.time() - started - 0.01) * 1000)


@dataclass
class Report:
    topology: Topology
    stacks: bool = False

    def header(self) -> None:
        print(
            f"{'level':>9} {'path':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'n':>5} "
            f"{'errors':>6} {'p50 x':>6} {'p99 x':>6}"
        )

    def level(self, name: str, got: Measured, before: Snapshot, lag: list[float]) -> None:
        bare = got.latencies["bare"] or [float("nan")]  # every bare call failed: no ratio
        bare50, bare99 = statistics.median(bare), p(bare, 0.99)
        for path in (path for path in PATHS if got.latencies[path]):
            values = got.latencies[path]
            p50, p99 = statistics.median(values), p(values, 0.99)
            errors = sum(got.errors[path].values())
            print(
                f"{name:>9} {path:>5} {p50:8.1f} {p99:8.1f} {max(values):8.1f} {len(values):5d} "
                f"{errors:6d} {p50 / bare50:5.2f}x {p99 / bare99:5.2f}x"
            )
        for path in PATHS:
            for error, count in got.errors[path].most_common(3):
                print(f"{'':>9} {path} error {count}x: {error}")
        rate = f"{got.rate():.0f} calls/s"
        if got.offered_per_s is not None:
            rate += f" (offered {got.offered_per_s:.0f})"
        lines = [rate]
        if lag:
            lines.append(f"bench loop lag: p99 {p(lag, 0.99):.0f} ms, max {max(lag):.0f} ms")
        gw = samples(self.topology.gateway, "gateway_update", got.started, got.ended)
        if gw:
            lines.append(
                f"gw-upd (the gateway's own Temporal update): p50 {statistics.median(gw):.1f} ms, "
                f"p99 {p(gw, 0.99):.1f} ms"
            )
        lines += diagnostics(self.topology, before, stacks=self.stacks)
        for line in lines:
            print(f"{'':>9} {line}")


async def open_sessions(
    sessions: list[Session],
    count: int,
    at_once: int,
    factory: Callable[[], Session],
    *,
    refused: Counter[str] | None = None,
    deadline: float | None = None,
) -> float:
    """Grow `sessions` to `count` (reset and a running job each); seconds it took. With
    `refused`, a session that fails to open is counted there (by error) instead of raising,
    and growing stops at a batch of which none opened; with `deadline` (`time.monotonic()`),
    it stops then."""
    started = time.perf_counter()
    while len(sessions) < count and (deadline is None or time.monotonic() < deadline):
        batch = [factory() for _ in range(min(at_once, count - len(sessions)))]
        if refused is None:
            await asyncio.gather(*(s.open() for s in batch))
            sessions.extend(batch)
            continue
        opened = await asyncio.gather(*(s.open() for s in batch), return_exceptions=True)
        for session, outcome in zip(batch, opened, strict=True):
            if isinstance(outcome, BaseException):
                refused[f"{type(outcome).__name__}: {str(outcome)[:160]}"] += 1
            else:
                sessions.append(session)
        if all(isinstance(outcome, BaseException) for outcome in opened):
            break
    return time.perf_counter() - started


async def bench(topology: Topology, args: argparse.Namespace) -> None:
    temporal = await Client.connect(
        topology.temporal_address, data_converter=pydantic_data_converter
    )
    most = max([*args.levels, *args.live, 1])
    limits = httpx.Limits(max_connections=most + 10, max_keepalive_connections=most + 10)
    lag = LagWatch()
    lag.start()
    report = Report(topology, stacks=args.stacks)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        sessions: list[Session] = []

        def factory() -> Session:
            return Session(topology.base_url, http, temporal)

        report.header()
        for level in args.levels:
            took = await open_sessions(sessions, level, args.open_at_once, factory)
            if took > 1:
                print(f"{'':>9} opened {len(sessions)} sessions in {took:.0f} s")
            chosen = sessions[:level]
            await closed_loop(chosen, WARMUP_ROUNDS * level, Measured())
            before, got = snapshot(topology), Measured()
            lag.lags = []
            await closed_loop(chosen, args.calls, got, sequential=args.order == "sequential")
            report.level(str(level), got, before, lag.lags)
        if args.cold and topology.shape == "split" and args.levels:
            await cold_calls(topology, sessions[: max(args.levels)], report)
        for live in args.live:
            took = await open_sessions(sessions, live, args.open_at_once, factory)
            print(f"{'':>9} opened {len(sessions)} live episodes in {took:.0f} s")
            chosen = sessions[:live]
            before, got = snapshot(topology), Measured()
            lag.lags = []
            await paced(chosen, args.interval, args.duration, got)
            report.level(f"live{live}", got, before, lag.lags)
        await asyncio.gather(*(s.close() for s in sessions))
    lag.stop()
    print(f"target: ws and mcp at most {P50_TARGET:.2f}x bare at p50, {P99_TARGET:.2f}x at p99")


def settings_env(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    if args.metrics is not None:
        env["POSTTRAIN_METRICS"] = args.metrics
    if args.watch_interval:
        env["POSTTRAIN_WATCH_INTERVAL_S"] = str(args.watch_interval)
    if args.continue_as_new_events:
        env["POSTTRAIN_CONTINUE_AS_NEW_EVENTS"] = str(args.continue_as_new_events)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shape", choices=("allinone", "split"), default="allinone")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (split)")
    parser.add_argument("--calls", type=int, default=600, help="calls per path per level")
    parser.add_argument("--levels", default="1,50", help="closed-loop sessions ('' for none)")
    parser.add_argument("--live", default="", help="live episodes, e.g. 100,300,1000")
    parser.add_argument("--interval", type=float, default=5.0, help="s between a live call")
    parser.add_argument("--duration", type=float, default=60.0, help="s of each live level")
    parser.add_argument("--open-at-once", type=int, default=10, help="sessions opened at once")
    parser.add_argument("--order", choices=("interleaved", "sequential"), default="interleaved")
    parser.add_argument(
        "--watch-interval", type=float, help="POSTTRAIN_WATCH_INTERVAL_S (default: the product's)"
    )
    parser.add_argument(
        "--continue-as-new-events",
        type=int,
        help="POSTTRAIN_CONTINUE_AS_NEW_EVENTS: episodes continue as new this often (a new "
        "workflow instance each time)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="split: also each session's first call through a restarted gateway (cold cache)",
    )
    parser.add_argument("--stacks", action="store_true", help="print where loops stalled")
    parser.add_argument(
        "--metrics",
        choices=("on", "off"),
        default=None,
        help="POSTTRAIN_METRICS of the server's processes (default: theirs, on): the cost of "
        "the gateway's metrics is the difference between two runs",
    )
    parser.add_argument("--keep", action="store_true", help="keep the state dir (logs, probes)")
    args = parser.parse_args()
    args.levels = [int(x) for x in args.levels.split(",") if x]
    args.live = [int(x) for x in args.live.split(",") if x]
    state = Path(tempfile.mkdtemp(prefix="gateway-latency-"))
    topology = bench_topology(state, args.shape, args.workers, settings_env(args))
    shape = args.shape if args.shape == "allinone" else f"split, {args.workers} workers"
    print(f"shape: {shape}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    if settings_env(args):
        print(f"settings: {settings_env(args)}")
    serve(topology, state, lambda: bench(topology, args), keep=args.keep)


def bench_topology(state: Path, shape: str, workers: int, extra_env: dict[str, str]) -> Topology:
    """The server processes over `state`, with the benchmark task; every job runs a day."""
    tasks = state / "tasks"
    (tasks / TASK_ID).mkdir(parents=True)
    (tasks / TASK_ID / "task.toml").write_text(TASK)
    return Topology(
        shape,
        state / "server",
        FakeScenario(jobs=[FakeJobScript(queue_s=0, run_s=86400)]),
        tasks,
        workers=workers,
        extra_env=extra_env,
    )


def serve(
    topology: Topology,
    state: Path,
    measure: Callable[[], Coroutine[Any, Any, None]],
    *,
    keep: bool = False,
) -> None:
    """Start the topology, run `measure()`, stop it (printing each process's stop time and, on
    a failure, the logs); remove `state` unless `keep`."""
    try:
        topology.start()
        asyncio.run(measure())
    except BaseException:
        print(topology.logs(), file=sys.stderr)
        raise
    finally:
        stopped = topology.stop()
        print(
            "stopped (SIGTERM to exit): " + ", ".join(f"{n} {s:.1f} s" for n, s in stopped.items())
        )
        if keep:
            print(f"state kept in {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
