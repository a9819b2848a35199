"""Finding payloads that Temporal refused for their size, in a log (the check every test makes).

The SDK core logs `[TMPRL1103] Attempted to upload payloads with size that exceeded the error
limit` at ERROR each time it fails a workflow task for it (the warning limit is logged at WARN).
"""

from __future__ import annotations

from collections.abc import Iterable


def payload_limit_violations(lines: Iterable[str]) -> list[str]:
    """The log lines that report a payload over Temporal's error limit."""
    return [line for line in lines if "TMPRL1103" in line and "ERROR" in line]
