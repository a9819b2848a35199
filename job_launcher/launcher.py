#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = []
# ///
"""posttrain_env job launcher: the one script every agent job runs (DESIGN §6 item 4, §9).

Standard library only, Python >= 3.10, Linux. `job_launcher.builder.build_launcher` fills in the
two `_EMBEDDED_*` constants below (base64, never verbatim: a `# /// script` block in the agent's
script must not become this file's own PEP 723 header) and the result is uploaded as the job's
script. Nothing secret is embedded: the per-job nonce arrives in the environment variable
POSTTRAIN_NONCE and is scrubbed from it before anything of the agent's runs.

    python3 launcher.py [--phase install|run|all]      (default: all)

install  Re-checks the package list with a strict pattern, creates a fresh venv and installs the
         packages from PyPI wheels only (`uv venv` + `uv pip install --only-binary :all:`, or
         `python -m venv` + `pip --isolated install --only-binary :all:` when uv is missing).
         Prints one trusted `installed` line with the exact versions, read from the venv's
         dist-info files (the venv's Python is never run before the sandbox is on).
run      The root supervisor forks a child that installs the seccomp filter, closes inherited fds,
         drops to the job's uid (or verifies it already runs unprivileged) and execs the script
         (an agent's, or a task's evaluator) with the venv's Python, an allow-listed environment
         (plus, for an evaluation, the variables `pass_env` names: its nonce, task parameters
         and a grader's seed) and cwd = data dir. With the loopback-only TCP policy
         (job_launcher/loopback.py, inlined below) a supervisor process serves the filter's
         connect, bind and listen; where the machine refuses what it needs, the filter allows
         AF_UNIX sockets only. The supervisor waits, kills every process left under the job's
         uid and only then prints the final trusted line; its exit code is the script's.
all      install, then run, in one process (Hugging Face Jobs).

Trusted lines (stdout, each on a fresh line): `POSTTRAIN_LAUNCHER <nonce> <json>` with
    {"stage": "installed", "packages": {"<name>": "<version>", ...}, "installer": "uv"|"pip"}
    {"stage": "sandbox", "loopback_tcp": true}                 the filter is on, the script starts
    {"stage": "sandbox", "loopback_tcp": false, "loopback_reason": "<why>"}  AF_UNIX only
    {"stage": "exit", "exit_code": N, "signal": S|null}                  the script ran; final line
    {"stage": "<stage>", "error": "<message>"}                        the script never ran; final
where the final line repeats the sandbox's `loopback_tcp` (and `loopback_reason`) once there was
one, so a log's tail says it too, and a failure's stage is one of config, packages, venv,
install, prepare, seccomp, fds, uid, exec, supervisor. Exit codes: the script's own (128 +
signal when killed), 125 when the script never ran, 2 when no nonce was given (then nothing
trusted can be printed at all).
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import errno
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable

# Inlined by job_launcher.builder (the job uploads one file); imported as it is in the package.
from job_launcher.loopback import (
    MSG_FASTOPEN,
    RET_USER_NOTIF,
    TCP_FASTOPEN_CONNECT,
    hand_over,
    install_listener_filter,
    loopback_support,
    start_supervisor,
)

# Filled in by the builder: base64 of the JSON configuration and of the agent's script.
_EMBEDDED_CONFIG = ""
_EMBEDDED_SCRIPT = ""

NONCE_ENV = "POSTTRAIN_NONCE"
LOOPBACK_ENV = "POSTTRAIN_LOOPBACK_TCP"
LAUNCHER_TAG = "POSTTRAIN_LAUNCHER"
NEVER_RAN_EXIT = 125
# Passed on to the job's process group (`supervise`).
FORWARDED_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
MAX_PACKAGES = 64

# Identical to job_launcher.requirements.STRICT_REQUIREMENT_PATTERN (a test asserts it): the
# builder only ever embeds strings of this form; re-checked here before anything is installed.
STRICT_REQUIREMENT_PATTERN = (
    r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?"  # canonical name
    r"(?:\[[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?(?:,[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?)*\])?"  # extras
    r"(?:(?:===|==|!=|<=|>=|~=|<|>)[A-Za-z0-9.*+!_-]+"  # first specifier
    r"(?:,(?:===|==|!=|<=|>=|~=|<|>)[A-Za-z0-9.*+!_-]+)*)?"  # more specifiers
    r"(?:; [A-Za-z0-9_.<>=!~ ()\"',*+-]+)?"  # environment marker
)
# Identical to job_launcher.requirements.EXCLUDE_NEWER_PATTERN (a test asserts it).
EXCLUDE_NEWER_PATTERN = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"(?:T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:Z|[+-][0-9]{2}:[0-9]{2}))?"
)
ENV_NAME_PATTERN = r"[A-Z_][A-Z0-9_]*"

# What the agent's script gets as its environment: these, plus the pass-through names below
# when the launcher itself has them. Nothing else of the launcher's environment (HF_TOKEN, the
# nonce, the broker's settings) ever reaches it.
FIXED_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "PYTHONUNBUFFERED": "1",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
}
PASS_THROUGH_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "LD_LIBRARY_PATH",
    "TZ",
    "OMP_NUM_THREADS",
)
# The installer's environment: enough to reach PyPI, nothing that configures indexes.
INSTALLER_ENV = (
    "PATH",
    "HOME",
    "TMPDIR",
    "UV_CACHE_DIR",
    "UV_LINK_MODE",  # the local backend copies from its shared cache (another mount)
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)


class StageError(Exception):
    """A launcher step failed; the agent's script must not run."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


# ---------------------------------------------------------------------------------------------
# Trusted output
# ---------------------------------------------------------------------------------------------


def trusted_line(nonce: str, payload: dict) -> str:
    # Same rendering as job_launcher.trusted_lines.format_trusted_line.
    return f"{LAUNCHER_TAG} {nonce} {json.dumps(payload, separators=(',', ':'), sort_keys=True)}"


def emit(nonce: str, payload: dict) -> None:
    """Write one trusted line on a fresh line of stdout (the script may have left a partial one)."""
    sys.stderr.flush()
    data = ("\n" + trusted_line(nonce, payload) + "\n").encode()
    sys.stdout.flush()
    while data:
        try:
            written = os.write(1, data)
        except InterruptedError:
            continue
        data = data[written:]


def read_nonce() -> str:
    """The nonce from the environment, scrubbed from it (os.environ and the C environment)."""
    nonce = os.environ.pop(NONCE_ENV, "")
    if hasattr(os, "unsetenv"):
        os.unsetenv(NONCE_ENV)
    return nonce


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


def load_config(config_b64: str = "", script_b64: str = "") -> tuple[dict, bytes]:
    config_b64 = config_b64 or _EMBEDDED_CONFIG
    script_b64 = script_b64 or _EMBEDDED_SCRIPT
    if not config_b64:
        raise StageError("config", "this launcher was not built (no embedded configuration)")
    try:
        config = json.loads(base64.b64decode(config_b64, validate=True))
        script = base64.b64decode(script_b64, validate=True)
    except ValueError as exc:
        raise StageError("config", f"the embedded configuration is corrupt: {exc}") from None
    if not isinstance(config, dict) or config.get("version") != 1:
        raise StageError("config", "unknown launcher configuration version")
    return config, script


