"""The builder's output and the seccomp program, checked without running a job."""

from __future__ import annotations

import base64
import errno
import json
import re
import socket
import sys

import pytest

from job_launcher import launcher
from job_launcher.builder import (
    NONCE_ENV,
    LauncherConfig,
    build_launcher,
    launcher_source,
    read_embedded,
)
from job_launcher.requirements import script_dependencies
from job_launcher.trusted_lines import LAUNCHER_TAG, format_trusted_line
from posttrain_env.errors import ErrorType, ToolError

SERVER = f"{sys.version_info.major}.{sys.version_info.minor}"
# Valid on 3.12 only: a `type` statement (PEP 695) and an f-string reusing its quotes (PEP 701).
PY312_ONLY = 'type Pair = tuple[int, int]\nprint(f"{"nested"}")\n'
# Valid from 3.11 on (the server's version): an exception group handler (PEP 654).
PY311_ON = "try:\n    pass\nexcept* ValueError:\n    pass\n"

AGENT_SCRIPT = """\
# /// script
# dependencies = ["pt-probe==1.0"]
# [tool.uv]
# index-url = "https://evil.example/simple"
# ///
print("hello")
"""


def embedded(text: str) -> tuple[dict, str]:
    config = re.search(r'^_EMBEDDED_CONFIG = "([A-Za-z0-9+/=]*)"$', text, re.M)
    script = re.search(r'^_EMBEDDED_SCRIPT = "([A-Za-z0-9+/=]*)"$', text, re.M)
    assert config and script
    found = json.loads(base64.b64decode(config[1])), base64.b64decode(script[1]).decode()
    assert read_embedded(text) == found  # the builder's own reader agrees
    return found


def test_read_embedded_refuses_what_the_builder_did_not_build() -> None:
    text = build_launcher("print(1)\n", [], LauncherConfig(), python=SERVER)
    for other in (
        "print(1)\n",
        text.replace("import argparse", "import argparse, os"),  # a changed template
        launcher_source(),  # nothing embedded
    ):
        with pytest.raises(ValueError):
            read_embedded(other)


def test_an_evaluations_inputs_are_passed_by_name_and_its_pin_embedded() -> None:
    cfg = LauncherConfig(
        pass_env=("POSTTRAIN_NONCE", "POSTTRAIN_HIDDEN_SPLIT_SEED"),
        exclude_newer="2026-11-30T00:00:00Z",
    )
    config, _ = embedded(build_launcher("print(1)\n", [], cfg, python=SERVER))
    assert config["pass_env"] == ["POSTTRAIN_NONCE", "POSTTRAIN_HIDDEN_SPLIT_SEED"]
    assert config["exclude_newer"] == "2026-11-30T00:00:00Z"
    agent, _ = embedded(build_launcher("print(1)\n", [], LauncherConfig(), python=SERVER))
    assert agent["pass_env"] == [] and agent["exclude_newer"] is None


def test_script_is_embedded_base64_and_never_becomes_the_launchers_header() -> None:
    text = build_launcher(AGENT_SCRIPT, ["numpy"], LauncherConfig(), python=SERVER)
    assert "evil.example" not in text
    assert "pt-probe" not in text
    # The only PEP 723 block uv sees is the launcher's own, and it declares no dependencies.
    assert len(re.findall(r"(?m)^# /// script$", text)) == 1
    assert script_dependencies(text) == []
    config, script = embedded(text)
    assert script == AGENT_SCRIPT
    # The header's dependencies are merged; its other settings (the index) are not carried.
    assert config["packages"] == ["numpy", "pt-probe==1.0"]
    assert "evil.example" not in json.dumps(config)
    compile(text, "launcher.py", "exec")


def test_backend_settings_are_kept_apart_from_the_agents_packages() -> None:
    cfg = LauncherConfig(uid=4321, gid=4322, find_links=("/opt/wheels",), no_index=True)
    config, _ = embedded(build_launcher("print(1)\n", ["numpy"], cfg, python=SERVER))
    assert config["packages"] == ["numpy"]
    assert (config["uid"], config["gid"], config["find_links"]) == (4321, 4322, ["/opt/wheels"])


