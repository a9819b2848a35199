"""The files of one local job, and process identity. Standard library only (and the stdlib-only
`posttrain_env.limits`): the job's supervisor (`activities.backends.local.job_runner`) imports this
module
without the server's dependencies.

A job folder `<state>/local/jobs/<ref>/` holds:

    job.json         what to run (written once by the backend, no secrets)
    supervisor.json  {"pid", "start"} of the job's supervisor process
    status.json      {"started_at"}: wall time the job started (it runs from then on)
    sandbox.json     {"pid", "start", "phase"}: the current phase's pid-namespace init (bwrap's
                     `child-pid`); killing it ends every process of the phase
    cancel           present once a cancellation was asked for
    result.json      {"state", "exit_code", "started_at", "finished_at", "running_s", "message",
                     "phases", "usage", "limits", "outputs"}: written exactly once (the first
                     writer wins), the job's
                     end; `usage` is what its control groups counted (memory peak, OOM kills,
                     processes peak, refused forks); `limits` the limits it met; `outputs`
                     what its artifact holds ({"files", "bytes"}, and "refused" when nothing
                     was kept)
    log              stdout and stderr of every phase, in order (through the supervisor, which
                     stops the job at its log cap)
    job/             the launcher or evaluator script (read-only at /job)
    fs.img           the job's filesystem image while it runs (activities/backends/local/scratch.py)
    fs/              that filesystem: data/ (/data; data/outputs is what the agent's script
                     leaves), tmp/ (/tmp), env/ (the venv: read-write during install, read-only
                     at /env afterwards); gone when the job ends
    shm/             /dev/shm (a tmpfs while the job runs)
    artifact/        data/outputs after the job, copied whole or not at all
                     (activities/backends/local/collection.py; /model of its evaluations)
"""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path
from typing import Any

from posttrain_env.limits import MAX_LOG_READ_BYTES

JOB = "job.json"
SUPERVISOR = "supervisor.json"
STATUS = "status.json"
SANDBOX = "sandbox.json"
CANCEL = "cancel"
RESULT = "result.json"
LOG = "log"
ARTIFACT = "artifact"


def write_json(path: Path, value: Any) -> None:
    """Replace `path` atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, sort_keys=True))
    os.replace(tmp, path)


def create_json(path: Path, value: Any) -> bool:
    """Create `path` with `value` unless it exists; True when this call created it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, sort_keys=True))
    try:
        os.link(tmp, path)  # atomic create-if-absent, so two writers can never both win
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# -- process identity ----------------------------------------------------------------------------


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when it is gone or a zombie.

    A pid with its start time names one process for good: pids are reused, the pair is not.
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def identity(pid: int) -> dict[str, int] | None:
    ticks = start_ticks(pid)
    return None if ticks is None else {"pid": pid, "start": ticks}


def is_alive(ident: dict[str, Any] | None) -> bool:
    # A phase whose sandbox never reported its pid (it ended first, or a loaded machine made
    # the report late) is recorded as {"phase": ...} alone: nothing to signal.
    if not ident or "pid" not in ident:
        return False
    return start_ticks(int(ident["pid"])) == ident.get("start")


def kill(ident: dict[str, Any] | None, sig: int = signal.SIGKILL) -> bool:
    """Signal the process `ident` names, if it still is that process. True when signalled."""
    if not is_alive(ident):
        return False
    assert ident is not None
    try:
        os.kill(int(ident["pid"]), sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# -- disk usage, logs and the artifact ---------------------------------------------------------


def usage(root: Path, limit_files: int) -> tuple[int, int]:
    """(apparent bytes, entries) under `root`, never following links.

    Apparent size (st_size), not allocated blocks: a sparse file costs what copying or uploading
    it would. Stops counting past `limit_files` entries (the caller treats that as over a cap).
    """
    total = files = 0
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return 0, 0  # a link where a folder should be is never followed
    except OSError:
        return 0, 0
    todo = [root]
    while todo and files <= limit_files:
        folder = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except PermissionError:
            # A job that shares our uid (no root) can chmod 000 its own folders to hide them.
            try:
                os.chmod(folder, 0o700)
                entries = list(os.scandir(folder))
            except OSError:
                continue
        except OSError:
            continue
        for entry in entries:
            files += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                todo.append(Path(entry.path))
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total, files


def tail_lines(path: Path, n: int, max_bytes: int = MAX_LOG_READ_BYTES) -> list[str]:
    """The last `n` lines of a log (reading at most its last `max_bytes`)."""
    if n <= 0:
        return []
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except FileNotFoundError:
        return []
    lines = data.decode(errors="replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first line read is probably cut
    return lines[-n:]
