"""The suite's own deadline for async tests (tests/deadline.py): a late async test fails at its
await, inside the same worker, before pytest-timeout would end the process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LATE = textwrap.dedent(
    """
    import asyncio

    import pytest

    @pytest.mark.timeout(50)
    async def test_late():
        await asyncio.sleep(600)

    async def test_in_time():
        await asyncio.sleep(0)

    def test_after_the_late_one():
        pass  # run: pytest-timeout's thread method would have ended the process with test_late
    """
)


def test_a_late_async_test_fails_at_its_deadline_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "test_late.py").write_text(LATE)
    (tmp_path / "conftest.py").write_text(
        "from tests.deadline import put_async_tests_under_deadlines\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    put_async_tests_under_deadlines(items)\n"
    )
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q"),
            *("-o", "asyncio_mode=auto", "-o", "timeout=300", "-o", "timeout_method=thread"),
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    out = done.stdout + done.stderr
    assert "1 failed, 2 passed" in out, out[-3000:]
    # 90 % of its 50 s: 45 s, then 5 s before pytest-timeout's (shorter than 10 x MARGIN_S). The
    # 5 s are the late test's to fail and report in: with 4 s (0.4 s left) pytest-timeout ended
    # the process while pytest formatted the failure, beside 16 busy processes.
    assert "ran past its deadline (45 s, 5 s before pytest-timeout's)" in out, out[-3000:]
    assert "test_late" in out, out[-3000:]  # the late test's own task, among those still running
