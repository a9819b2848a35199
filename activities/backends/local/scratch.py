"""A local job's writable filesystems (DESIGN §10: disk by a filesystem, not by counting).

Standard library only: the job's supervisor uses it.

    <job>/fs.img   an ext4 image of the job's disk size and file count (sparse: it takes host
                   disk only as the job writes, never more than its size)
    <job>/fs/      the image, loop-mounted: data/ (/data), tmp/ (/tmp), env/ (the venv)
    <job>/shm/     a tmpfs (/dev/shm) of at most half the job's memory and its file count; its
                   pages are memory, charged to the job's memory group

A filesystem is full whoever holds its blocks, so files the job unlinked but keeps open count,
and a job past a limit gets ENOSPC. Both are mounted in the supervisor's own mount namespace
(`enter_private_mount_namespace`): nobody else sees them, and they vanish with the supervisor
and the job's processes even when the supervisor is killed (the loop device is freed with its
last mount). Without root (or without mkfs.ext4 and loop devices) the folders are plain
folders on the host and the supervisor measures them instead (docs/backends.md, "Local backend").

Each image is sparse, so it takes host disk only as its job writes: jobs that each fit could
together fill the host. `claim_host_disk` lets a job start only when the host's free space, less
what the other running jobs' images may still grow into, holds its whole disk and a reserve.

Removing a tree never recurses on its depth: `remove_tree` moves every folder it meets up to
the top before emptying it.
"""

from __future__ import annotations

import ctypes
import datetime
import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

IMAGE = "fs.img"
FS = "fs"
SHM = "shm"
SUBFOLDERS = ("data", "tmp", "env")
TOOL_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
# The ext4 filesystem of a job: 4 KiB blocks; no blocks reserved for root; no journal (scratch
# data of one job, thrown away after it: crash consistency buys nothing); inode tables and the
# journal are not zeroed up front (the image is sparse, so they read as zeros already).
MKFS_OPTIONS = ("-F", "-q", "-b", "4096", "-m", "0", "-I", "256", "-O", "^has_journal")
MKFS_EXTENDED = "lazy_itable_init=1,nodiscard"
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime,noinit_itable"
# Less than this free (blocks or inodes) counts as "full": the job will have met ENOSPC.
FULL_BYTES = 1 << 20
FULL_FILES = 16

CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_PRIVATE = 0x40000


class ScratchError(Exception):
    """A job filesystem could not be made, mounted or removed (the message says which)."""


class HostDiskError(ScratchError):
    """The host's disk cannot hold this job's disk beside the other running jobs' and the
    reserve: the job does not start. The message names the figures, never a host path."""


@dataclass(frozen=True)
class Tools:
    mkfs: str
    mount: str
    umount: str


def find_tools() -> Tools | None:
    """mkfs.ext4, mount and umount, or None when one is missing."""
    found = [_which(name) for name in ("mkfs.ext4", "mount", "umount")]
    if any(path is None for path in found):
        return None
    mkfs, mount, umount = (str(path) for path in found)
    return Tools(mkfs=mkfs, mount=mount, umount=umount)


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join(TOOL_DIRS))