def passed_env(config: dict, nonce: str) -> dict[str, str]:
    """What the configuration's `pass_env` names hold in this process's environment (the
    nonce, read and scrubbed already, by its value): an evaluation's own inputs, for its
    script. Agent jobs pass nothing."""
    names = config.get("pass_env") or []
    if not isinstance(names, list) or not all(
        isinstance(n, str) and re.fullmatch(ENV_NAME_PATTERN, n) for n in names
    ):
        raise StageError("config", "pass_env is not a list of variable names")
    passed = {}
    for name in names:
        value = nonce if name == NONCE_ENV else os.environ.get(name)
        if value is not None:
            passed[name] = value
    return passed


def check_packages(packages: object) -> list[str]:
    if not isinstance(packages, list):
        raise StageError("packages", "the package list is not a list")
    if len(packages) > MAX_PACKAGES:
        raise StageError("packages", f"{len(packages)} packages; the limit is {MAX_PACKAGES}")
    strict = re.compile(STRICT_REQUIREMENT_PATTERN)
    for p in packages:
        if not isinstance(p, str) or not strict.fullmatch(p):
            raise StageError("packages", f"refusing package {p!r}: not a plain PyPI requirement")
    return list(packages)


# ---------------------------------------------------------------------------------------------
# Install phase
# ---------------------------------------------------------------------------------------------


def venv_dir(config: dict, phase: str) -> str:
    path = config.get("venv_dir")
    if path:
        return str(path)
    if phase != "all":
        raise StageError("config", "--phase install/run needs a configured venv_dir")
    # A fresh private parent, then opened up for traversal by the job's uid.
    parent = tempfile.mkdtemp(prefix="posttrain-job-")
    os.chmod(parent, 0o755)
    return os.path.join(parent, "venv")


def find_uv(config: dict) -> str | None:
    configured = config.get("uv")
    if configured:
        return str(configured) if os.access(str(configured), os.X_OK) else None
    return shutil.which("uv")


def installer_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in INSTALLER_ENV if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    # pip reads /etc/pip.conf, /etc/xdg/pip/pip.conf and site configs even with --isolated;
    # os.devnull here is pip's documented switch for "no configuration files at all".
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["UV_NO_CONFIG"] = "1"
    return env


def source_args(config: dict) -> list[str]:
    """Backend-only package sources (tests use a local find-links folder and no index)."""
    args: list[str] = []
    if config.get("no_index"):
        args.append("--no-index")
    elif config.get("index_url"):  # a mirror that replaces PyPI
        args += ["--index-url", str(config["index_url"])]
    for folder in config.get("find_links") or []:
        args += ["--find-links", str(folder)]
    return args


