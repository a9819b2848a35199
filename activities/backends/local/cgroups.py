"""Control groups of local jobs (DESIGN §10: a local job is contained by the kernel).

Standard library only: the job's supervisor (activities/backends/local/job_runner.py) uses it.

For each controller (memory, pids, cpu), beneath the group this server runs in:

    <server's group>/<parent>/         all local jobs of this state dir: a memory limit (the
                                       jobs' share of the machine), a CPU weight and quota
    <server's group>/<parent>/<job>/   one job: memory with swap off, processes, CPU weight and
                                       quota; made by its supervisor before the sandbox starts,
                                       removed when the job ends

cgroup v1 hierarchies are used where a controller is mounted as v1 (these machines mount
`memory`, `cpu` and `pids` that way), the v2 hierarchy where the controller lives there. The
parent is made by whichever supervisor needs it first and removed by the last one to leave it
(rmdir fails while another job's group is inside), so nothing stays behind after the jobs.

On cgroup v2 a group may hand a controller to its children only while it holds no processes
itself (the root excepted), and the server's own group holds the server. So there the parent
goes beside the server's group, in the group above it, which must be delegated to the server
(writable) and hold no processes: systemd's `Delegate=yes` with `DelegateSubgroup=server`, or
a container whose entrypoint moves itself into a subgroup. A server in the root group keeps
the parent beneath it. (Tested against fake files only: this machine's controllers are v1.)
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any

CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "blkio")
# cgroup v1 controllers used where they are mounted and never a gap when absent: `cpuacct`
# counts the CPU time a job used (v2 counts it in `cpu.stat`), `blkio` throttles the job's I/O
# on its own disk (best effort: a host without it runs the job unthrottled).
OPTIONAL_V1 = frozenset({"cpuacct", "blkio"})
V1_SHARES_PER_WEIGHT = 1024 / 100  # v1 cpu.shares 1024 == v2 cpu.weight 100 (the defaults)
CPU_PERIOD_US = 100_000


class CgroupError(Exception):
    """A control group could not be made, limited or removed (the message says which)."""

    def __init__(self, message: str, errno_: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno_

    @property
    def vanished(self) -> bool:
        """The group (or its parent) was removed under us: trying again may work."""
        return self.errno in (errno.ENOENT, errno.ENODEV)


@dataclass(frozen=True)
class Placement:
    """Where one controller's groups of local jobs live: `parent` is the jobs' parent group."""

    controller: str
    version: int
    parent: str

    def job(self, name: str) -> str:
        return os.path.join(self.parent, name)


@dataclass(frozen=True)
class GroupLimits:
    """Limits of one group. None: not limited by this group."""

    memory_bytes: int | None = None
    processes: int | None = None
    cpus: float | None = None  # CPU quota, in CPUs
    cpu_weight: int = 100  # v2 units (1..10000; 100 is the default)


def find_placements(parent_name: str) -> tuple[list[Placement], dict[str, str]]:
    """Where each controller's jobs' parent group `parent_name` goes, beneath this process's own
    group, and for the controllers that cannot have one here, why not. Makes nothing."""
    mounts = _cgroup_mounts()
    own = _own_groups()
    placements: list[Placement] = []
    missing: dict[str, str] = {}
    v2 = mounts.get("")
    v2_available = _read_words(os.path.join(v2[0], "cgroup.controllers")) if v2 else set()
    for controller in CONTROLLERS:
        if controller in OPTIONAL_V1 and controller not in mounts:
            continue  # v1 only: on v2 the cpu controller counts the CPU time itself
        if controller in mounts:
            mountpoint, root = mounts[controller]
            group = _inside(mountpoint, root, own.get(controller))
            if group is None:
                missing[controller] = f"this process's {controller} group is not visible here"
                continue
            placements.append(Placement(controller, 1, os.path.join(group, parent_name)))
        elif v2 is not None and controller in v2_available:
            group = _inside(v2[0], v2[1], own.get(""))
            if group is None:
                missing[controller] = "this process's cgroup v2 group is not visible here"
                continue
            # Beside the server's group (see the module's docstring), unless it is the root.
            root = os.path.normpath(group) == os.path.normpath(v2[0])
            above = group if root else os.path.dirname(os.path.normpath(group))
            placements.append(Placement(controller, 2, os.path.join(above, parent_name)))
        else:
            missing[controller] = f"no {controller} controller is mounted (cgroup v1 or v2)"
    return placements, missing


def check_placement(placement: Placement, probe_name: str) -> str | None:
    """None when a job group can be made, limited and removed here; else the reason."""
    # A parent of its own: the real one may hold running jobs whose limits must stay.
    parent = os.path.join(os.path.dirname(placement.parent), probe_name)
    probe = JobGroups([Placement(placement.controller, placement.version, parent)], "probe")
    try:
        probe.create(GroupLimits(), _PROBE_LIMITS)
    except CgroupError as exc:
        return str(exc)
    finally:
        probe.remove(timeout_s=2.0)
    return None


_PROBE_LIMITS = GroupLimits(memory_bytes=256 << 20, processes=64, cpus=1.0)


class JobGroups:
    """One job's groups, one per placement (controller)."""

    def __init__(self, placements: list[Placement], name: str) -> None:
        self.placements = placements
        self.name = name

    @classmethod
    def from_spec(cls, spec: list[dict[str, Any]], name: str) -> JobGroups:
        return cls([Placement(**item) for item in spec], name)

    def spec(self) -> list[dict[str, Any]]:
        return [asdict(p) for p in self.placements]

    @property
    def controllers(self) -> set[str]:
        return {p.controller for p in self.placements}

    def create(self, parent: GroupLimits, job: GroupLimits) -> None:
        """Make the parent (if absent) and the job's group in every placement, with limits.
        Raises CgroupError naming the file that refused."""
        for placement in self.placements:
            folder = placement.job(self.name)
            for attempt in range(20):
                try:
                    _ensure_parent(placement, parent)
                    os.mkdir(folder, 0o755)
                    break
                except FileExistsError:
                    break  # a retried start of the same job: reuse its group
                except OSError as exc:
                    error = CgroupError(f"cannot make {folder}: {exc}", exc.errno)
                    if not error.vanished or attempt == 19:
                        raise error from None
                except CgroupError as error:
                    if not error.vanished or attempt == 19:
                        raise
                # The last job in the parent removed it while we were making it: again.
                time.sleep(0.002 * (attempt + 1))
            _write_limits(placement, placement.job(self.name), job, swap_off=True)

    def join(self, pid: int) -> None:
        """Move `pid` into every group of the job. Called in the forked child before exec (so
        everything it starts is inside from its first instruction): plain system calls only."""
        data = str(pid).encode()
        for placement in self.placements:
            fd = os.open(os.path.join(placement.job(self.name), "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    def exist(self) -> bool:
        return any(os.path.isdir(p.job(self.name)) for p in self.placements)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for placement in self.placements:
            found |= _read_pids(placement.job(self.name))
        return found

    def usage(self) -> dict[str, int]:
        """What the job used, read from its groups (before they are removed)."""
        out: dict[str, int] = {}
        for placement in self.placements:
            folder = placement.job(self.name)
            if placement.controller == "memory":
                v1 = placement.version == 1
                peak = _read_int(folder, "memory.max_usage_in_bytes" if v1 else "memory.peak")
                if peak is not None:
                    out["memory_peak_bytes"] = peak
                events = _read_keyed(folder, "memory.oom_control" if v1 else "memory.events")
                out["oom_kills"] = events.get("oom_kill", 0)
                limit = _read_int(folder, "memory.limit_in_bytes" if v1 else "memory.max")
                if limit is not None:
                    out["memory_limit_bytes"] = limit
            elif placement.controller == "pids":
                peak = _read_int(folder, "pids.peak")
                if peak is not None:
                    out["processes_peak"] = peak
                out["fork_refusals"] = _read_keyed(folder, "pids.events").get("max", 0)
            elif placement.controller == "cpu" and placement.version == 2:
                usec = _read_keyed(folder, "cpu.stat").get("usage_usec")
                if usec is not None:
                    out["cpu_usec"] = usec
            elif placement.controller == "cpuacct":
                nsec = _read_int(folder, "cpuacct.usage")
                if nsec is not None:
                    out["cpu_usec"] = nsec // 1000
        return out

    def cpu_used_s(self) -> float | None:
        """The CPU time the job's processes have used, in seconds (None: no group counts it)."""
        for placement in self.placements:
            folder = placement.job(self.name)
            if placement.controller == "cpuacct" and placement.version == 1:
                used = _read_int(folder, "cpuacct.usage")
                if used is not None:
                    return used / 1e9
            elif placement.controller == "cpu" and placement.version == 2:
                usec = _read_keyed(folder, "cpu.stat").get("usage_usec")
                if usec is not None:
                    return usec / 1e6
        return None

    def throttle_disk(self, device: int, bytes_per_s: int, iops: int) -> bool:
        """Hold the job's reads and writes on `device` (a st_rdev: its loop device) to
        `bytes_per_s` and `iops` each way, where a v1 blkio group of the job's is. False: no
        such group (nothing is held). Raises CgroupError."""
        held = False
        rule = f"{os.major(device)}:{os.minor(device)}"
        for placement in self.placements:
            if placement.controller != "blkio" or placement.version != 1:
                continue
            folder = placement.job(self.name)
            for way in ("read", "write"):
                _write(folder, f"blkio.throttle.{way}_bps_device", f"{rule} {bytes_per_s}")
                _write(folder, f"blkio.throttle.{way}_iops_device", f"{rule} {iops}")
            held = True
        return held

    def set_cpu_weight(self, weight: int) -> None:
        """Change the job's CPU weight (v2 units) while it runs. Raises CgroupError."""
        for placement in self.placements:
            if placement.controller != "cpu":
                continue
            folder = placement.job(self.name)
            if placement.version == 1:
                _write(folder, "cpu.shares", str(round(weight * V1_SHARES_PER_WEIGHT)))
            else:
                _write(folder, "cpu.weight", str(weight))

    def remove(self, timeout_s: float = 10.0) -> list[str]:
        """Kill whatever is left in the job's groups, remove them, and remove the parent when
        no other job is in it. Returns what could not be removed (empty when all went)."""
        deadline = time.monotonic() + timeout_s
        left: list[str] = []
        for placement in self.placements:
            folder = placement.job(self.name)
            while os.path.isdir(folder):
                for pid in _read_pids(folder):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                try:
                    os.rmdir(folder)
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY) or (
                        time.monotonic() > deadline
                    ):
                        left.append(f"{folder}: {exc.strerror}")
                        break
                    time.sleep(0.01)
            try:
                os.rmdir(placement.parent)
            except OSError:
                pass  # another job's group is inside (EBUSY), or it is gone already
        return left


# -- limits ----------------------------------------------------------------------------------------


def _ensure_parent(placement: Placement, limits: GroupLimits) -> None:
    if placement.version == 2:
        # A v2 group may use a controller only when its parent enables it for its children;
        # the kernel refuses that for a group holding processes (other than the root).
        above = os.path.dirname(placement.parent)
        if placement.controller not in _read_words(os.path.join(above, "cgroup.subtree_control")):
            try:
                _write(above, "cgroup.subtree_control", f"+{placement.controller}")
            except CgroupError as exc:
                raise CgroupError(
                    f"{exc} (cgroup v2 enables a controller only in a group without "
                    "processes: run the server in a subgroup of a group delegated to it, e.g. "
                    "systemd's Delegate=yes with DelegateSubgroup=server; the jobs' groups go "
                    "beside the server's)"
                ) from None
    try:
        os.mkdir(placement.parent, 0o755)
    except FileExistsError:
        pass
    except OSError as exc:
        raise CgroupError(f"cannot make {placement.parent}: {exc}", exc.errno) from None
    if placement.version == 2:
        # Children of the parent may only use controllers enabled in its subtree_control.
        _write(placement.parent, "cgroup.subtree_control", f"+{placement.controller}")
    _write_limits(placement, placement.parent, limits, swap_off=False)


def _write_limits(placement: Placement, folder: str, limits: GroupLimits, swap_off: bool) -> None:
    v1 = placement.version == 1
    if placement.controller == "memory" and limits.memory_bytes is not None:
        value = str(limits.memory_bytes)
        if v1:
            _set_v1_memory(folder, value, swap_off)
        else:
            _write(folder, "memory.max", value)
            if swap_off:
                _write_optional(folder, "memory.swap.max", "0")
    elif placement.controller == "pids" and limits.processes is not None:
        _write(folder, "pids.max", str(limits.processes))
    elif placement.controller == "cpu":
        if v1:
            _write(folder, "cpu.shares", str(round(limits.cpu_weight * V1_SHARES_PER_WEIGHT)))
            period = _read_int(folder, "cpu.cfs_period_us") or CPU_PERIOD_US
            quota = -1 if limits.cpus is None else max(1000, round(limits.cpus * period))
            _write(folder, "cpu.cfs_quota_us", str(quota))
        else:
            _write(folder, "cpu.weight", str(limits.cpu_weight))
            quota_text = "max" if limits.cpus is None else str(round(limits.cpus * CPU_PERIOD_US))
            _write(folder, "cpu.max", f"{quota_text} {CPU_PERIOD_US}")


def _set_v1_memory(folder: str, value: str, swap_off: bool) -> None:
    """memory.limit_in_bytes and, with swap off, memory.memsw.limit_in_bytes (memory + swap)
    to the same value. memsw may never be below the limit, so the order depends on whether the
    limit goes up or down: try one order, then the other."""
    if _read(folder, "memory.limit_in_bytes") == value:
        if not swap_off or _read(folder, "memory.memsw.limit_in_bytes") in (value, None):
            return
    memsw = os.path.exists(os.path.join(folder, "memory.memsw.limit_in_bytes")) and swap_off
    order = ["memory.limit_in_bytes"] + (["memory.memsw.limit_in_bytes"] if memsw else [])
    try:
        for name in order:
            _write(folder, name, value)
    except CgroupError:
        for name in reversed(order):
            _write(folder, name, value)
    if swap_off:
        _write_optional(folder, "memory.swappiness", "0")


# -- files -----------------------------------------------------------------------------------------


def _write(folder: str, name: str, value: str) -> None:
    try:
        with open(os.path.join(folder, name), "w") as fh:
            fh.write(value)
    except OSError as exc:
        raise CgroupError(
            f"cannot write {value!r} to {folder}/{name}: {exc.strerror}", exc.errno
        ) from None


def _write_optional(folder: str, name: str, value: str) -> None:
    """A file some kernels lack (swap accounting off): absent is fine, refused is not."""
    if os.path.exists(os.path.join(folder, name)):
        _write(folder, name, value)


def _read(folder: str, name: str) -> str | None:
    try:
        with open(os.path.join(folder, name)) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _read_int(folder: str, name: str) -> int | None:
    text = _read(folder, name)
    if text is None or not text.isdigit():
        return None
    return int(text)


def _read_keyed(folder: str, name: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (_read(folder, name) or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def _read_pids(folder: str) -> set[int]:
    return {int(x) for x in (_read(folder, "cgroup.procs") or "").split() if x.isdigit()}


def _read_words(path: str) -> set[str]:
    try:
        with open(path) as fh:
            return set(fh.read().split())
    except OSError:
        return set()


# -- where this process's groups are -------------------------------------------------------------


def _cgroup_mounts() -> dict[str, tuple[str, str]]:
    """controller -> (mount point, root within the hierarchy) of cgroup v1 mounts, and "" ->
    the cgroup2 mount, from /proc/self/mountinfo."""
    mounts: dict[str, tuple[str, str]] = {}
    try:
        with open("/proc/self/mountinfo") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return mounts
    for line in lines:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mountpoint = _unescape(fields[3]), _unescape(fields[4])
        fstype, options = tail[0], tail[2].split(",")
        if fstype == "cgroup2":
            mounts.setdefault("", (mountpoint, root))
        elif fstype == "cgroup":
            for controller in CONTROLLERS:
                if controller in options:
                    mounts.setdefault(controller, (mountpoint, root))
    return mounts


def _own_groups() -> dict[str, str]:
    """controller -> this process's group path in that controller's hierarchy ("" for v2)."""
    groups: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return groups
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path
    return groups


def _inside(mountpoint: str, root: str, path: str | None) -> str | None:
    """The folder of group `path` in a hierarchy mounted at `mountpoint` with `root`."""
    if path is None:
        return None
    if root != "/" and not (path == root or path.startswith(root + "/")):
        return None
    relative = path[len(root) :] if root != "/" else path
    folder = os.path.join(mountpoint, relative.lstrip("/"))
    return folder if os.path.isdir(folder) else None


def _unescape(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text