def test_the_nonce_is_not_embedded_and_the_tags_agree() -> None:
    assert NONCE_ENV == launcher.NONCE_ENV == "POSTTRAIN_NONCE"
    assert LAUNCHER_TAG == launcher.LAUNCHER_TAG
    payload = {"stage": "exit", "exit_code": 0, "signal": None}
    assert launcher.trusted_line("n0nce", payload) == format_trusted_line(
        LAUNCHER_TAG, "n0nce", payload
    )
    assert '_EMBEDDED_CONFIG = ""\n' in launcher_source()


def test_builder_refuses_what_jobs_submit_refuses() -> None:
    with pytest.raises(ToolError) as info:
        build_launcher(
            "print(1)\n", ["foo @ https://evil.example/foo.whl"], LauncherConfig(), python=SERVER
        )
    assert info.value.type is ErrorType.invalid_dependency
    with pytest.raises(ToolError) as info:
        build_launcher("def broken(:\n", [], LauncherConfig(), python=SERVER)
    assert info.value.type is ErrorType.invalid_script
    bad_header = '# /// script\n# dependencies = ["--index-url=https://evil.example"]\n# ///\n'
    with pytest.raises(ToolError) as info:
        build_launcher(bad_header, [], LauncherConfig(), python=SERVER)
    assert info.value.type is ErrorType.invalid_dependency


def test_the_server_runs_python_3_11() -> None:
    assert SERVER == "3.11"  # what the two cases below are about


def test_a_script_valid_on_the_jobs_newer_python_is_built_although_the_server_refuses_it() -> None:
    with pytest.raises(SyntaxError):
        compile(PY312_ONLY, "script.py", "exec")  # the server's own grammar refuses it
    _, script = embedded(build_launcher(PY312_ONLY, [], LauncherConfig(), python="3.12"))
    assert script == PY312_ONLY
    with pytest.raises(ToolError) as refused:
        build_launcher(PY312_ONLY, [], LauncherConfig(), python="3.11")
    assert refused.value.type is ErrorType.invalid_script


def test_a_script_valid_on_the_server_but_not_on_the_jobs_older_python_is_refused() -> None:
    compile(PY311_ON, "script.py", "exec")  # the server's own grammar accepts it
    with pytest.raises(ToolError) as refused:
        build_launcher(PY311_ON, [], LauncherConfig(), python="3.10")
    assert refused.value.type is ErrorType.invalid_script
    assert "Python 3.10" in refused.value.message and "Exception groups" in refused.value.message
    build_launcher(PY311_ON, [], LauncherConfig(), python="3.11")


def test_the_text_rules_still_hold_whatever_the_jobs_python() -> None:
    for python in ("3.10", SERVER, "3.12"):
        with pytest.raises(ToolError) as refused:
            build_launcher("print(1)\x00\n", [], LauncherConfig(), python=python)
        assert refused.value.type is ErrorType.invalid_script and "NUL" in refused.value.message
        with pytest.raises(ToolError) as refused:
            build_launcher("   \n", [], LauncherConfig(), python=python)
        assert refused.value.type is ErrorType.invalid_script


@pytest.mark.parametrize(
    "kwargs",
    [
        {"extra_env": {"HF_TOKEN": "x"}},
        {"extra_env": {"MY_SECRET": "x"}},
        {"extra_env": {"POSTTRAIN_NONCE": "x"}},
        {"extra_env": {"lower": "x"}},
        {"uid": 0},
        {"installer": "conda"},
        {"find_links": "/opt/wheels"},
        {"pass_env": "POSTTRAIN_NONCE"},
        {"pass_env": ("PATH",)},
        {"pass_env": ("HF_HUB_OFFLINE",)},
        {"pass_env": ("lower",)},
        {"exclude_newer": "2025-06-01 --index-url=https://evil.example"},
    ],
)
def test_launcher_config_refuses_unsafe_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        LauncherConfig(**kwargs)


# ---------------------------------------------------------------------------------------------
# The seccomp program, run through a small classic-BPF interpreter
# ---------------------------------------------------------------------------------------------

ALLOW = 0x7FFF0000
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
KILL = 0x80000000


def run_bpf(prog: list[tuple[int, int, int, int]], arch: int, nr: int, arg0: int = 0) -> int:
    data = (nr & 0xFFFFFFFF).to_bytes(4, "little") + arch.to_bytes(4, "little")
    data += (0).to_bytes(8, "little") + arg0.to_bytes(8, "little") + bytes(40)
    acc, pc = 0, 0
    for _ in range(len(prog) + 1):
        code, jt, jf, k = prog[pc]
        if code == 0x20:
            acc = int.from_bytes(data[k : k + 4], "little")
            pc += 1
        elif code == 0x15:
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x35:
            pc += 1 + (jt if acc >= k else jf)
        elif code == 0x45:
            pc += 1 + (jt if acc & k else jf)
        elif code == 0x05:
            pc += 1 + k
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
    raise AssertionError("the program did not return")


