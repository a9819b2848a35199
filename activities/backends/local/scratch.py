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
import fcntl
import os
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


def claim_host_disk(folder: Path, disk_bytes: int, reserve_bytes: int, image: bool) -> None:
    """Let job `folder` start only if the host can hold its disk: the free space where the jobs
    live, less what the other jobs' images may still grow into (their size less what they
    already take), must hold `disk_bytes` and `reserve_bytes` more. With `image`, make the
    job's sparse image, under the same lock as the check, so that two jobs starting together
    each count the other's. Raises HostDiskError (the job must not start)."""
    jobs = folder.parent
    # The lock: flock on the jobs folder itself (no file of its own among the job folders).
    lock = os.open(jobs, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the descriptor closes
        st = os.statvfs(jobs)
        free = st.f_bavail * st.f_frsize
        promised = sum(_growth(other / IMAGE) for other in jobs.iterdir() if other != folder)
        if free - promised < disk_bytes + reserve_bytes:
            raise HostDiskError(
                f"not started: the host's disk cannot hold this job's disk of "
                f"{describe_bytes(disk_bytes)} (/data, /tmp and its packages) beside the "
                f"host's reserve of {describe_bytes(reserve_bytes)}: {describe_bytes(free)} is "
                f"free, {describe_bytes(promised)} of it held for other running jobs' disks; "
                "try again when other jobs have ended"
            )
        if image:
            with open(folder / IMAGE, "wb") as fh:
                fh.truncate(disk_bytes)
            os.chmod(folder / IMAGE, 0o600)
    finally:
        os.close(lock)


def _growth(image: Path) -> int:
    """How much more host disk a job's sparse image may take (0: none, or no image)."""
    try:
        st = os.lstat(image)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    return max(0, st.st_size - st.st_blocks * 512)


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
    (folder / SHM).mkdir(exist_ok=True)
    shm_options = f"size={shm_bytes},nr_inodes={files},mode=1777,nosuid,nodev"
    _run([tools.mount, "-n", "-t", "tmpfs", "-o", shm_options, "posttrain-shm", str(folder / SHM)])
    lost = folder / FS / "lost+found"
    if lost.is_dir():
        lost.rmdir()  # one inode back; nothing of the job is ever "found" there


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
