"""The fault matrix: episodes played through the production topology (`cluster-local`: one
Temporal dev server, two gateways, two workers, one key), each with one SIGKILL at one of eight
points (`plays.py`) of one of four targets (a gateway, a worker, the Temporal server,
everything), restarted at once, and checked against the invariants of `checks.py`.

    uv run python -m tests.faults.matrix [--backend fake|local] [--points abcdefgh]
                                         [--targets none,gateway,worker,temporal,everything]

prints the matrix: per cell pass/FAIL and the time from the kill to the answer of the request
around it (`none`: no kill, the same play for the end it reaches untouched), then every failure;
a point that only some targets play (POINT_TARGETS) is left blank under the others.
Exit status 1 when a cell failed. One topology serves every cell of a run. The slow test
(`tests/faults/test_fault_matrix.py`) runs a rotation of cells through the same functions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from posttrain_server.shutdown import exit_now
from tests.faults.checks import check
from tests.faults.player import Answer, Player
from tests.faults.plays import (
    FAKE_SCENARIO,
    FAKE_SCRIPTS,
    LOCAL_POINTS,
    LOCAL_SCRIPTS,
    PLAYS,
    POINT_TARGETS,
    POINTS,
    RECOVERY_BOUNDS_S,
    Context,
    Fault,
)
from tests.faults.topology import KILL_TARGETS, BackendName, Target, Topology

# A cell is a few jobs of seconds, one restart and the client's backoff; past this it is stuck.
CELL_TIMEOUT_S = 280.0
ALL_TARGETS: tuple[Target, ...] = ("none", *KILL_TARGETS)


@dataclass
class CellResult:
    backend: BackendName
    point: str
    target: Target
    failures: list[str] = field(default_factory=list)
    recovery_s: float | None = None
    wall_s: float = 0.0
    killed: list[str] = field(default_factory=list)
    jobs_at_kill: str = ""

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        recovered = f"{self.recovery_s:.1f}s" if self.recovery_s is not None else "-"
        return f"{verdict} {recovered}"

    def describe(self) -> str:
        return (
            f"({self.point}) {POINTS[self.point]} x {self.target} on {self.backend}: "
            f"{self.summary()} (cell {self.wall_s:.0f} s; killed {', '.join(self.killed) or '-'}"
            f"; backend jobs at the kill: {self.jobs_at_kill or '-'})"
            + "".join(f"\n    - {failure}" for failure in self.failures)
        )


def around_the_kill(player: Player, fault: Fault) -> Answer | None:
    """The request the kill interrupted, or the first one sent after it."""
    if fault.struck_at is None:
        return None
    return next((a for a in player.answers if a.answered_at > fault.struck_at), None)


async def run_cell(topology: Topology, point: str, target: Target) -> CellResult:
    """Play `point` with `target` killed at it on the running topology; the cell's result."""
    result = CellResult(topology.backend, point, target)
    scripts = FAKE_SCRIPTS if topology.backend == "fake" else LOCAL_SCRIPTS
    started = time.monotonic()
    restarted = await topology.make_whole()
    if restarted:
        result.failures.append(f"not running before the cell (started again): {restarted}")
    fault = Fault(topology, target)
    player = await Player.open(topology.urls, cell=f"{point}-{target}-{uuid.uuid4().hex[:8]}")
    try:
        context = Context(topology, player, fault, scripts)
        expected = await asyncio.wait_for(PLAYS[point](context), CELL_TIMEOUT_S)
        await fault.restarted()
        around = around_the_kill(player, fault)
        again = await player.send_again(around) if around is not None else None
        await player.close_session()  # (g) ends its second episode so: `cancelled`
        result.recovery_s = fault.recovery_s(around)
        if fault.struck_at is None:
            result.failures.append("the kill point was never reached")
        elif (result.recovery_s or 0) > RECOVERY_BOUNDS_S.get(point, float("inf")):
            result.failures.append(
                f"the answer came {result.recovery_s:.0f} s after the kill, past its "
                f"{RECOVERY_BOUNDS_S[point]:.0f} s bound"
            )
        result.failures += await check(topology, player, expected, around, again)
    except Exception as exc:  # the cell's failure, reported in the matrix
        result.failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            await fault.restarted()
        with contextlib.suppress(Exception):
            await player.aclose()
        result.killed = [m.name for m in fault.killed]
        result.jobs_at_kill = fault.job_states
        result.wall_s = time.monotonic() - started
    return result


async def run_matrix(
    backend: BackendName,
    points: list[str],
    targets: list[Target],
    state_dir: Path,
    report: bool = True,
) -> list[CellResult]:
    scenario = FAKE_SCENARIO
    results = []
    async with Topology.running(state_dir, backend, scenario) as topology:
        for point in points:
            for target in targets:
                if target not in POINT_TARGETS.get(point, ALL_TARGETS):
                    continue
                result = await run_cell(topology, point, target)
                if report:
                    print(result.describe(), flush=True)
                results.append(result)
    return results


def format_matrix(results: list[CellResult], wall_s: float) -> str:
    backends = sorted({r.backend for r in results})
    targets = [t for t in ALL_TARGETS if any(r.target == t for r in results)]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"fault matrix on the {', '.join(backends)} backend: {len(results)} cells in "
        f"{wall_s:.0f} s; load average at the end {load} ({os.cpu_count()} cores)",
        "cell: pass/FAIL and seconds from the kill to the answer of the request around it",
        "",
        f"{'point':<28}" + "".join(f"{t:>13}" for t in targets),
    ]
    for point in POINTS:
        row = {r.target: r for r in results if r.point == point}
        if row:
            cells = "".join(f"{row[t].summary() if t in row else '':>13}" for t in targets)
            lines.append(f"({point}) {POINTS[point]:<24}" + cells)
    failed = [r for r in results if not r.passed]
    lines.append("")
    lines.append(f"{len(results) - len(failed)} of {len(results)} cells pass")
    lines += [r.describe() for r in failed]
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.matrix", description=__doc__)
    parser.add_argument("--backend", choices=("fake", "local"), default="fake")
    parser.add_argument(
        "--points", default=None, help="kill points, e.g. abc (default: all the backend plays)"
    )
    parser.add_argument(
        "--targets",
        default=",".join(ALL_TARGETS),
        help="comma-separated, of " + ", ".join(ALL_TARGETS) + " (default: all)",
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="default: a new temp dir")
    args = parser.parse_args(argv)
    playable = "".join(LOCAL_POINTS) if args.backend == "local" else "".join(POINTS)
    args.points = list(args.points or playable)
    unknown = [p for p in args.points if p not in playable]
    if unknown:
        parser.error(f"the {args.backend} backend plays the points {playable}, not {unknown}")
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    wrong = [t for t in args.targets if t not in ALL_TARGETS]
    if wrong:
        parser.error(f"unknown targets {wrong}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    started = time.monotonic()
    results = asyncio.run(run_matrix(args.backend, args.points, args.targets, state_dir))
    print()
    print(format_matrix(results, time.monotonic() - started), flush=True)
    print(f"(state and logs in {state_dir})")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    exit_now(main())