def run_installer(cmd: list[str], stage: str, env: dict[str, str]) -> None:
    try:
        proc = subprocess.run(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=3600,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StageError(stage, f"{cmd[0]} could not run: {exc}") from None
    output = proc.stdout.decode(errors="replace")
    if output:
        sys.stdout.write(output if output.endswith("\n") else output + "\n")
        sys.stdout.flush()
    if proc.returncode != 0:
        tail = " | ".join(line.strip() for line in output.strip().splitlines()[-6:])
        raise StageError(stage, f"{os.path.basename(cmd[0])} exited {proc.returncode}: {tail}")


def install(config: dict, packages: list[str], venv: str) -> tuple[dict[str, str], str]:
    """Create a fresh venv at `venv` and install `packages` from wheels only."""
    if os.path.lexists(venv):
        raise StageError("venv", f"{venv} already exists; the launcher installs into a fresh venv")
    # The base interpreter, not a `uv run` ephemeral environment's link to it.
    python = str(config.get("python") or getattr(sys, "_base_executable", "") or sys.executable)
    env = installer_env()
    os.umask(0o022)  # the venv must be readable (never writable) by the job's uid
    choice = config.get("installer") or "auto"
    uv = find_uv(config) if choice in ("auto", "uv") else None
    if choice == "uv" and not uv:
        raise StageError("venv", "uv was required but not found")
    exclude_newer = config.get("exclude_newer")
    pinned: list[str] = []
    if exclude_newer is not None:
        if not isinstance(exclude_newer, str) or not re.fullmatch(
            EXCLUDE_NEWER_PATTERN, exclude_newer
        ):
            raise StageError("config", f"exclude_newer {exclude_newer!r} is not an RFC 3339 time")
        if not uv:
            raise StageError("venv", "exclude-newer needs uv, which was not found")
        pinned = ["--exclude-newer", exclude_newer]
    if uv:
        run_installer([uv, "venv", "--no-config", "--quiet", "--python", python, venv], "venv", env)
        if packages:
            run_installer(
                [
                    uv,
                    "pip",
                    "install",
                    "--no-config",
                    "--python",
                    os.path.join(venv, "bin", "python"),
                    "--only-binary",
                    ":all:",
                    *pinned,
                    *source_args(config),
                    "--",
                    *packages,
                ],
                "install",
                env,
            )
        installer = "uv"
    else:
        # Fallback: the base interpreter's venv and pip. pip installs into the venv's
        # site-packages with --target, so the new venv's Python never runs as root.
        run_installer([python, "-m", "venv", "--without-pip", venv], "venv", env)
        if packages:
            run_installer(
                [
                    python,
                    "-m",
                    "pip",
                    "--isolated",
                    "install",
                    "--no-input",
                    "--only-binary",
                    ":all:",
                    "--no-compile",
                    "--target",
                    site_packages(venv),
                    *source_args(config),
                    "--",
                    *packages,
                ],
                "install",
                env,
            )
        installer = "pip"
    return installed_versions(venv), installer


def site_packages(venv: str) -> str:
    libdir = os.path.join(venv, "lib")
    for name in sorted(os.listdir(libdir)):
        candidate = os.path.join(libdir, name, "site-packages")
        if name.startswith("python") and os.path.isdir(candidate):
            return candidate
    raise StageError("venv", f"no site-packages folder under {libdir}")


def installed_versions(venv: str) -> dict[str, str]:
    """Name → version of every distribution in the venv, read from its dist-info METADATA."""
    found: dict[str, str] = {}
    sp = site_packages(venv)
    for entry in sorted(os.listdir(sp)):
        if not entry.endswith(".dist-info"):
            continue
        name = version = None
        try:
            with open(
                os.path.join(sp, entry, "METADATA"), encoding="utf-8", errors="replace"
            ) as fh:
                for line in fh:
                    if not line.strip():
                        break  # end of the headers
                    key, _, value = line.partition(":")
                    if key == "Name":
                        name = value.strip()
                    elif key == "Version":
                        version = value.strip()
        except OSError:
            continue
        if name and version:
            found[re.sub(r"[-_.]+", "-", name).lower()] = version
    return found


# ---------------------------------------------------------------------------------------------
# Seccomp (pure ctypes BPF)
# ---------------------------------------------------------------------------------------------

AUDIT_ARCH = {"x86_64": 0xC000003E, "i386": 0x40000003, "aarch64": 0xC00000B7, "arm": 0x40000028}
X32_SYSCALL_BIT = 0x40000000

# Syscall numbers per architecture (Linux uapi: asm/unistd_64.h, asm/unistd_32.h,
# asm-generic/unistd.h, arch/arm/tools/syscall.tbl). Numbers >= 424 are shared by all.
# fmt: off
_COMMON_NEW = {
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "clone3": 435, "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
}
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        **_COMMON_NEW,
        "socket": 41, "socketpair": 53, "clone": 56, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "unshare": 272, "setns": 308, "bpf": 321, "userfaultfd": 323,
        "perf_event_open": 298, "add_key": 248, "request_key": 249, "keyctl": 250, "mount": 165,
        "umount2": 166, "pivot_root": 155, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "create_module": 174, "query_module": 178, "get_kernel_syms": 177,
        "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "acct": 163, "swapon": 167,
        "swapoff": 168, "quotactl": 179, "clock_settime": 227, "clock_adjtime": 305,
        "settimeofday": 164, "kcmp": 312, "name_to_handle_at": 303, "open_by_handle_at": 304,
        "lookup_dcookie": 212, "nfsservctl": 180, "uselib": 134, "ustat": 136, "sysfs": 139,
        "_sysctl": 156, "modify_ldt": 154, "iopl": 172, "ioperm": 173, "syslog": 103,
        "vhangup": 153, "move_pages": 279, "migrate_pages": 256, "seccomp": 317,
        "connect": 42, "bind": 49, "listen": 50, "sendto": 44, "sendmsg": 46, "sendmmsg": 307,
        "setsockopt": 54,
    },
    "i386": {
        **_COMMON_NEW,
        "socket": 359, "socketpair": 360, "socketcall": 102, "clone": 120, "ptrace": 26,
        "process_vm_readv": 347, "process_vm_writev": 348, "unshare": 310, "setns": 346,
        "bpf": 357, "userfaultfd": 374, "perf_event_open": 336, "add_key": 286, "request_key": 287,
        "keyctl": 288, "mount": 21, "umount": 22, "umount2": 52, "pivot_root": 217,
        "init_module": 128, "finit_module": 350, "delete_module": 129, "create_module": 127,
        "query_module": 167, "get_kernel_syms": 130, "kexec_load": 283, "reboot": 88, "acct": 51,
        "swapon": 87, "swapoff": 115, "quotactl": 131, "clock_settime": 264,
        "clock_settime64": 404, "clock_adjtime": 343, "clock_adjtime64": 405, "settimeofday": 79,
        "stime": 25, "kcmp": 349, "name_to_handle_at": 341, "open_by_handle_at": 342,
        "lookup_dcookie": 253, "nfsservctl": 169, "uselib": 86, "ustat": 62, "sysfs": 135,
        "_sysctl": 149, "vm86": 166, "vm86old": 113, "modify_ldt": 123, "iopl": 110, "ioperm": 101,
        "syslog": 103, "vhangup": 111, "move_pages": 317, "migrate_pages": 294, "seccomp": 354,
        "connect": 362, "bind": 361, "listen": 363, "sendto": 369, "sendmsg": 370,
        "sendmmsg": 345, "setsockopt": 366,
    },
    "aarch64": {
        **_COMMON_NEW,
        "socket": 198, "socketpair": 199, "clone": 220, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "unshare": 97, "setns": 268, "bpf": 280, "userfaultfd": 282,
        "perf_event_open": 241, "add_key": 217, "request_key": 218, "keyctl": 219, "mount": 40,
        "umount2": 39, "pivot_root": 41, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "reboot": 142, "acct": 89,
        "swapon": 224, "swapoff": 225, "quotactl": 60, "clock_settime": 112, "clock_adjtime": 266,
        "settimeofday": 170, "kcmp": 272, "name_to_handle_at": 264, "open_by_handle_at": 265,
        "lookup_dcookie": 18, "nfsservctl": 42, "syslog": 116, "vhangup": 58, "move_pages": 239,
        "migrate_pages": 238, "seccomp": 277,
        "connect": 203, "bind": 200, "listen": 201, "sendto": 206, "sendmsg": 211,
        "sendmmsg": 269, "setsockopt": 208,
    },
    "arm": {
        **_COMMON_NEW,
        "socket": 281, "socketpair": 288, "clone": 120, "ptrace": 26, "process_vm_readv": 376,
        "process_vm_writev": 377, "unshare": 337, "setns": 375, "bpf": 386, "userfaultfd": 388,
        "perf_event_open": 364, "add_key": 309, "request_key": 310, "keyctl": 311, "mount": 21,
        "umount2": 52, "pivot_root": 218, "init_module": 128, "finit_module": 379,
        "delete_module": 129, "kexec_load": 347, "kexec_file_load": 401, "reboot": 88, "acct": 51,
        "swapon": 87, "swapoff": 115, "quotactl": 131, "clock_settime": 262,
        "clock_settime64": 404, "clock_adjtime": 372, "clock_adjtime64": 405, "settimeofday": 79,
        "kcmp": 378, "name_to_handle_at": 370, "open_by_handle_at": 371, "lookup_dcookie": 249,
        "nfsservctl": 169, "uselib": 86, "ustat": 62, "sysfs": 135, "_sysctl": 149, "syslog": 103,
        "vhangup": 111, "move_pages": 344, "migrate_pages": 400, "seccomp": 383,
        "connect": 283, "bind": 282, "listen": 284, "send": 289, "sendto": 290, "sendmsg": 296,
        "sendmmsg": 374, "setsockopt": 294,
    },
}

