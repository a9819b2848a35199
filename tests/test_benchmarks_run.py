"""The benchmark commands of docs/development.md run (tiny sizes). They measure; this only
checks they work.

The ones that start a whole deployment (a Temporal server, a gateway, workers) and play
episodes through it take 15-30 s each on 2 cores: they run with the slow set (`-m slow`), which
CI runs too, so that the default set stays a few minutes."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("bare", "ws", "mcp")
# A benchmark that starts its own deployment and plays through it.
DEPLOYMENT = pytest.mark.slow


def run(*args: str, timeout: float = 240) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_tool_latency_benchmark_runs_and_prints_its_table() -> None:
    out = run("bench/tool_latency.py", "--calls", "10", "--levels", "1,2")
    assert "jobs_status" in out and "bare" in out
    rows = [line for line in out.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert len(rows) == 2, out


def test_the_launcher_overhead_benchmark_runs_and_prints_its_figures() -> None:
    out = run("bench/launcher_overhead.py", "--runs", "2")
    assert "median" in out and "target" in out, out


@pytest.mark.slow
def test_the_loopback_benchmark_runs_and_prints_its_figures() -> None:
    # As root, with torch from this machine's wheel folders (the all-reduce loop).
    out = run(
        "bench/loopback.py",
        *("--calls", "50", "--rounds", "1", "--mib", "8", "--steps", "5", "--repeat", "1"),
        timeout=900,
    )
    assert "TCP connect to 127.0.0.1 (trapped)" in out and "all_reduce" in out, out
    assert "ratio" in out and "target" in out, out


@pytest.mark.slow
def test_the_neighbours_benchmark_runs_and_prints_its_ratios() -> None:
    # As root: real local jobs, one hog (the log flood: the quickest at full force).
    args = ("--hogs", "log_flood", "--rounds", "1", "--calls", "5")
    out = run("bench/neighbours.py", *args, timeout=600)
    (row,) = [line for line in out.splitlines() if line.startswith("log_flood")]
    assert len(re.findall(r"\d+\.\d\dx", row)) == 3, out  # job time, p50 and p99 ratios
    assert row.rstrip().endswith(("ok", "OVER 2x")), out


def test_the_client_import_benchmark_runs_and_prints_both_shapes() -> None:
    out = run("bench/client_import.py", "--runs", "1")
    rows = {line.split("  ")[0].strip(): line for line in out.splitlines()[3:]}
    assert set(rows) == {"today", "openenv.core whole"}, out
    assert rows["today"].endswith("  -") and "fastapi" in rows["openenv.core whole"], out


@DEPLOYMENT
def test_the_gateway_latency_benchmark_runs_and_prints_its_table() -> None:
    # The split shape (its own Temporal, a gateway, a worker) with both kinds of level; the
    # all-in-one server is the burst benchmark's (below).
    out = run(
        "bench/gateway_latency.py",
        *("--shape", "split", "--workers", "1", "--calls", "6", "--levels", "1,2"),
        *("--live", "2", "--interval", "1", "--duration", "3"),
    )
    # A level's rows, not its `2 calls/s (offered 2)` line below them.
    rows = [
        row
        for row in (line.split() for line in out.splitlines())
        if len(row) > 1 and row[0] in ("1", "2", "live2") and row[1] in PATHS
    ]
    assert [(r[0], r[1]) for r in rows] == [
        (level, path) for level in ("1", "2", "live2") for path in PATHS
    ], out
    assert all(r[-2].endswith("x") and r[-1].endswith("x") for r in rows), out  # p50, p99 ratios
    assert "target" in out and "offered" in out, out
    assert "wft execution" in out and "worker0 loop" in out and "gateway loop" in out, out


@DEPLOYMENT
def test_the_burst_benchmark_runs_and_prints_what_the_clients_saw() -> None:
    out = run("bench/burst.py", "--clients", "2")
    assert "burst of 2: 2 admitted, 0 client errors" in out, out
    assert "PostTrainEnv re-sends" in out and "wft sched-to-start" in out, out


@DEPLOYMENT
def test_the_episode_wall_benchmark_runs_and_prints_its_phases() -> None:
    out = run("bench/episode_wall.py", "--runs", "1")
    assert "training script (run phase)" in out and "machinery" in out and "target" in out, out


# The default suite runs only the contained row: the `nice` and `none` rows start a 16-session
# hog without control groups, each session weighing as much as all local jobs together, which
# loads the whole machine for every test running beside it (test_containment's CPU test among
# them). Those rows run with the slow tests (`-m slow`).
@pytest.mark.parametrize(
    "containments",
    ["groups", pytest.param("nice,none", marks=pytest.mark.slow, id="uncontained")],
)
def test_the_local_contention_benchmark_runs_and_prints_its_table(containments: str) -> None:
    out = run("bench/local_contention.py", "--pairs", "1", "--containments", containments)
    names = containments.split(",")
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(tuple(names))]
    assert rows == names and "target" in out, out


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_arithmetic_benchmark_runs_and_prints_its_figures() -> None:
    out = run("bench/arith_tiny.py", "--quick", timeout=1800)
    assert "t0_arithmetic_format_tiny" in out and "items/s" in out, out
    assert "generated tokens/s" in out and "one grading" in out, out


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_tool_calling_benchmark_runs_and_prints_its_figures() -> None:
    out = run("bench/tool_call.py", "--quick", timeout=1800)
    assert "t1_tool_call_tiny hidden split: 200 items" in out, out
    assert "generated tokens/s" in out and "one grading of t1_tool_call" in out, out


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_math_word_problems_benchmark_runs_and_prints_its_figures() -> None:
    out = run("bench/math_word_problems.py", "--quick", timeout=1800)
    assert "math_word_problems_tiny: one grading of 20 problems" in out, out
    assert "Qwen2.5-0.5B-sized (2 layers" in out and "generated tokens/s" in out, out


@DEPLOYMENT
@pytest.mark.timeout(960)
def test_the_campaign_scale_benchmark_runs_and_prints_its_figures() -> None:
    # 15 s alone; in a fresh clone's slow set (8 workers on 2 cores, beside model training and
    # vLLM's compilation) it once passed 240 s. This checks that it runs, not how fast.
    out = run("bench/campaign_scale.py", "--rollouts", "3", "--concurrency", "2", timeout=900)
    assert "phase: completed" in out and "rollouts_per_minute" in out, out
    assert "rollout_events_median" in out and "worker_peak_rss_mib" in out, out


@DEPLOYMENT
def test_the_scale_benchmark_runs_and_prints_its_tables() -> None:
    out = run(
        "bench/scale.py",
        *("--live", "5", "--workers", "1", "--interval", "1", "--duration", "5"),
        *("--quiet", "2", "--settle", "1"),
    )
    lines = out.splitlines()
    headers = [i for i, line in enumerate(lines) if line.strip().startswith("level ")]
    # The live level's latency rows (one per path), then the three summary tables.
    assert [lines[i].split()[:2] for i in headers] == [["level", "path"]] + [
        ["level", first] for first in ("offered/s", "temporal", "calling")
    ], out
    # One row per level under each header: its name, then every column (the CPU table's three
    # parts split by `|`).
    for i, cells in zip(headers[1:], (15, 15, 7), strict=True):
        row = lines[i + 1].split()
        assert row[0] == "live5" and len(row) == cells, out
    assert "ws x50" in out and "mcp x99" in out and "hub calls/s" in out, out
    assert "first bottleneck" in out and "10,000 live episodes" in out, out


@DEPLOYMENT
async def test_the_scale_benchmark_runs_on_a_temporal_of_your_own(tmp_path: Path) -> None:
    """`--temporal-address`: the bench's processes use that Temporal (here a dev server on a
    port of its own, search attributes registered) and start none of their own."""
    from tests.workflows.test_worker_restart import dev_server

    async with dev_server(tmp_path / "temporal.db") as (address, client):
        out = await asyncio.to_thread(
            run,
            "bench/scale.py",
            *("--live", "3", "--workers", "1", "--interval", "1", "--duration", "3"),
            *("--quiet", "2", "--settle", "1", "--temporal-address", address),
        )
        episodes = [w async for w in client.list_workflows("WorkflowType = 'EpisodeWorkflow'")]
    assert out.startswith(f"temporal: {address};"), out
    idle = next(line for line in out.splitlines() if line.startswith("idle topology"))
    assert "rss (MiB) temporal 0," in idle, idle  # no Temporal process of the bench's own
    assert f"temporal: at {address}, not measured here" in out, out
    assert "live3" in out and "10,000 live episodes" in out, out
    assert len(episodes) >= 3  # the episodes ran on the given server


# One level in the default set (about a minute of two cores idle); the workflow-only processes
# and the windowed campaign, as long again, with the slow set.
@pytest.mark.parametrize(
    ("processes", "window"), [("0", None), pytest.param("2", 3, marks=pytest.mark.slow)]
)
@pytest.mark.timeout(960)  # a minute idle; past 240 s beside 16 busy processes
def test_the_watch_scale_benchmark_runs_and_meets_its_targets_at_a_small_level(
    processes: str, window: int | None
) -> None:
    # With "2", every workflow runs in the two workflow-only worker processes: the bench's own
    # worker has no workflow, so a job that ended was followed there. With a window, the
    # campaign runs its rollouts 3 at a time: the next start as time is skipped.
    windowed = ["--campaign-window", str(window)] if window else []
    out = run(
        "bench/watch_scale.py",
        "--levels",
        "4x5,12x5",
        "--run-minutes",
        "2",
        "--workflow-processes",
        processes,
        "--campaign",
        "6x5",
        *windowed,
        timeout=900,
    )
    campaign = f"c6x5w{window}" if window else "c6x5"
    assert "watcher shards: 16" in out, out
    rows = [line.split() for line in out.splitlines()]
    levels = {row[0]: row for row in rows if row and row[0] in ("4x5", "12x5", campaign)}
    assert set(levels) == {"4x5", "12x5", campaign}, out
    # The campaign level is its rollouts' 30 jobs; every level's jobs within 30 events (28 on
    # a quiet machine), counted without workflow tasks retried under load (the last column
    # counts those: a starved worker's task that timed out adds three events).
    assert levels[campaign][1] == "30" and all(int(row[3]) <= 30 for row in levels.values()), out
    assert all(row[-1].isdigit() for row in levels.values()), out
    # Payload, events per job and Hub calls hold at any size (the figures of the last level,
    # the campaign's); task latency is not asserted (a loaded machine's figure).
    for target in ("largest payload", "history events per job", "Hub status calls"):
        (line,) = [line for line in out.splitlines() if line.startswith(target)]
        assert line.endswith("OK"), line
    (by_kind,) = [line for line in out.splitlines() if " by workflow: " in line]
    for kind in ("job", "episode", "rollout", "campaign", "shard"):
        assert f"{kind} " in by_kind, by_kind
    assert "growth x1.5 in jobs" in out, out
    # Each workflow process's full collections are reported (the bench's own process's too).
    processes_named = ["main"] + [f"wf-{k}" for k in range(1, int(processes) + 1)]
    for name in processes_named:
        assert f"full garbage collections ({campaign}, {name}): " in out, out


@DEPLOYMENT
@pytest.mark.timeout(900)
def test_the_watch_scale_benchmark_runs_on_the_dev_server_in_real_time() -> None:
    # Jobs run a minute of real time after their ~45 s of scheduling: a few minutes in all.
    out = run(
        "bench/watch_scale.py",
        *("--levels", "2x3", "--campaign", "4x4", "--run-minutes", "1", "--server", "dev"),
        *("--agent-turns-per-second", "20"),  # the campaign's agent queue paced
        timeout=840,
    )
    assert "watcher shards: 16; Temporal: the dev server" in out, out
    rows = [line.split() for line in out.splitlines()]
    levels = {row[0]: row for row in rows if row and row[0] in ("2x3", "c4x4r20")}
    assert levels["2x3"][1] == "6" and levels["c4x4r20"][1] == "16", out
    assert all(int(row[3]) <= 30 for row in levels.values()), out
    for target in ("largest payload", "history events per job", "Hub status calls"):
        (line,) = [line for line in out.splitlines() if line.startswith(target)]
        assert line.endswith("OK"), line
    assert "leaked" not in out, out  # no time-skipping lock on a real server
    # Where the time goes: each process's full collections and, minute by minute, its CPU and
    # the dev server's.
    assert "full garbage collections (c4x4r20, main): " in out, out
    (cpu,) = [line for line in out.splitlines() if line.startswith("CPU % of a core, mean")]
    assert "(c4x4r20): main " in cpu and ", server " in cpu, cpu
    # Submitted in seconds, each on the Hub for minutes: every job was there at once.
    assert "jobs on the Hub at once (most): 2x3 6 of 6, c4x4r20 16 of 16" in out, out
    work = {label: server_work_of(out, label) for label in ("2x3", "c4x4r20")}
    for label, per_job in work.items():
        # A job's own workflow alone takes several workflow tasks, and each job is written.
        assert per_job["workflow tasks"] >= 3 and per_job["persistence writes"] >= 3, (label, out)
    # A campaign's call costs an agent turn and the rollout's store activities besides the
    # episode's; its activities end within their first heartbeat period, so send no beat
    # (about three per job before; a loaded machine may let some run past it).
    assert work["c4x4r20"]["activity tasks"] > work["2x3"]["activity tasks"], out
    assert work["c4x4r20"]["heartbeats"] < 2, out
    # The paced agent turns' wait is reported: 4 rollouts of at least 6 turns each (4 submits,
    # a wait repeated while the job is queued or running, a stop).
    (waits,) = [ln for ln in out.splitlines() if ln.startswith("agent turns' wait to start")]
    turns = int(waits.split("(c4x4r20, scheduled to started, ", 1)[1].split(" turns)")[0])
    assert turns >= 24 and waits.endswith("(paced at 20/s)"), waits


def server_work_of(out: str, label: str) -> dict[str, float]:
    """`server work per job (LABEL, ...): name n, name n` as a dict."""
    (line,) = [ln for ln in out.splitlines() if ln.startswith(f"server work per job ({label},")]
    counts = line.split("): ", 1)[1].split(", ")
    return {name: float(n) for name, n in (c.rsplit(" ", 1) for c in counts)}


@DEPLOYMENT
def test_the_rollouts_benchmark_runs_and_prints_its_table() -> None:
    out = run("bench/rollouts.py", "--rollouts", "4", "--concurrency", "1,2", "--step-s", "1")
    # A level's row: clients, rollouts, per s, calls, p50, p99, replayed, CPU s per rollout.
    rows = [row for row in (line.split() for line in out.splitlines()) if len(row) == 8]
    rows = [row for row in rows if row[0] in ("1", "2")]
    assert [row[0] for row in rows] == ["1", "2"], out
    assert all(row[1] == "4" and row[6] == "4" for row in rows), out  # 4 rollouts, all replayed
    assert "target: one-client latency p50" in out and "max_staleness 4" in out, out
    assert out.count("history events and <= 12 workflow tasks per rollout") == 2, out
    assert "1 clients, step 1 s: p50" in out and "2 clients, step 1 s: p50" in out, out


@pytest.mark.slow
def test_the_grading_benchmark_runs_and_prints_its_targets() -> None:
    # As root, with torch from this machine's wheel folders: a cold grading (the venv built),
    # then the first after a restart and one at once.
    out = run("bench/grading.py", "--quick", timeout=900)
    assert "built the venv" in out and out.count("target") == 2, out