PROG = launcher.seccomp_program()
ARCH = launcher.AUDIT_ARCH

# Numbers from FACTS.md (checked on this machine) and the kernel's syscall tables.
KNOWN = {
    "x86_64": {
        "socket": 41,
        "socketpair": 53,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "seccomp": 317,
        "getpid": 39,
    },
    "i386": {
        "socket": 359,
        "socketpair": 360,
        "socketcall": 102,
        "ptrace": 26,
        "process_vm_readv": 347,
        "process_vm_writev": 348,
        "seccomp": 354,
        "getpid": 20,
    },
    "aarch64": {
        "socket": 198,
        "socketpair": 199,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "seccomp": 277,
        "getpid": 172,
    },
    "arm": {
        "socket": 281,
        "socketpair": 288,
        "ptrace": 26,
        "process_vm_readv": 376,
        "process_vm_writev": 377,
        "seccomp": 383,
        "getpid": 20,
    },
}


@pytest.mark.parametrize("arch", list(KNOWN))
def test_syscall_tables_agree_with_the_kernel_numbers(arch: str) -> None:
    table = launcher.SYSCALLS[arch]
    for name, nr in KNOWN[arch].items():
        if name != "getpid":
            assert table[name] == nr, name
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register", "pidfd_getfd"):
        assert (
            table[name]
            == {
                "io_uring_setup": 425,
                "io_uring_enter": 426,
                "io_uring_register": 427,
                "pidfd_getfd": 438,
            }[name]
        )


@pytest.mark.parametrize("arch", list(KNOWN))
def test_filter_denies_and_allows_per_architecture(arch: str) -> None:
    a, nrs = ARCH[arch], launcher.SYSCALLS[arch]
    assert run_bpf(PROG, a, KNOWN[arch]["getpid"]) == ALLOW
    for name in (
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "pidfd_getfd",
        "io_uring_setup",
        "unshare",
        "setns",
        "bpf",
        "userfaultfd",
        "perf_event_open",
        "keyctl",
        "mount",
        "kexec_load",
        "init_module",
    ):
        assert run_bpf(PROG, a, nrs[name]) == EPERM, name
    assert run_bpf(PROG, a, nrs["clone3"]) == ENOSYS
    for call in ("socket", "socketpair"):
        assert run_bpf(PROG, a, nrs[call], socket.AF_UNIX) == ALLOW
        for family in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, socket.AF_PACKET):
            assert run_bpf(PROG, a, nrs[call], family) == EPERM
    # clone: threads and fork allowed, any namespace flag refused.
    assert run_bpf(PROG, a, nrs["clone"], 0x003D0F00) == ALLOW  # pthread_create's flags
    assert run_bpf(PROG, a, nrs["clone"], 0x01200011) == ALLOW  # fork's flags
    for flag in (0x10000000, 0x40000000, 0x20000000, 0x00020000):  # NEWUSER, NEWNET, NEWPID, NEWNS
        assert run_bpf(PROG, a, nrs["clone"], 0x11 | flag) == EPERM


def test_filter_checks_i386_socketcall_and_refuses_x32_and_unknown_architectures() -> None:
    i386 = ARCH["i386"]
    assert run_bpf(PROG, i386, 102, 1) == EPERM  # socketcall(SYS_SOCKET, …)
    assert run_bpf(PROG, i386, 102, 8) == EPERM  # socketcall(SYS_SOCKETPAIR, …)
    assert run_bpf(PROG, i386, 102, 3) == ALLOW  # socketcall(SYS_CONNECT, …) on an existing fd
    x86_64 = ARCH["x86_64"]
    assert run_bpf(PROG, x86_64, 0x40000000 | 41, socket.AF_UNIX) == EPERM  # x32 socket
    assert run_bpf(PROG, x86_64, 0x40000000 | 39) == EPERM  # any x32 call
    assert run_bpf(PROG, 0xC0000016, 39) == KILL  # s390x: no table, so nothing is allowed
    assert len(PROG) <= 4096