# Refused with EPERM: ours (cross-process access, io_uring, new namespaces) and the calls that
# Docker's default profile denies to a container without extra capabilities.
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "unshare", "setns", "bpf", "userfaultfd",
    "perf_event_open", "add_key", "request_key", "keyctl", "mount", "umount", "umount2",
    "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "init_module", "finit_module", "delete_module", "create_module",
    "query_module", "get_kernel_syms", "kexec_load", "kexec_file_load", "reboot", "acct", "swapon",
    "swapoff", "quotactl", "quotactl_fd", "clock_settime", "clock_settime64", "clock_adjtime",
    "clock_adjtime64", "settimeofday", "stime", "name_to_handle_at", "open_by_handle_at",
    "lookup_dcookie", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "vm86", "vm86old",
    "modify_ldt", "iopl", "ioperm", "syslog", "vhangup", "move_pages", "migrate_pages",
)
# fmt: on
# clone3 takes its flags in memory that seccomp cannot read: ENOSYS makes libc fall back to
# clone, whose flags register is checked below (Docker does the same).
ENOSYS_CALLS = ("clone3",)
CLONE_NAMESPACE_FLAGS = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
SYS_SOCKET, SYS_SOCKETPAIR = 1, 8  # socketcall(2) call numbers
# socketcall's calls whose address or flags are in memory, out of the filter's sight: refused
# under the loopback policy (a 64-bit process can reach them with `int 0x80`). SOCKET and
# SOCKETPAIR are refused always; the i386 calls of their own (connect, sendto, ...) are checked
# like the native ones.
SOCKETCALL_REFUSED = (
    SYS_SOCKET,
    SYS_SOCKETPAIR,
    2,
    3,
    4,
    9,
    11,
    14,
    16,
    20,  # bind, connect, listen, send,
)  # sendto, setsockopt, sendmsg, sendmmsg
# Where each sending call takes its flags (MSG_FASTOPEN would connect TCP with an address the
# supervisor never sees): sendto(fd, buf, len, flags, ...), sendmsg(fd, msg, flags), ...
FLAGS_ARG = {"sendto": 3, "sendmsg": 2, "sendmmsg": 3, "send": 3}
IPPROTO_TCP, SOCK_TYPE_MASK, NETLINK_ROUTE = 6, 0xF, 0
# Socket options that could send a TCP socket's packets elsewhere than the loopback address the
# supervisor checked, set before its connect or after (each routes every later packet again),
# by level: fast open's connect-on-write (TCP_FASTOPEN_CONNECT defers the SYN to the first send,
# which may name an address of its own); an interface (SO_BINDTODEVICE, SO_BINDTOIFINDEX: a
# connect to 127.0.0.1 bound to eth0 sent its SYN out of eth0, measured on this machine); and
# source routes, whose first hop is where the packets go (IP_OPTIONS with a loose source route
# through the gateway sent a SYN for 127.0.0.1 out of eth0 to the gateway, measured; IPv6's
# routing headers the same). Numbers from Linux's uapi socket.h, in.h and in6.h.
REFUSED_SOCKOPTS = {
    IPPROTO_TCP: (TCP_FASTOPEN_CONNECT,),
    1: (25, 62),  # SOL_SOCKET: SO_BINDTODEVICE, SO_BINDTOIFINDEX
    0: (4,),  # IPPROTO_IP: IP_OPTIONS
    41: (5, 6, 57),  # IPPROTO_IPV6: IPV6_2292RTHDR, IPV6_2292PKTOPTIONS, IPV6_RTHDR
}
SECCOMP_FILTER_FLAG_NEW_LISTENER_BIT = 1 << 3

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_LD_ABS_W, _JEQ, _JGE, _JSET, _JA, _RET, _AND = 0x20, 0x15, 0x35, 0x45, 0x05, 0x06, 0x54
_OFF_NR, _OFF_ARCH = 0, 4


def _off_arg(i: int) -> int:
    """The offset of the low 32 bits of args[i] in struct seccomp_data (args start at 16)."""
    return 16 + 8 * i + (0 if sys.byteorder == "little" else 4)


_OFF_ARG0 = _off_arg(0)


