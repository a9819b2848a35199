"""Finding payloads that Temporal refused for their size, in a log (the check every test makes).

The SDK core logs `[TMPRL1103] Attempted to upload payloads with size that exceeded the error
limit` at ERROR each time it fails a workflow task for it (the warning limit is logged at WARN).
Every process of ours forwards that log to Python logging (`core_runtime`), so it shows in the
test's own log records (tests/conftest.py) and in the log file of every server or worker process
a test starts (`assert_no_violation_in`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def payload_limit_violations(lines: Iterable[str]) -> list[str]:
    """The log lines that report a payload over Temporal's error limit."""
    return [line for line in lines if "TMPRL1103" in line and "ERROR" in line]


def violations_in(*logs: Path) -> list[str]:
    """The violations reported in these log files (those that exist)."""
    found: list[str] = []
    for log in logs:
        if log.exists():
            found += payload_limit_violations(log.read_text(errors="replace").splitlines())
    return found


def assert_no_violation_in(*logs: Path) -> None:
    """Fail if a process whose output went to one of `logs` had a payload refused for its size:
    the same check the in-process tests make."""
    violations = violations_in(*logs)
    assert not violations, f"a payload over Temporal's limit: {violations[:3]}"
