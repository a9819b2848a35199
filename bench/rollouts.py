"""Rollouts per second on the replay backend, and a rollout's time against a trainer step.

    uv run python bench/rollouts.py [--rollouts 200] [--concurrency 1,10,50] [--step-s 0.5,2,10]

The whole deployment as `posttrain-env server` runs it (`bench/_topology.py`, all-in-one: the
gateway, a worker, the embedded file-backed Temporal dev server), on the replay backend over the
fake one (`POSTTRAIN_REPLAY_TIME_SCALE` 0.001, so a recorded 1-minute job replays in 60 ms). The
episode's script is recorded first (one episode that falls through to the fake backend), then
every rollout is replayed: `posttrain_env.training.rollout` with a scripted five-call episode
(`jobs_submit`, `jobs_wait` until the job ended, `dev_evaluate`, `jobs_status`, `submit`), each
client coroutine playing its rollouts one after another in its own session over `/ws`.

Reported per level of concurrency: rollouts per second (target: 5 with ten clients on 2 cores,
the gateway and Temporal included; issue 43), the tool calls a rollout made, rollout latency
p50/p99 (target: 0.5 s at p50 with one client), the CPU seconds per rollout of the server and of
its Temporal apart, the history events and workflow tasks per rollout by workflow type
(`bench/_history_work.py`; target: 70 and 12 for the episode and its jobs' workflows;
`--event-kinds` also splits them by event type), and, for each trainer step time given
(`--step-s`: this benchmark trains nothing), how many steps a rollout spans at p50 and p99 and
whether that fits an asynchronous trainer's window (TRL AsyncGRPO's `max_staleness`, 4 by default).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _history_work import history_work  # noqa: E402 - bench/ is sys.path[0]
from _topology import Topology  # noqa: E402

from activities.backends.fake.backend import FakeJobScript, FakeScenario  # noqa: E402
from posttrain_common.contracts.jobs import JobRole  # noqa: E402
from posttrain_env import PostTrainEnv  # noqa: E402
from posttrain_env.agents.scripted import ScriptedAgent  # noqa: E402
from posttrain_env.training.rollout import rollout  # noqa: E402
from posttrain_env.training.staleness import fits_staleness, staleness_steps  # noqa: E402

TASK_ID = "t_rollouts"
TASK = f"""
id = "{TASK_ID}"
prompt = "Benchmark task."
flavors = ["cpu-basic"]
max_timeout_minutes = 60
budget_usd = 10.0
max_steps = 100
time_limit_s = 86400
score_timeout_s = 600
max_concurrent_jobs = 2
max_dev_evaluations = 2
eval_flavor = "cpu-basic"
eval_timeout_minutes = 10

[base_model]
repo_id = "bench-org/tiny-model"
revision = "main"
"""
SCRIPT = "# the benchmark's training script\nprint('train')\n"
SCENARIO = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.grader, queue_s=0, run_s=1, score=0.75),
        FakeJobScript(role=JobRole.dev, queue_s=0, run_s=1, score=0.5),
        FakeJobScript(queue_s=0, run_s=1),
    ]
)
EPISODE = [
    {
        "tool": "jobs_submit",
        "arguments": {"script": SCRIPT, "flavor": "cpu-basic", "timeout_minutes": 10},
    },
    {"wait": True},
    {"tool": "dev_evaluate", "arguments": {"job_id": "$job"}},
    {"tool": "jobs_status", "arguments": {"job_id": "$job"}},
    {"tool": "submit", "arguments": {"job_id": "$job"}},
]
MAX_STALENESS = 4  # TRL AsyncGRPOConfig.max_staleness's default
# Issue 43's targets (they replace issue 29's 50 rollouts/s): per rollout, the history events
# and workflow tasks of its episode and its jobs' workflows (the session that plays rollouts one
# after another is counted apart), the one-client latency at p50, the rate with ten clients.
TARGET_EVENTS, TARGET_TASKS = 70.0, 12.0
TARGET_LATENCY_S, TARGET_PER_S, TARGET_CLIENTS = 0.5, 5.0, 10
# A rollout's own workflows: its episode and its jobs' (and what the watcher does for them).
OWN_WORKFLOWS = ("EpisodeWorkflow", "JobWorkflow", "WatcherWorkflow")


async def play_one(env: PostTrainEnv) -> tuple[float, int, bool, float | None]:
    """One rollout: its latency, its tool calls, whether it was replayed, its reward."""
    started = time.perf_counter()
    reward, _, transcript = await rollout(env, ScriptedAgent(EPISODE), TASK_ID)
    latency = time.perf_counter() - started
    calls = len(transcript.conversation.answers()) if transcript.conversation else 0
    return latency, calls, transcript.outcome.replayed, reward


async def level(base_url: str, rollouts: int, concurrency: int) -> dict[str, object]:
    latencies: list[float] = []
    calls: list[int] = []
    replayed: list[bool] = []
    rewards: list[float | None] = []
    queue = list(range(rollouts))

    async def client() -> None:
        env = PostTrainEnv(base_url=base_url, message_timeout_s=600)
        async with env:
            while queue:
                queue.pop()
                latency, n, was_replayed, reward = await play_one(env)
                latencies.append(latency)
                calls.append(n)
                replayed.append(was_replayed)
                rewards.append(reward)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    latencies.sort()
    return {
        "wall": wall,
        "per_s": len(latencies) / wall,
        "p50": statistics.median(latencies),
        "p99": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))],
        "calls": statistics.median(calls),
        "replayed": sum(replayed),
        "scored": sum(r is not None for r in rewards),
        "n": len(latencies),
    }


def cpu_s(topology: Topology) -> dict[str, float]:
    """CPU seconds so far: Temporal's (the embedded dev server) and the rest (gateway, worker)."""
    split = {"temporal": 0.0, "server": 0.0}
    for proc in topology.procs:
        for name, seconds in proc.cpu_s().items():
            split["temporal" if name.endswith("/temporal") else "server"] += seconds
    return split