def _insn(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return (code, jt, jf, k & 0xFFFFFFFF)


def _assemble(items: list) -> list[tuple[int, int, int, int]]:
    """BPF from ("label", name) markers and instructions whose jump targets may be label
    names (None: the next instruction); jumps only go forward, as BPF requires."""
    labels: dict[str, int] = {}
    pc = 0
    for item in items:
        if item[0] == "label":
            if item[1] in labels:
                raise ValueError(f"BPF label {item[1]!r} twice")
            labels[item[1]] = pc
        else:
            pc += 1
    prog, pc = [], 0
    for item in items:
        if item[0] == "label":
            continue
        code, k, *targets = item
        jt, jf = [*targets, None, None][:2]
        if code == _JA:
            prog.append(_insn(code, _jump(labels, k, pc, 0xFFFF)))
        else:
            prog.append(_insn(code, k, _jump(labels, jt, pc, 0xFF), _jump(labels, jf, pc, 0xFF)))
        pc += 1
    return prog


def _jump(labels: dict[str, int], target: object, pc: int, reach: int) -> int:
    """The offset from instruction `pc` to label `target` (None: the next instruction)."""
    offset = 0 if target is None else labels[str(target)] - pc - 1
    if not 0 <= offset <= reach:
        raise ValueError(f"BPF jump to {target!r} out of reach ({offset})")
    return offset


def _when(nr: int, body: list, tag: str) -> list:
    """`body` for syscall `nr` (every path of `body` must return: it loads arguments)."""
    return [(_JEQ, nr, None, f"after-{tag}"), *body, ("label", f"after-{tag}")]


def _loopback_rules(arch: str) -> list:
    """The loopback policy's rules (see job_launcher/loopback.py): TCP and AF_UNIX sockets,
    connect, bind and listen to the supervisor, fast open refused, no second listener."""
    nrs = SYSCALLS[arch]
    deny = _RET_ERRNO | errno.EPERM
    rules = _when(
        nrs["socket"],
        [
            (_LD_ABS_W, _OFF_ARG0),
            (_JEQ, socket.AF_UNIX, "s-allow"),
            (_JEQ, socket.AF_NETLINK, "s-netlink"),
            (_JEQ, socket.AF_INET, "s-tcp"),
            (_JEQ, socket.AF_INET6, "s-tcp", "s-deny"),
            # NETLINK_ROUTE, whose only peer an unprivileged socket can reach is the kernel:
            # getifaddrs(3) needs it, and gloo's TCP device calls getifaddrs at its start.
            ("label", "s-netlink"),
            (_LD_ABS_W, _off_arg(2)),
            (_JEQ, NETLINK_ROUTE, None, "s-deny"),
            (_LD_ABS_W, _off_arg(1)),
            (_AND, SOCK_TYPE_MASK),
            (_JEQ, socket.SOCK_RAW, "s-allow"),
            (_JEQ, socket.SOCK_DGRAM, "s-allow", "s-deny"),
            ("label", "s-tcp"),
            (_LD_ABS_W, _off_arg(1)),
            (_AND, SOCK_TYPE_MASK),
            (_JEQ, socket.SOCK_STREAM, None, "s-deny"),
            (_LD_ABS_W, _off_arg(2)),
            (_JEQ, 0, "s-allow"),
            (_JEQ, IPPROTO_TCP, "s-allow", "s-deny"),
            ("label", "s-allow"),
            (_RET, _RET_ALLOW),
            ("label", "s-deny"),
            (_RET, deny),
        ],
        "socket",
    )
    rules += _when(
        nrs["socketpair"],
        [
            (_LD_ABS_W, _OFF_ARG0),
            (_JEQ, socket.AF_UNIX, "p-allow"),
            (_RET, deny),
            ("label", "p-allow"),
            (_RET, _RET_ALLOW),
        ],
        "socketpair",
    )
    for name in ("connect", "bind", "listen"):
        rules += _when(nrs[name], [(_RET, RET_USER_NOTIF)], name)
    for name, arg in FLAGS_ARG.items():
        if name in nrs:
            rules += _when(
                nrs[name],
                [
                    (_LD_ABS_W, _off_arg(arg)),
                    (_JSET, MSG_FASTOPEN, f"{name}-deny"),
                    (_RET, _RET_ALLOW),
                    ("label", f"{name}-deny"),
                    (_RET, deny),
                ],
                name,
            )
    body = [(_LD_ABS_W, _off_arg(1))]  # the level, then the option's name
    body += [(_JEQ, level, f"o-level-{level}") for level in REFUSED_SOCKOPTS]
    body += [(_RET, _RET_ALLOW)]
    for level, names in REFUSED_SOCKOPTS.items():
        body += [("label", f"o-level-{level}"), (_LD_ABS_W, _off_arg(2))]
        body += [(_JEQ, name, "o-deny") for name in names]
        body += [(_RET, _RET_ALLOW)]
    body += [("label", "o-deny"), (_RET, deny)]
    rules += _when(nrs["setsockopt"], body, "setsockopt")
    if "socketcall" in nrs:
        body: list = [(_LD_ABS_W, _OFF_ARG0)]
        body += [(_JEQ, call, "sc-deny") for call in SOCKETCALL_REFUSED]
        body += [(_RET, _RET_ALLOW), ("label", "sc-deny"), (_RET, deny)]
        rules += _when(nrs["socketcall"], body, "socketcall")
    return rules


def _af_unix_rules(arch: str) -> list:
    """The AF_UNIX-only rules (the fallback, and the helper's own filter)."""
    nrs = SYSCALLS[arch]
    deny = _RET_ERRNO | errno.EPERM
    rules: list = []
    for name in ("socket", "socketpair"):
        rules += _when(
            nrs[name],
            [
                (_LD_ABS_W, _OFF_ARG0),
                (_JEQ, socket.AF_UNIX, f"{name}-ok"),
                (_RET, deny),
                ("label", f"{name}-ok"),
                (_RET, _RET_ALLOW),
            ],
            name,
        )
    if "socketcall" in nrs:  # its arguments are in memory: refuse creating sockets through it
        rules += _when(
            nrs["socketcall"],
            [
                (_LD_ABS_W, _OFF_ARG0),
                (_JEQ, SYS_SOCKET, "sc-deny"),
                (_JEQ, SYS_SOCKETPAIR, "sc-deny"),
                (_RET, _RET_ALLOW),
                ("label", "sc-deny"),
                (_RET, deny),
            ],
            "socketcall",
        )
    return rules


def _arch_block(arch: str, loopback: bool = False) -> list[tuple[int, int, int, int]]:
    nrs = SYSCALLS[arch]
    deny = _RET_ERRNO | errno.EPERM
    items: list = [(_LD_ABS_W, _OFF_NR)]
    if arch == "x86_64":  # x32 ABI: same arch value, nr | 0x40000000
        items += [(_JGE, X32_SYSCALL_BIT, None, "not-x32"), (_RET, deny), ("label", "not-x32")]
    for name in DENIED:
        if name in nrs:
            items += _when(nrs[name], [(_RET, deny)], name)
    for name in ENOSYS_CALLS:
        items += _when(nrs[name], [(_RET, _RET_ERRNO | errno.ENOSYS)], name)
    items += _loopback_rules(arch) if loopback else _af_unix_rules(arch)
    # A filter of the job's own with a listener could answer "continue" to its own trapped calls
    # (the kernel refuses a second listener in a chain, EBUSY; refused here too, by its flag).
    items += _when(
        nrs["seccomp"],
        [
            (_LD_ABS_W, _OFF_ARG0),
            (_JEQ, 1, None, "c-allow"),  # SECCOMP_SET_MODE_FILTER
            (_LD_ABS_W, _off_arg(1)),
            (_JSET, SECCOMP_FILTER_FLAG_NEW_LISTENER_BIT, "c-deny"),
            ("label", "c-allow"),
            (_RET, _RET_ALLOW),
            ("label", "c-deny"),
            (_RET, deny),
        ],
        "seccomp",
    )
    items += _when(  # clone with a namespace flag
        nrs["clone"],
        [
            (_LD_ABS_W, _OFF_ARG0),
            (_JSET, CLONE_NAMESPACE_FLAGS, "clone-deny"),
            (_RET, _RET_ALLOW),
            ("label", "clone-deny"),
            (_RET, deny),
        ],
        "clone",
    )
    items.append((_RET, _RET_ALLOW))
    return _assemble(items)


def seccomp_program(loopback: bool = False) -> list[tuple[int, int, int, int]]:
    """The BPF program: dispatch on seccomp_data.arch, one block per known architecture.
    `loopback`: the loopback-only TCP policy (its listener served by job_launcher/loopback.py's
    supervisor), else AF_UNIX sockets only."""
    arches = list(SYSCALLS)
    blocks = [_arch_block(a, loopback) for a in arches]
    # Header: for each arch, `jeq arch ? next : skip`, `ja <its block>`; then unknown → kill.
    header_len = 1 + 2 * len(arches) + 1
    prog = [_insn(_LD_ABS_W, _OFF_ARCH)]
    offset = 0
    for i, arch in enumerate(arches):
        jump_from = 1 + 2 * i + 2  # index after this arch's `ja`
        target = header_len + offset
        prog += [_insn(_JEQ, AUDIT_ARCH[arch], 0, 1), _insn(_JA, target - jump_from)]
        offset += len(blocks[i])
    prog.append(_insn(_RET, _RET_KILL_PROCESS))
    for block in blocks:
        prog += block
    if len(prog) > 4096:  # BPF_MAXINSNS
        raise StageError("seccomp", f"filter too long ({len(prog)} instructions)")
    return prog


def native_arch() -> str:
    machine = platform.machine().lower()
    arch = {
        "x86_64": "x86_64",
        "amd64": "x86_64",
        "aarch64": "aarch64",
        "arm64": "aarch64",
        "i386": "i386",
        "i686": "i386",
    }.get(machine)
    if arch is None and machine.startswith("arm"):
        arch = "arm"
    if arch is None:
        raise StageError("seccomp", f"no syscall table for architecture {machine!r}")
    if arch == "x86_64" and struct.calcsize("P") == 4:
        raise StageError("seccomp", "x32 or 32-bit Python on x86_64 is not supported")
    return arch


def _filter_bytes(loopback: bool) -> bytes:
    return b"".join(struct.pack("HBBI", *insn) for insn in seccomp_program(loopback))


def install_seccomp(loopback: bool = False) -> int | None:
    """PR_SET_NO_NEW_PRIVS, then the filter, then a check that it holds. AF_UNIX only (every
    thread, SECCOMP_FILTER_FLAG_TSYNC): returns None. `loopback`: the loopback-only TCP policy
    with a new listener, for this single-threaded process (the kernel refuses TSYNC with a
    listener): returns the listener's fd, which the caller hands to the supervisor before
    anything is trapped. Raises StageError("seccomp") and, with `loopback`, OSError where the
    kernel refuses a listener (the caller falls back)."""
    arch = native_arch()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pr_set_no_new_privs = 38
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        err = os.strerror(ctypes.get_errno())
        raise StageError("seccomp", f"PR_SET_NO_NEW_PRIVS failed: {err}")
    if loopback:
        return install_listener_filter(arch, _filter_bytes(True))
    raw = _filter_bytes(False)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(raw) // 8, ctypes.cast(buf, ctypes.c_void_p))
    seccomp_set_mode_filter, seccomp_filter_flag_tsync = 1, 1
    rc = libc.syscall(
        ctypes.c_long(SYSCALLS[arch]["seccomp"]),
        ctypes.c_long(seccomp_set_mode_filter),
        ctypes.c_long(seccomp_filter_flag_tsync),
        ctypes.byref(fprog),
    )
    if rc != 0:
        raise StageError(
            "seccomp", f"seccomp(SET_MODE_FILTER) returned {rc}: {os.strerror(ctypes.get_errno())}"
        )
    verify_seccomp(loopback=False)
    return None


def verify_seccomp(loopback: bool) -> None:
    """Check, in this process, that the filter holds before anything of the agent's runs: UDP
    is refused in-kernel; TCP is refused (AF_UNIX only) or its connect to an outside address
    is refused by the supervisor (the loopback policy, which must be served by then)."""
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()
    except PermissionError:
        pass
    else:
        raise StageError("seccomp", "the filter is installed but UDP sockets still open")
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except PermissionError:
        if loopback:
            message = "the loopback policy is on but TCP sockets are refused"
            raise StageError("seccomp", message) from None
    else:
        try:
            if not loopback:
                raise StageError("seccomp", "the filter is installed but AF_INET sockets open")
            err = probe.connect_ex(("192.0.2.1", 9))  # TEST-NET-1: never a real destination
            if err != errno.EPERM:
                raise StageError(
                    "seccomp", f"the supervisor did not refuse an outside connect ({err})"
                )
        finally:
            probe.close()
    with open("/proc/self/status") as fh:
        if "Seccomp:\t2" not in fh.read():
            raise StageError("seccomp", "/proc/self/status does not show filter mode")


# ---------------------------------------------------------------------------------------------
# File descriptors, uid
# ---------------------------------------------------------------------------------------------


def check_output_fds() -> None:
    """Refuse to start when stdout or stderr is a socket other than AF_UNIX."""
    for fd in (1, 2):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(mode):
            sock = socket.socket(fileno=os.dup(fd))
            try:
                family = sock.family
            finally:
                sock.close()
            if family != socket.AF_UNIX:
                raise StageError("fds", f"fd {fd} is a {family.name} socket; refusing to start")


def close_inherited_fds(keep: int) -> None:
    """Close every fd above 2 except `keep` (the close-on-exec error pipe), then verify."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    if null != 0:
        os.close(null)
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 20)
    for name in os.listdir("/proc/self/fd"):  # beyond closerange's reach (high fds)
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own fd, already closed
    left = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                os.fstat(fd)
            except OSError:
                continue  # the listing's own fd, closed by now
            left.append(fd)
    if left:
        raise StageError("fds", f"fds still open after closing: {left}")


def _id_map_ranges(path: str) -> list[tuple[int, int]]:
    ranges = []
    try:
        with open(path) as fh:
            for line in fh:
                inside, _outside, count = (int(x) for x in line.split())
                ranges.append((inside, inside + count))
    except (OSError, ValueError):
        ranges.append((0, 1 << 32))
    return ranges


def ids_in_use() -> tuple[set[int], set[int]]:
    uids: set[int] = set()
    gids: set[int] = set()
    for path, target in (("/etc/passwd", uids), ("/etc/group", gids)):
        try:
            with open(path) as fh:
                for line in fh:
                    parts = line.split(":")
                    if len(parts) > 2 and parts[2].isdigit():
                        target.add(int(parts[2]))
                    if path == "/etc/passwd" and len(parts) > 3 and parts[3].isdigit():
                        gids.add(int(parts[3]))
        except OSError:
            pass
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        uids.update(int(x) for x in line.split()[1:])
                    elif line.startswith("Gid:"):
                        gids.update(int(x) for x in line.split()[1:])
        except (OSError, ValueError):
            continue
    return uids, gids


def choose_unused_id() -> int:
    """An id that no account, group or live process uses, inside this namespace's id maps."""
    uids, gids = ids_in_use()
    ranges = [
        (max(lo, 100_000), min(hi, 1 << 31)) for lo, hi in _id_map_ranges("/proc/self/uid_map")
    ]
    granges = _id_map_ranges("/proc/self/gid_map")
    ranges = [(lo, hi) for lo, hi in ranges if hi - lo > 1]
    rng = random.SystemRandom()
    for _ in range(1000):
        if not ranges:
            break
        lo, hi = rng.choice(ranges)
        candidate = rng.randrange(lo, hi - 1)
        if candidate in uids or candidate in gids or candidate == 65534:
            continue
        if any(glo <= candidate < ghi for glo, ghi in granges):
            return candidate
    raise StageError("uid", "found no unused uid inside this namespace's uid map")


def capabilities() -> dict[str, int]:
    caps = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("CapInh:", "CapPrm:", "CapEff:", "CapAmb:")):
                key, value = line.split(":")
                caps[key] = int(value.strip(), 16)
    return caps


