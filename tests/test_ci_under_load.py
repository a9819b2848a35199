"""scripts/ci-under-load (docs/development.md, "Tests under load"): the command runs beside the
busy processes asked for, its exit status is the script's, and no busy process outlives it."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "ci-under-load"


def busy_loops_of(script_pid: str) -> list[str]:
    """The busy loops a run of the script started: each names itself and the script's pid."""
    ps = subprocess.run(["ps", "-wweo", "args="], capture_output=True, text=True, check=True)
    return [
        line for line in ps.stdout.splitlines() if line.endswith(f"ci-under-load-busy {script_pid}")
    ]


def test_the_command_runs_beside_the_busy_processes_and_none_outlives_it() -> None:
    # The command is the script's child: its $PPID is the script's pid. A loop forked but not
    # yet started shows the script's arguments, so the command looks until all three show (or
    # 30 s have passed); -ww: the whole line, whatever COLUMNS says (pytest sets it).
    command = (
        'echo "$PPID"; for _ in $(seq 300); do '
        'n=$(ps -wweo args= | grep -c "ci-under-load-busy $PPID\\$"); '
        '[ "$n" -ge 3 ] && break; sleep 0.1; done; echo "$n"; exit 7'
    )
    done = subprocess.run(
        [str(SCRIPT), "--busy", "3", "--", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 7, done.stderr
    script_pid, busy_during = done.stdout.split()
    assert busy_during == "3", done.stdout
    assert "3 busy processes beside: sh -c" in done.stderr, done.stderr
    assert "exit status 7" in done.stderr, done.stderr
    assert busy_loops_of(script_pid) == []


def test_a_busy_count_that_is_no_number_is_refused_with_status_2() -> None:
    done = subprocess.run(
        [str(SCRIPT), "--busy", "many", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "--busy must be a whole number" in done.stderr, done.stderr