def main() -> None:
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # rows appear as each level ends
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200, help="rollouts per level")
    parser.add_argument("--concurrency", default="1,10,50", help="client coroutines, per level")
    parser.add_argument("--step-s", default="0.5,2,10", help="trainer step times to compare")
    parser.add_argument("--time-scale", type=float, default=0.001)
    parser.add_argument("--event-kinds", action="store_true", help="events by kind, per level")
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",") if x]
    steps = [float(x) for x in args.step_s.split(",") if x]
    print(
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; replay backend over "
        f"the fake, time scale {args.time_scale}; all-in-one server"
    )
    state = Path(tempfile.mkdtemp(prefix="rollouts-"))
    (state / "tasks" / TASK_ID).mkdir(parents=True)
    (state / "tasks" / TASK_ID / "task.toml").write_text(TASK)
    (state / "tasks" / TASK_ID / "evaluator.py").write_text("print('never run by the fake')\n")
    topology = Topology(
        "allinone",
        state / "server",
        SCENARIO,
        state / "tasks",
        extra_env={
            "POSTTRAIN_BACKEND": "replay",
            "POSTTRAIN_REPLAY_INNER": "fake",
            "POSTTRAIN_REPLAY_FALL_THROUGH": "true",
            "POSTTRAIN_REPLAY_TIME_SCALE": str(args.time_scale),
            "POSTTRAIN_WATCH_INTERVAL_S": "1",
        },
    )
    try:
        topology.start()
        recorded = asyncio.run(level(topology.base_url, 1, 1))
        print(f"recording run (falls through to the fake backend): {recorded['p50']:.2f} s")
        print(
            f"{'clients':>7} {'rollouts':>8} {'per s':>7} {'calls':>5} {'p50 s':>7} "
            f"{'p99 s':>7} {'replayed':>8} {'cpu s/rollout':>13}"
        )
        rows = []
        for clients in levels:
            before, since = cpu_s(topology), time.time()
            row = asyncio.run(level(topology.base_url, args.rollouts, clients))
            until, after, n = time.time(), cpu_s(topology), max(1, int(row["n"]))  # type: ignore[arg-type]
            row["cpu"] = sum(after.values()) - sum(before.values())
            row["cpu"] /= n
            rows.append((clients, row))
            print(
                f"{clients:>7} {row['n']:>8} {row['per_s']:>7.1f} {row['calls']:>5} "
                f"{row['p50']:>7.2f} {row['p99']:>7.2f} {row['replayed']:>8} {row['cpu']:>13.3f}"
            )
            temporal = (after["temporal"] - before["temporal"]) / n
            server = (after["server"] - before["server"]) / n
            work = asyncio.run(history_work(topology.temporal_address, since, until)).per(n)
            print(f"        per rollout: temporal {temporal:.3f} CPU-s, server {server:.3f} CPU-s")
            print(f"        per rollout: {work.line()}")
            row["events"] = sum(work.events[k] for k in OWN_WORKFLOWS)
            row["tasks"] = sum(work.tasks[k] for k in OWN_WORKFLOWS)
            if args.event_kinds:
                for kind, count in sorted(work.kinds.items()):
                    print(f"        {kind} {count:.1f}")
        for clients, row in rows:
            events, tasks = float(row["events"]), float(row["tasks"])  # type: ignore[arg-type]
            met = events <= TARGET_EVENTS and tasks <= TARGET_TASKS
            print(
                f"target: <= {TARGET_EVENTS:.0f} history events and <= {TARGET_TASKS:.0f} "
                f"workflow tasks per rollout (episode and jobs), {clients} clients: "
                f"{events:.1f} and {tasks:.1f}: {'met' if met else 'not met'}"
            )
        by_clients = dict(rows)
        if 1 in by_clients:
            p50 = float(by_clients[1]["p50"])  # type: ignore[arg-type]
            met = "met" if p50 <= TARGET_LATENCY_S else "not met"
            print(f"target: one-client latency p50 <= {TARGET_LATENCY_S} s: {p50:.2f} s: {met}")
        if TARGET_CLIENTS in by_clients:
            per_s = float(by_clients[TARGET_CLIENTS]["per_s"])  # type: ignore[arg-type]
            met = "met" if per_s >= TARGET_PER_S else "not met"
            print(
                f"target: >= {TARGET_PER_S:.0f} rollouts/s with {TARGET_CLIENTS} clients: "
                f"{per_s:.1f}/s: {met}"
            )
        print(f"a rollout against a trainer step (max_staleness {MAX_STALENESS}):")
        for clients, row in rows:
            for step in steps:
                p50, p99 = float(row["p50"]), float(row["p99"])  # type: ignore[arg-type]
                fits = "fits" if fits_staleness(p99, step, MAX_STALENESS) else "does not fit"
                print(
                    f"  {clients:>3} clients, step {step:g} s: p50 {staleness_steps(p50, step)} "
                    f"step(s), p99 {staleness_steps(p99, step)} step(s): {fits}"
                )
    except BaseException:
        print(topology.logs(), file=sys.stderr)
        raise
    finally:
        topology.stop()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