def drop_privileges(uid: int | None, gid: int | None) -> None:
    """Switch to uid/gid (root), or verify an already unprivileged process; then verify."""
    if os.geteuid() == 0 or os.getuid() == 0:
        if uid is None or gid is None or uid == 0 or gid == 0:
            raise StageError("uid", "no job uid/gid to switch to")
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
            raise StageError("uid", "the uid/gid switch did not take")
    elif (uid is not None and os.getresuid() != (uid, uid, uid)) or (
        gid is not None and os.getresgid() != (gid, gid, gid)
    ):
        raise StageError("uid", f"running unprivileged as {os.getuid()}, not the job's {uid}")
    if 0 in os.getresuid() or 0 in os.getresgid() or 0 in os.getgroups():
        raise StageError("uid", "a root uid, gid or group remains")
    caps = capabilities()
    if any(caps.values()):
        raise StageError("uid", f"capabilities remain: {caps}")
    try:
        os.setuid(0)
    except PermissionError:
        pass
    except OSError as exc:
        # In a user namespace that maps no uid 0 (bwrap run by an ordinary user), the kernel
        # answers EINVAL: root does not exist there at all.
        if exc.errno != errno.EINVAL:
            raise
    else:
        raise StageError("uid", "setuid(0) succeeded after dropping privileges")


# ---------------------------------------------------------------------------------------------
# Run phase: supervisor and child
# ---------------------------------------------------------------------------------------------


