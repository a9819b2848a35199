"""Burst admission: N `PostTrainEnv` clients reset and submit a job at the same moment.

    uv run python bench/burst.py [--shape allinone|split] [--workers 2] [--clients 50,200]

Against the real server processes (`bench/_topology.py`, fake backend), warmed up by one
episode first. Every client opens its session and socket first; then all send `reset` and one
`jobs_submit` at once. Reported per burst size:

- errors a client saw (an exception from `PostTrainEnv`, or an error envelope in the submit's
  answer): the target is none;
- re-sends `PostTrainEnv` made (retryable error frames or dropped connections it rode out) and
  the Temporal failures the gateway logged (by status, e.g. FAILED_PRECONDITION): what the
  client's retry hid;
- the time from the burst to the last client admitted, and per-client p50/p99;
- the workers' workflow task latencies and failures, and the gateway's loop stalls.

Each burst size runs on a fresh server.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _diagnose import Snapshot, diagnostics, snapshot  # noqa: E402 - bench/ is sys.path[0]
from _topology import Topology  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction  # noqa: E402
from tool_latency import TASK, TASK_ID  # noqa: E402

from activities.backends.fake.backend import FakeJobScript, FakeScenario  # noqa: E402
from posttrain_env import PostTrainEnv  # noqa: E402

SUBMIT = {"script": "RUN_LONG = 1\n", "flavor": "cpu-basic", "timeout_minutes": 60}
MESSAGE_TIMEOUT_S = 300.0
GATEWAY_FAILURE = re.compile(r"Temporal call failed[^:]*: (\S+)")


class Resends(logging.Handler):
    """Counts `PostTrainEnv`'s "re-sending" log records, by problem."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.problems: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if "re-sending" in record.getMessage():
            args = record.args if isinstance(record.args, tuple) else ()
            self.problems[str(args[0]) if args else record.getMessage()] += 1


@dataclass
class Outcome:
    admitted_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def admit(env: PostTrainEnv, outcome: Outcome) -> None:
    """Reset and submit one job; what the client saw goes into `outcome`."""
    started = time.perf_counter()
    try:
        await env.reset(task_id=TASK_ID)
        submitted = await env.step(CallToolAction(tool_name="jobs_submit", arguments=SUBMIT))
    except Exception as exc:  # every failure a client sees is what this counts
        outcome.errors.append(f"{type(exc).__name__}: {exc}")
        return
    data = submitted.observation.result["data"]
    if "error" in data:
        outcome.errors.append(f"jobs_submit answered {data['error']}")
    else:
        outcome.admitted_s.append(time.perf_counter() - started)


async def connected(base_url: str) -> PostTrainEnv:
    """A client with its session and socket open (before the burst)."""
    env = PostTrainEnv(base_url=base_url, message_timeout_s=MESSAGE_TIMEOUT_S)
    await env._connect_async()
    return env


async def burst(topology: Topology, clients: int) -> None:
    # One episode first: the worker has run every workflow type once.
    warm = Outcome()
    await admit(await connected(topology.base_url), warm)
    assert not warm.errors, warm.errors
    envs = await asyncio.gather(*(connected(topology.base_url) for _ in range(clients)))
    resends = Resends()
    logging.getLogger("posttrain_env.client").addHandler(resends)
    logging.getLogger("posttrain_env.client").setLevel(logging.INFO)
    log_from = topology.gateway.log.stat().st_size
    outcome = Outcome()
    before = snapshot(topology)
    await asyncio.gather(*(admit(env, outcome) for env in envs))
    logging.getLogger("posttrain_env.client").removeHandler(resends)
    report(topology, clients, outcome, resends, log_from, before)
    for env in envs:  # drop the sockets; the server stops next
        env._drop_socket()


def report(
    topology: Topology,
    clients: int,
    outcome: Outcome,
    resends: Resends,
    log_from: int,
    before: Snapshot,
) -> None:
    admitted = sorted(outcome.admitted_s)
    print(f"burst of {clients}: {len(admitted)} admitted, {len(outcome.errors)} client errors")
    for error, count in Counter(outcome.errors).most_common(5):
        print(f"  error {count}x: {error[:300]}")
    if admitted:
        p99 = admitted[min(len(admitted) - 1, int(len(admitted) * 0.99))]
        print(
            f"  admitted all in {max(admitted):.1f} s; per client p50 "
            f"{statistics.median(admitted):.1f} s, p99 {p99:.1f} s"
        )
    print(f"  PostTrainEnv re-sends: {sum(resends.problems.values())}")
    for problem, count in resends.problems.most_common(5):
        print(f"    {count}x {problem[:200]}")
    gateway_log = topology.gateway.log.read_bytes()[log_from:].decode(errors="replace")
    failures = Counter(GATEWAY_FAILURE.findall(gateway_log))
    print(f"  Temporal failures the gateway answered with an error: {dict(failures) or 'none'}")
    for line in diagnostics(topology, before):
        print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shape", choices=("allinone", "split"), default="allinone")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (split)")
    parser.add_argument("--clients", default="50,200", help="burst sizes, one server each")
    parser.add_argument("--keep", action="store_true", help="keep the state dirs")
    args = parser.parse_args()
    shape = args.shape if args.shape == "allinone" else f"split, {args.workers} workers"
    print(f"shape: {shape}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    for clients in [int(x) for x in args.clients.split(",") if x]:
        state = Path(tempfile.mkdtemp(prefix="burst-"))
        (state / "tasks" / TASK_ID).mkdir(parents=True)
        (state / "tasks" / TASK_ID / "task.toml").write_text(TASK)
        topology = Topology(
            args.shape,
            state / "server",
            FakeScenario(jobs=[FakeJobScript(queue_s=0, run_s=86400)]),
            state / "tasks",
            workers=args.workers,
        )
        try:
            topology.start()
            asyncio.run(burst(topology, clients))
        except BaseException:
            print(topology.logs(), file=sys.stderr)
            raise
        finally:
            topology.stop()
            if args.keep:
                print(f"  state kept in {state}")
            else:
                shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