def enter_private_mount_namespace() -> None:
    """Give this process a mount namespace of its own whose mounts never propagate back to the
    host's (what `unshare --mount --propagation private` does)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise ScratchError(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise ScratchError(f"making / private: {os.strerror(ctypes.get_errno())}")


def claim_host_disk(
    folder: Path,
    disk_bytes: int,
    reserve_bytes: int,
    image: bool,
    artifact_bytes: int = 0,
    holders: Retention | None = None,
) -> None:
    """Let job `folder` start only if the host can hold all it may take: its disk, and for an
    agent job the copy of its artifact (`artifact_bytes`, what it may keep) made when it ends.
    The free space where the jobs live, less what the other running jobs may still take (their
    images' growth and their artifacts to come), must hold those and `reserve_bytes` more.
    With `image`, make the job's sparse image, under the same lock as the check, so that two
    jobs starting together each count the other's. Raises HostDiskError (the job must not
    start), saying what holds the space (`holders`: where ended episodes' records are, to tell
    their artifacts, kept for retention, from live episodes')."""
    jobs = folder.parent
    # The lock: flock on the jobs folder itself (no file of its own among the job folders).
    lock = os.open(jobs, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the descriptor closes
        st = os.statvfs(jobs)
        free = st.f_bavail * st.f_frsize
        promised = sum(_promised(other) for other in jobs.iterdir() if other != folder)
        needed = disk_bytes + artifact_bytes
        if free - promised < needed + reserve_bytes:
            held = describe_holders(jobs, folder, promised, holders)
            artifact = (
                f" and its artifact of up to {describe_bytes(artifact_bytes)}"
                if artifact_bytes
                else ""
            )
            raise HostDiskError(
                f"not started: the host's disk cannot hold this job's disk of "
                f"{describe_bytes(disk_bytes)} (/data, /tmp and its packages){artifact} beside "
                f"the host's reserve of {describe_bytes(reserve_bytes)}: "
                f"{describe_bytes(free)} is free; {held}"
            )
        if image:
            with open(folder / IMAGE, "wb") as fh:
                fh.truncate(disk_bytes)
            os.chmod(folder / IMAGE, 0o600)
    finally:
        os.close(lock)


def _promised(job: Path) -> int:
    """What a running job (one with an image) may still take of the host's disk: its image's
    growth, and for an agent job its artifact to come (what it may keep)."""
    growth = _growth(job / IMAGE)
    if not os.path.lexists(job / IMAGE):
        return 0
    try:
        spec = json.loads((job / "job.json").read_text())
    except (OSError, ValueError):
        return growth
    if spec.get("role") != "agent" or os.path.lexists(job / "artifact"):
        return growth
    watch = spec.get("watch") or {}
    cap = int(watch.get("artifact_cap_bytes") or 0)
    left = watch.get("storage_bytes")
    return growth + (cap if left is None else min(cap, int(left)))


def _growth(image: Path) -> int:
    """How much more host disk a job's sparse image may take (0: none, or no image)."""
    try:
        st = os.lstat(image)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    return max(0, st.st_size - st.st_blocks * 512)


@dataclass(frozen=True)
class Retention:
    """Where the records of ended episodes are (`<audit dir>/<episode_id>.json`, each with its
    `ended_at`) and how long an ended episode's job folders are kept (days; None: forever)."""

    audit_dir: str
    job_days: float | None


_EPISODE_OF_KEY = re.compile(r"episode-(?P<episode>[A-Za-z0-9_-]{1,100})/job/[0-9]{1,9}")


@dataclass(frozen=True)
class Holders:
    """What holds the host's disk beside the free space: running jobs (what they may still
    take), and the artifacts of live episodes and of ended ones kept for retention (allocated
    bytes, by episode count), and when the first of those is due for deletion."""

    running_jobs: int
    promised_bytes: int
    live_bytes: int
    live_episodes: int
    kept_bytes: int
    kept_episodes: int
    first_due: datetime.datetime | None


def holders(jobs: Path, retention: Retention | None, exclude: Path | None = None) -> Holders:
    """Walks every job folder of `jobs` (but `exclude`): for a refusal and for the metric."""
    running = promised = 0
    live: dict[str, int] = {}
    kept: dict[str, int] = {}
    due: list[datetime.datetime] = []
    for other in jobs.iterdir() if jobs.is_dir() else []:
        if other == exclude:
            continue
        if (other / IMAGE).exists():
            running += 1
            promised += _promised(other)
        artifact = other / "artifact"
        if not artifact.is_dir() or artifact.is_symlink():
            continue
        size = allocated_bytes(artifact)
        episode = _episode_of(other) or other.name
        ended = _ended_at(retention, episode)
        if ended is None:
            live[episode] = live.get(episode, 0) + size
            continue
        kept[episode] = kept.get(episode, 0) + size
        if retention is not None and retention.job_days is not None:
            due.append(ended + datetime.timedelta(days=retention.job_days))
    return Holders(
        running_jobs=running,
        promised_bytes=promised,
        live_bytes=sum(live.values()),
        live_episodes=len(live),
        kept_bytes=sum(kept.values()),
        kept_episodes=len(kept),
        first_due=min(due) if due else None,
    )


def describe_holders(jobs: Path, folder: Path, promised: int, retention: Retention | None) -> str:
    """What holds the host's disk, for a refusal: running jobs, artifacts of live episodes,
    artifacts kept for retention (and when the first of those frees)."""
    held = holders(jobs, retention, exclude=folder)
    parts = [
        f"{describe_bytes(promised)} may still be taken by {held.running_jobs} running job(s)",
        f"{describe_bytes(held.live_bytes)} is held by the artifacts of {held.live_episodes} "
        "live episode(s) (freed by retention once they end)",
    ]
    retained = (
        f"{describe_bytes(held.kept_bytes)} by the artifacts of {held.kept_episodes} ended "
        "episode(s) kept for retention"
    )
    if held.first_due is not None:
        first = held.first_due.strftime("%Y-%m-%d %H:%M UTC")
        retained += f" (the first is due for deletion at {first}, by the hourly retention run)"
    elif held.kept_episodes:
        retained += " (kept forever: POSTTRAIN_JOB_RETENTION_DAYS is 0)"
    parts.append(retained)
    return "; ".join(parts) + "; try again when jobs have ended or retention has run"


def allocated_bytes(root: Path) -> int:
    """Host disk a folder's files take (allocated blocks, never following links)."""
    total = 0
    todo = [str(root)]
    while todo:
        current = todo.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    st = entry.stat(follow_symlinks=False)
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        todo.append(entry.path)
        except OSError:
            continue
    return total


def _episode_of(job: Path) -> str | None:
    try:
        spec = json.loads((job / "job.json").read_text())
    except (OSError, ValueError):
        return None
    found = _EPISODE_OF_KEY.fullmatch(str(spec.get("key", "")))
    return found["episode"] if found else None


def _ended_at(retention: Retention | None, episode: str) -> datetime.datetime | None:
    """When `episode` ended, from its audit record; None: no record (it is live)."""
    if retention is None:
        return None
    try:
        record = json.loads((Path(retention.audit_dir) / f"{episode}.json").read_text())
        ended = datetime.datetime.fromisoformat(str(record["ended_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return ended if ended.tzinfo else ended.replace(tzinfo=datetime.UTC)


def describe_bytes(size: int) -> str:
    """`8.0 GiB`, `512 MiB`: sizes as messages give them."""
    gib, mib = 1 << 30, 1 << 20
    if size >= gib:
        return f"{size / gib:.1f} GiB"
    return f"{size // mib} MiB" if size >= mib else f"{size} bytes"


def mount_job_filesystems(
    folder: Path, tools: Tools, disk_bytes: int, files: int, shm_bytes: int
) -> None:
    """Make (unless claim_host_disk made it) and mount `<folder>/fs` (ext4 image) and
    `<folder>/shm` (tmpfs). Call after enter_private_mount_namespace."""
    image = folder / IMAGE
    if not image.exists():
        with open(image, "wb") as fh:
            fh.truncate(disk_bytes)
        os.chmod(image, 0o600)
    _run([tools.mkfs, *MKFS_OPTIONS, "-N", str(files), "-E", MKFS_EXTENDED, str(image)], "mkfs")
    (folder / FS).mkdir(exist_ok=True)
    _run([tools.mount, "-n", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(folder / FS)])
    direct_io(folder / FS)
    (folder / SHM).mkdir(exist_ok=True)
    shm_options = f"size={shm_bytes},nr_inodes={files},mode=1777,nosuid,nodev"
    _run([tools.mount, "-n", "-t", "tmpfs", "-o", shm_options, "posttrain-shm", str(folder / SHM)])
    lost = folder / FS / "lost+found"
    if lost.is_dir():
        lost.rmdir()  # one inode back; nothing of the job is ever "found" there


def direct_io(mountpoint: Path) -> bool:
    """Have the loop device under `mountpoint` read and write its image with direct I/O: the
    job's writes then reach the host's disk through no page cache of the host's, so they never
    pile up there as dirty pages that another job's or Temporal's fsync must wait behind (the
    host file system commits its journal with the data of every file it has pending), and its
    reads never evict the host's cache. Best effort: False where losetup is missing or the
    device refuses (the job runs buffered, as before)."""
    losetup = _which("losetup")
    device = _mount_source(mountpoint)
    if losetup is None or device is None or not device.startswith("/dev/loop"):
        return False
    done = subprocess.run(
        [losetup, "--direct-io=on", device], capture_output=True, stdin=subprocess.DEVNULL
    )
    return done.returncode == 0


def disk_device(mountpoint: Path) -> int | None:
    """The device number (st_rdev) of the loop device mounted at `mountpoint`; None when it is
    not a loop device."""
    device = _mount_source(mountpoint)
    if device is None or not device.startswith("/dev/loop"):
        return None
    try:
        return os.stat(device).st_rdev
    except OSError:
        return None


def _mount_source(mountpoint: Path) -> str | None:
    """The device mounted at `mountpoint` in this process's mount namespace."""
    target = os.path.realpath(mountpoint)
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):  # the last mount on a path is the one seen there
        fields = line.split()
        if len(fields) > 1 and fields[1].replace("\\040", " ") == target:
            return fields[0]
    return None


def unmount_job_filesystems(folder: Path, tools: Tools) -> list[str]:
    """Unmount both (lazily if something still holds them) and delete the image. Returns what
    could not be done."""
    problems: list[str] = []
    for name in (SHM, FS):
        target = folder / name
        if not os.path.ismount(target):
            continue
        done = subprocess.run([tools.umount, "-n", str(target)], capture_output=True)
        if done.returncode != 0:
            lazy = subprocess.run([tools.umount, "-n", "-l", str(target)], capture_output=True)
            if lazy.returncode != 0:
                problems.append(f"umount {target}: {lazy.stderr.decode(errors='replace')}")
    try:
        (folder / IMAGE).unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        problems.append(f"removing {folder / IMAGE}: {exc}")
    return problems


def _run(argv: list[str], what: str = "mount") -> None:
    done = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).decode(errors="replace").strip()[:500]
        raise ScratchError(f"{what} failed ({' '.join(argv[:1])}): {detail}")


def prepare_folders(fs: Path, data_owner: int | None) -> None:
    """The job's folders on its filesystem: data/ (root's, or an evaluator's own), tmp/
    (sticky, everyone's, as /tmp is), env/ (the venv, written by the install phase)."""
    for name in SUBFOLDERS:
        (fs / name).mkdir(exist_ok=True)
    os.chmod(fs, 0o755)
    os.chmod(fs / "data", 0o755)
    os.chmod(fs / "env", 0o755)
    os.chmod(fs / "tmp", 0o1777)
    if data_owner is not None:
        os.chown(fs / "data", data_owner, data_owner)


@dataclass(frozen=True)
class Fullness:
    """How close a filesystem is to its limits."""

    free_bytes: int
    free_files: int

    @property
    def out_of_space(self) -> bool:
        return self.free_bytes < FULL_BYTES

    @property
    def out_of_files(self) -> bool:
        return self.free_files < FULL_FILES


def fullness(path: Path) -> Fullness | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return Fullness(free_bytes=st.f_bavail * st.f_frsize, free_files=st.f_favail)


# -- removing a tree of any depth ------------------------------------------------------------------


def remove_tree(root: Path) -> None:
    """Remove `root` and everything under it, never following links, with no recursion and no
    path longer than `root`'s plus two names, however deep the tree (a job may build one 1,500
    folders deep; shutil.rmtree recurses, and paths that long exceed PATH_MAX).

    Each folder met below the first level is first moved up to be a direct child of `root`
    (a rename within one filesystem costs nothing), then emptied. Folders made unwritable by a
    job sharing our uid are made writable again. Raises OSError only for what cannot be removed.
    """
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(root)
        return
    pending = [str(root)]
    moved = 0
    while pending:
        folder = pending.pop()
        _make_writable(folder)
        with os.scandir(folder) as entries:
            children = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
        for name, is_dir in children:
            path = os.path.join(folder, name)
            if not is_dir:
                os.unlink(path)
            elif folder == str(root):
                pending.append(path)
            else:
                while True:
                    target = os.path.join(str(root), f".remove-{moved}")
                    moved += 1
                    if not os.path.lexists(target):
                        break
                _make_writable(path)  # moving a folder rewrites its `..`
                os.rename(path, target)  # never onto an existing name: checked just above
                pending.append(target)
        if folder != str(root):
            os.rmdir(folder)
    os.rmdir(root)


def _make_writable(folder: str) -> None:
    try:
        mode = stat.S_IMODE(os.lstat(folder).st_mode)
        if mode & 0o700 != 0o700:
            os.chmod(folder, mode | 0o700)
    except OSError:
        pass


# -- the backend's start-up probe: `python -m activities.backends.local.scratch <empty folder>`
# ------------


def probe(folder: Path) -> None:
    """Do what a supervisor does with a small filesystem: make it, mount it, write to it, and
    remove it. Raises ScratchError or OSError when any step fails here."""
    tools = find_tools()
    if tools is None:
        raise ScratchError("mkfs.ext4, mount or umount is not installed")
    enter_private_mount_namespace()
    mount_job_filesystems(folder, tools, disk_bytes=8 << 20, files=64, shm_bytes=1 << 20)
    try:
        prepare_folders(folder / FS, None)
        (folder / FS / "data" / "probe").write_bytes(b"x" * 4096)
        (folder / SHM / "probe").write_bytes(b"x" * 4096)
        if fullness(folder / FS) is None:
            raise ScratchError("statvfs of the mounted filesystem failed")
    finally:
        problems = unmount_job_filesystems(folder, tools)
    if problems:
        raise ScratchError("; ".join(problems))


if __name__ == "__main__":
    import sys

    try:
        probe(Path(sys.argv[1]))
    except (ScratchError, OSError) as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
