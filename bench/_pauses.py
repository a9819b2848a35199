"""Where a bench's processes spend their time, read from outside the work being measured:
each process's full garbage collections (a Python worker holding thousands of cached
workflows stops for each one) and each process's CPU use by minute (from /proc, Linux)."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# A full collection at least this long is written down (shorter ones do not move a p99 of 1 s).
LOGGED_PAUSE_S = 0.05


def log_full_collections(path: Path) -> Callable[[], None]:
    """From now on, append `<epoch start> <seconds>` to `path` for each of this process's full
    (generation 2) collections of at least `LOGGED_PAUSE_S`. Returns what stops it."""
    began: list[float] = []
    log = path.open("a", buffering=1)

    def on_collection(phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            began[:] = [time.time(), time.perf_counter()]
        elif began:
            seconds = time.perf_counter() - began[1]
            if seconds >= LOGGED_PAUSE_S:
                log.write(f"{began[0]:.3f} {seconds:.3f}\n")

    gc.callbacks.append(on_collection)

    def stop() -> None:
        gc.callbacks.remove(on_collection)
        log.close()

    return stop


@dataclass
class Pauses:
    """One process's logged full collections."""

    at: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def summary(self) -> str:
        if not self.seconds:
            return f"none of {LOGGED_PAUSE_S * 1000:.0f} ms or more"
        over_half = sum(1 for s in self.seconds if s >= 0.5)
        return (
            f"{len(self.seconds)} of {LOGGED_PAUSE_S * 1000:.0f} ms or more, "
            f"{sum(self.seconds):.1f} s in all, longest {max(self.seconds) * 1000:.0f} ms, "
            f"{over_half} of 500 ms or more"
        )

    def by_minute(self, started_at: float) -> dict[int, float]:
        """Seconds of full collections that began in each minute since `started_at`."""
        minutes: dict[int, float] = {}
        for at, seconds in zip(self.at, self.seconds, strict=True):
            minute = int((at - started_at) // 60)
            minutes[minute] = minutes.get(minute, 0.0) + seconds
        return minutes


def read_pauses(folder: Path) -> dict[str, Pauses]:
    """Every `gc-<name>.log` in `folder`, by name."""
    by_name: dict[str, Pauses] = {}
    for path in sorted(folder.glob("gc-*.log")):
        pauses = by_name.setdefault(path.stem.removeprefix("gc-"), Pauses())
        for line in path.read_text().splitlines():
            at, seconds = line.split()
            pauses.at.append(float(at))
            pauses.seconds.append(float(seconds))
    return by_name


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds `pid` has used (with its waited-for children: none here);
    None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    # After the command: state is fields[0], so utime (14th) and stime (15th) are 11 and 12.
    return (int(fields[11]) + int(fields[12])) / ticks


def pid_running(command_part: str) -> int | None:
    """The first process whose command line contains `command_part` (e.g. the dev server's
    database file): the bench does not start the server's process itself."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if command_part in command:
            return int(entry.name)
    return None


@dataclass
class CpuByMinute:
    """Each named process's share of one core since the last sample (100 = one core busy)."""

    pids: dict[str, int]
    last: dict[str, float] = field(default_factory=dict)

    def sample(self) -> dict[str, float]:
        """One minute's shares since the last sample (call every 60 s)."""
        shares: dict[str, float] = {}
        for name, pid in self.pids.items():
            now = cpu_seconds(pid)
            if now is None:
                continue
            if name in self.last:
                shares[name] = (now - self.last[name]) / 60 * 100
            self.last[name] = now
        return shares
