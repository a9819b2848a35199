"""The fault matrix's command (docs/deployment.md, "The fault matrix"): what each of the page's
command lines runs, what it refuses, how it prints a failed cell, and that the slow test's
rotation reaches every kill point and every target. No processes: the cells themselves run in
`test_fault_matrix.py` (slow) and by the command."""

from __future__ import annotations

import pytest

from tests.faults.matrix import CellResult, format_matrix, parse
from tests.faults.plays import LOCAL_POINTS, POINTS
from tests.faults.test_fault_matrix import FAKE_ROTATION, LOCAL_ROTATION
from tests.faults.topology import KILL_TARGETS


def test_the_readme_command_lines_choose_their_cells() -> None:
    whole = parse([])
    assert (whole.backend, whole.points) == ("fake", list("abcdefgh"))
    assert whole.targets == ["none", "gateway", "worker", "temporal", "everything"]
    local = parse(["--backend", "local"])
    assert local.points == ["b", "d", "e"] and len(local.targets) == 5
    some = parse(["--points", "ce", "--targets", "worker,everything"])
    assert (some.points, some.targets) == (["c", "e"], ["worker", "everything"])


@pytest.mark.parametrize(
    "argv", [["--backend", "local", "--points", "a"], ["--targets", "gateway,printer"]]
)
def test_a_point_the_backend_cannot_play_or_an_unknown_target_is_refused(
    argv: list[str],
) -> None:
    with pytest.raises(SystemExit) as refused:
        parse(argv)
    assert refused.value.code == 2


def test_the_matrix_prints_each_cell_and_every_failure() -> None:
    results = [
        CellResult("fake", "c", "none", recovery_s=7.6),
        CellResult(
            "fake",
            "c",
            "worker",
            failures=["episode ep-1 counted 5 steps for 4 requests"],
            recovery_s=12.25,
            killed=["worker-2"],
        ),
    ]
    printed = format_matrix(results, 60)
    assert "(c) jobs_wait in flight" in printed
    assert "pass 7.6s" in printed and "FAIL 12.2s" in printed
    assert "1 of 2 cells pass" in printed
    assert "- episode ep-1 counted 5 steps for 4 requests" in printed


def test_the_slow_rotation_kills_at_every_point_and_every_target() -> None:
    assert sorted(point for point, _ in FAKE_ROTATION) == sorted(POINTS)
    assert {target for _, target in FAKE_ROTATION} == set(KILL_TARGETS)
    assert sorted(point for point, _ in LOCAL_ROTATION) == sorted(LOCAL_POINTS)