class JobContext:
    """What the supervisor prepares for the child (paths, ids, environment)."""

    def __init__(
        self, config: dict, script: bytes, venv: str, passed: dict[str, str] | None = None
    ) -> None:
        self.privileged = os.geteuid() == 0
        self.data_dir = str(config.get("data_dir") or "/data")
        self.outputs = os.path.join(self.data_dir, "outputs")
        self.python = os.path.join(venv, "bin", "python")
        uid, gid = config.get("uid"), config.get("gid")
        if self.privileged:
            self.uid: int = int(uid) if uid is not None else choose_unused_id()
            self.gid: int = int(gid) if gid is not None else self.uid
        else:
            # Already unprivileged (a user namespace set up by the local backend): the child
            # verifies that it runs as the configured uid, if one is configured.
            self.uid = int(uid) if uid is not None else os.getuid()
            self.gid = int(gid) if gid is not None else os.getgid()
        self.user = str(config.get("user") or "job")
        # Why the loopback policy cannot be on, before asking the machine ("" : ask it).
        if not config.get("loopback_tcp", True):
            self.loopback_reason = "the backend turned the loopback policy off"
        elif not self.privileged:
            self.loopback_reason = (
                "the launcher does not run as root: its supervisor would share the job's uid, "
                "which could signal it"
            )
        else:
            self.loopback_reason = ""
        self.workdir = tempfile.mkdtemp(prefix="posttrain-run-")
        self.script_path = os.path.join(self.workdir, "script.py")
        self.home = os.path.join(self.workdir, "home")
        self.extra_env = {str(k): str(v) for k, v in (config.get("env") or {}).items()}
        self.passed = dict(passed or {})
        try:
            self._prepare(script)
        except BaseException:
            self.cleanup()
            raise

    def _prepare(self, script: bytes) -> None:
        if not os.access(self.python, os.X_OK):
            raise StageError("prepare", f"{self.python} is missing; run --phase install first")
        os.chmod(self.workdir, 0o755)
        with open(self.script_path, "wb") as fh:
            fh.write(script)
        os.chmod(self.script_path, 0o644)
        os.mkdir(self.home, 0o700)
        os.makedirs(self.outputs, exist_ok=True)
        if self.privileged:
            os.chown(self.home, self.uid, self.gid)
            os.chown(self.outputs, self.uid, self.gid)
            os.chmod(self.outputs, 0o755)
            data = os.stat(self.data_dir)
            if data.st_uid == 0 and data.st_mode & 0o022:
                os.chmod(self.data_dir, stat.S_IMODE(data.st_mode) & ~0o022)
            self._hide_launcher()

    def _hide_launcher(self) -> None:
        """Make this file unreadable to the job's uid (DESIGN §9, trusted log lines)."""
        path = os.path.abspath(__file__)
        try:
            os.chmod(path, 0o600)
        except OSError:
            pass  # checked below
        st = os.stat(path)
        if (
            st.st_uid == self.uid
            or st.st_mode & 0o004
            or (st.st_mode & 0o040 and st.st_gid == self.gid)
        ):
            raise StageError("prepare", f"cannot make {path} unreadable to the job's uid")

    def environment(self, loopback_tcp: bool = False) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASS_THROUGH_ENV if k in os.environ}
        env.update(self.extra_env)
        env.update(self.passed)
        env.update(FIXED_ENV)
        env.update(
            {
                "HOME": self.home,
                "USER": self.user,
                "LOGNAME": self.user,
                "PATH": f"{os.path.dirname(self.python)}:/usr/local/bin:/usr/bin:/bin",
                "VIRTUAL_ENV": os.path.dirname(os.path.dirname(self.python)),
                "TMPDIR": "/tmp",
                # What the sandbox allows, for the script to choose (an evaluator's engine,
                # an agent's DDP): "1" when TCP on loopback works, "0" for AF_UNIX only.
                LOOPBACK_ENV: "1" if loopback_tcp else "0",
            }
        )
        return env

    def cleanup(self) -> None:
        """Remove the script's folder and HOME. Never raises: the exit line must follow."""
        try:
            remove_tree(self.workdir)
        except OSError:
            pass  # the backend throws the job's whole filesystem away anyway


def remove_tree(root: str) -> None:
    """Remove `root` without following links and without recursion: the job decides how deep
    its HOME (and, where it runs as the launcher's own uid, the temporary venv) goes;
    shutil.rmtree recurses and raises RecursionError on a tree 1,000 deep, which even
    `ignore_errors=True` lets through, and paths that deep exceed PATH_MAX. Each folder met
    below the first level is moved up to be a direct child of `root` (a rename within one
    filesystem), then emptied; folders the job made unreadable or unwritable (possible when it
    shares our uid) are opened up first. Raises OSError for what cannot be removed."""
    if not os.path.isdir(root) or os.path.islink(root):
        return
    pending, moved = [root], 0
    while pending:
        folder = pending.pop()
        _make_writable(folder)
        with os.scandir(folder) as entries:
            children = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        for name, is_dir in children:
            path = os.path.join(folder, name)
            if not is_dir:
                os.unlink(path)
            elif folder == root:
                pending.append(path)
            else:
                target = os.path.join(root, f".remove-{moved}")
                while os.path.lexists(target):
                    moved += 1
                    target = os.path.join(root, f".remove-{moved}")
                moved += 1
                _make_writable(path)  # moving a folder rewrites its `..`
                os.rename(path, target)
                pending.append(target)
        if folder != root:
            os.rmdir(folder)
    os.rmdir(root)


def _make_writable(folder: str) -> None:
    try:
        mode = stat.S_IMODE(os.lstat(folder).st_mode)
        if mode & 0o700 != 0o700:
            os.chmod(folder, mode | 0o700)
    except OSError:
        pass  # not ours to change (root's run needs none): removing it says what failed


# Records on the child's report pipe (read to its end, which is the exec): the sandbox it
# installed, then, if the script never runs, the stage that failed.
_RECORD_END = b"\x1e"


def _report(errfd: int, stage: str, message: str) -> None:
    os.write(errfd, (f"{stage}\0{message}".encode(errors="replace")[:4000]) + _RECORD_END)


def _sandbox(ctx: JobContext, handoff: socket.socket | None) -> dict:
    """Install the filter: the loopback policy when its supervisor is up (`handoff`), else, or
    where the kernel refuses a listener, AF_UNIX only. The sandbox line's payload."""
    if handoff is None:
        install_seccomp()
        return {"stage": "sandbox", "loopback_tcp": False, "loopback_reason": ctx.loopback_reason}
    try:
        listener = install_seccomp(loopback=True)
    except OSError as exc:
        handoff.close()  # the supervisor sees the end and exits
        install_seccomp()
        why = f"the kernel refused a filter with a listener: {exc.strerror or exc}"
        return {"stage": "sandbox", "loopback_tcp": False, "loopback_reason": why}
    assert listener is not None
    try:
        hand_over(handoff, listener)
    except OSError as exc:
        # The filter is on and nobody serves it: every trapped call would fail. Never run.
        raise StageError("seccomp", f"the loopback supervisor did not start: {exc}") from None
    finally:
        os.close(listener)
        handoff.close()
    verify_seccomp(loopback=True)
    return {"stage": "sandbox", "loopback_tcp": True}


