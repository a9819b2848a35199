"""Process checks shared by the launcher and local-backend tests."""

from __future__ import annotations

import os
from pathlib import Path


def live_pids_of_uid(uid: int) -> list[int]:
    """Live processes whose real, effective, saved or fs uid is `uid` (from /proc/<pid>/status)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uids = [int(x) for x in fields.get("Uid", "").split()]
        if uid in uids and fields.get("State", "").split()[:1] not in (["Z"], ["X"]):
            pids.append(int(name))
    return pids