def _child(
    ctx: JobContext,
    errfd: int,
    mask: Iterable[signal.Signals | int],
    handoff: socket.socket | None = None,
) -> None:
    """In the forked child: sandbox, then exec. Never returns; reports on errfd.
    `mask`: the signal mask to restore (supervise blocks FORWARDED_SIGNALS across the fork);
    `handoff`: the loopback supervisor's socket, None for AF_UNIX only."""
    stage = "seccomp"
    try:
        os.setsid()
        # Now in a process group of its own, which `forward` signals: a signal held since the
        # fork is taken here, with its default action (the job ends as if signalled later).
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        sandbox = _sandbox(ctx, handoff)
        _report(errfd, "sandbox", json.dumps(sandbox))
        stage = "fds"
        close_inherited_fds(errfd)
        stage = "uid"
        drop_privileges(ctx.uid, ctx.gid)
        stage = "exec"
        os.chdir(ctx.data_dir)
        os.umask(0o022)
        env = ctx.environment(loopback_tcp=sandbox["loopback_tcp"])
        os.execve(ctx.python, [ctx.python, ctx.script_path], env)
    except StageError as exc:
        stage, message = exc.stage, exc.message
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}"
    try:
        _report(errfd, stage, message)
    finally:
        os._exit(NEVER_RAN_EXIT)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def _live_pids_of_uid(uid: int) -> list[int]:
    """Live processes with `uid` as their real, effective, saved or fs uid.

    Read from /proc/<pid>/status, not the owner of /proc/<pid>: a process that made itself
    non-dumpable shows root as that owner.
    """
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        uids: list[int] = []
        state = ""
        try:
            with open(f"/proc/{name}/status") as fh:
                for line in fh:
                    if line.startswith("State:"):
                        state = line.split()[1]
                    elif line.startswith("Uid:"):
                        uids = [int(x) for x in line.split()[1:]]
                        break
        except (OSError, ValueError, IndexError):
            continue
        if uid in uids and state not in ("Z", "X"):
            pids.append(int(name))
    return pids


def _kill_uid(uid: int) -> None:
    """kill(-1, SIGKILL) from a helper running as `uid`: atomic against forks (tasklist lock)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_leftovers(ctx: JobContext, deadline_s: float = 10.0) -> list[int]:
    """Kill every process left under the job's uid (or below the supervisor). Returns survivors."""
    deadline = time.monotonic() + deadline_s
    me = os.getpid()
    while True:
        if ctx.privileged:
            _kill_uid(ctx.uid)
        targets = set(_descendants(me))
        if ctx.privileged:
            targets |= set(_live_pids_of_uid(ctx.uid))
        if not targets:
            _reap()
            return []
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap()
        if time.monotonic() > deadline:
            return sorted(targets)
        time.sleep(0.005)


def start_loopback(ctx: JobContext) -> socket.socket | None:
    """Start the loopback policy's supervisor (job_launcher/loopback.py) when this machine
    allows it; the child's end of its handoff socket, or None (ctx.loopback_reason says why:
    the child installs the AF_UNIX-only filter and the sandbox line says so)."""
    try:
        if not ctx.loopback_reason:
            ctx.loopback_reason = loopback_support(native_arch(), ctx.uid, ctx.gid)
        if ctx.loopback_reason:
            return None
        _pid, handoff = start_supervisor(native_arch(), ctx.uid, ctx.gid, _confine_helper)
    except (OSError, StageError) as exc:
        ctx.loopback_reason = f"the loopback supervisor could not start: {exc}"
        return None
    return handoff


def _confine_helper() -> None:
    """The loopback helper's own filter: AF_UNIX only (it runs with the job's uid)."""
    install_seccomp()


def supervise(ctx: JobContext, nonce: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_dumpable, pr_set_child_subreaper = 4, 36
    # Non-dumpable: the job cannot open this process's /proc files (mem, environ) even when it
    # shares our uid; subreaper: orphans of the job are re-parented here, so none escapes.
    libc.prctl(pr_set_dumpable, 0, 0, 0, 0)
    libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0)
    sys.stdout.flush()
    sys.stderr.flush()
    handoff = start_loopback(ctx)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    # Held from before the fork until `forward` is in place: a SIGTERM in between would
    # otherwise kill this process with its default action, before the job's group is
    # signalled, leaving the job running and no final line (seen on a loaded CI machine).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _child(ctx, write_end, mask, handoff)
    os.close(write_end)
    if handoff is not None:
        handoff.close()

    def forward(signum: int, _frame: object) -> None:
        # To the job's group; before the child has made it (setsid), to the child, which
        # holds the signal until it has.
        for send in (os.killpg, os.kill):
            try:
                send(pid, signum)
                return
            except OSError:
                continue

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    report = b""
    while True:
        try:
            chunk = os.read(read_end, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        report += chunk
    os.close(read_end)
    failure = None
    sandbox: dict = {}  # repeated on the final line, which a log's tail always holds
    for record in report.split(_RECORD_END):
        stage, _, message = record.decode(errors="replace").partition("\0")
        if stage == "sandbox" and failure is None:
            try:
                payload = json.loads(message)
            except ValueError:
                failure = ("supervisor", "the sandbox report is corrupt")
                continue
            emit(nonce, payload)  # the script starts (or fails) now
            sandbox = {k: v for k, v in payload.items() if k != "stage"}
        elif record:
            failure = (stage or "supervisor", message)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    survivors = kill_leftovers(ctx)  # the loopback supervisor and its helper too
    ctx.cleanup()
    if failure is not None:
        emit(nonce, {"stage": failure[0], "error": failure[1], **sandbox})
        return NEVER_RAN_EXIT
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        code, sig_out = 128 + sig, sig
    else:
        code, sig_out = os.WEXITSTATUS(status), None
    payload: dict = {"stage": "exit", "exit_code": code, "signal": sig_out, **sandbox}
    if survivors:
        payload["survivors"] = survivors
    emit(nonce, payload)
    return code


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="posttrain_env job launcher")
    parser.add_argument("--phase", choices=("install", "run", "all"), default="all")
    args = parser.parse_args(argv)
    nonce = read_nonce()
    if not nonce:
        sys.stderr.write(f"launcher: {NONCE_ENV} is not set; refusing to run\n")
        return 2
    temporary = ""  # the temporary venv of --phase all, removed at the end
    try:
        try:
            config, script = load_config()
            packages = check_packages(config.get("packages", []))
            venv = venv_dir(config, args.phase)
            if not config.get("venv_dir"):
                temporary = os.path.dirname(venv)
            if args.phase in ("install", "all"):
                versions, installer = install(config, packages, venv)
                emit(nonce, {"stage": "installed", "packages": versions, "installer": installer})
                if args.phase == "install":
                    return 0
            check_output_fds()
            ctx = JobContext(config, script, venv, passed_env(config, nonce))
        except StageError as exc:
            emit(nonce, {"stage": exc.stage, "error": exc.message})
            return NEVER_RAN_EXIT
        except Exception as exc:
            emit(nonce, {"stage": "supervisor", "error": f"{type(exc).__name__}: {exc}"})
            return NEVER_RAN_EXIT
        return supervise(ctx, nonce)
    finally:
        if temporary:
            try:
                remove_tree(temporary)
            except OSError:
                pass  # best effort, as before: the exit line has been written


if __name__ == "__main__":
    sys.exit(main())
