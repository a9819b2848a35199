"""The builder's output and the seccomp program, checked without running a job."""

from __future__ import annotations

import base64
import errno
import json
import re
import socket
import sys

import pytest

from job_launcher import launcher, loopback
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


def run_bpf(prog: list[tuple[int, int, int, int]], arch: int, nr: int, *args: int) -> int:
    data = (nr & 0xFFFFFFFF).to_bytes(4, "little") + arch.to_bytes(4, "little")
    data += (0).to_bytes(8, "little")
    data += b"".join(a.to_bytes(8, "little") for a in (list(args) + [0] * 6)[:6])
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
        elif code == 0x54:  # BPF_ALU | BPF_AND | BPF_K
            acc &= k
            pc += 1
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


# -- the loopback policy's program ----------------------------------------------------------------

LOOPBACK = launcher.seccomp_program(loopback=True)
NOTIFY = 0x7FC00000
AF_NETLINK, NETLINK_ROUTE, NETLINK_SOCK_DIAG = 16, 0, 4


def test_the_loopback_tables_agree_with_the_filters() -> None:
    for arch, audit in ARCH.items():
        nrs = launcher.SYSCALLS[arch]
        assert loopback.TRAPPED[audit] == {nrs[op]: op for op in ("connect", "bind", "listen")}


@pytest.mark.parametrize("arch", list(KNOWN))
def test_the_loopback_program_sends_set_up_calls_to_the_supervisor_and_data_past_it(
    arch: str,
) -> None:
    a, nrs = ARCH[arch], launcher.SYSCALLS[arch]
    for call in ("connect", "bind", "listen"):
        assert run_bpf(LOOPBACK, a, nrs[call], 3) == NOTIFY, call
    stream, cloexec_nonblock = socket.SOCK_STREAM, 0o2004000
    for family in (socket.AF_INET, socket.AF_INET6):
        for proto in (0, socket.IPPROTO_TCP):
            flagged = stream | cloexec_nonblock
            assert run_bpf(LOOPBACK, a, nrs["socket"], family, flagged, proto) == ALLOW
            assert run_bpf(LOOPBACK, a, nrs["socket"], family, stream, proto) == ALLOW
        for kind, proto in ((socket.SOCK_DGRAM, 0), (socket.SOCK_RAW, 6), (stream, 132),
                            (stream, 262), (socket.SOCK_SEQPACKET, 0)):  # fmt: skip
            assert run_bpf(LOOPBACK, a, nrs["socket"], family, kind, proto) == EPERM, (kind, proto)
    assert run_bpf(LOOPBACK, a, nrs["socket"], socket.AF_UNIX, socket.SOCK_DGRAM) == ALLOW
    assert run_bpf(LOOPBACK, a, nrs["socket"], AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) == ALLOW
    for proto in (NETLINK_SOCK_DIAG, 15):
        assert run_bpf(LOOPBACK, a, nrs["socket"], AF_NETLINK, socket.SOCK_RAW, proto) == EPERM
    for family in (socket.AF_PACKET, 40):  # AF_VSOCK
        assert run_bpf(LOOPBACK, a, nrs["socket"], family, stream) == EPERM
    assert run_bpf(LOOPBACK, a, nrs["socketpair"], socket.AF_INET) == EPERM
    fastopen = 0x20000000
    for call, arg in launcher.FLAGS_ARG.items():
        if call not in nrs:
            continue
        args = [3, 0, 0, 0, 0, 0]
        assert run_bpf(LOOPBACK, a, nrs[call], *args) == ALLOW, call
        args[arg] = fastopen | 0x40
        assert run_bpf(LOOPBACK, a, nrs[call], *args) == EPERM, call
    assert run_bpf(LOOPBACK, a, nrs["setsockopt"], 3, 6, 30) == EPERM  # TCP_FASTOPEN_CONNECT
    assert run_bpf(LOOPBACK, a, nrs["setsockopt"], 3, 6, 1) == ALLOW  # TCP_NODELAY
    assert run_bpf(LOOPBACK, a, nrs["setsockopt"], 3, 1, 30) == ALLOW  # SOL_SOCKET 30
    # What would route a loopback connection's packets out of another interface: refused.
    for level, name in ((1, 25), (1, 62), (0, 4), (41, 5), (41, 6), (41, 57)):
        assert run_bpf(LOOPBACK, a, nrs["setsockopt"], 3, level, name) == EPERM, (level, name)
    # What torch, gloo and NCCL set: allowed (SO_REUSEADDR, SO_KEEPALIVE, IP_TOS, IPV6_V6ONLY).
    for level, name in ((1, 2), (1, 9), (0, 1), (41, 26)):
        assert run_bpf(LOOPBACK, a, nrs["setsockopt"], 3, level, name) == ALLOW, (level, name)
    for prog in (PROG, LOOPBACK):  # a listener of the job's own, in either mode
        assert run_bpf(prog, a, nrs["seccomp"], 1, 8) == EPERM
        assert run_bpf(prog, a, nrs["seccomp"], 1, 1) == ALLOW  # TSYNC alone
        assert run_bpf(prog, a, nrs["ptrace"]) == EPERM
        assert run_bpf(prog, a, nrs["clone3"]) == ENOSYS


def test_the_loopback_program_refuses_socketcalls_that_would_name_addresses_or_flags() -> None:
    i386 = ARCH["i386"]
    for call in (1, 2, 3, 4, 8, 9, 11, 14, 16, 20):
        assert run_bpf(LOOPBACK, i386, 102, call) == EPERM, call
    for call in (5, 6, 7, 10, 12, 13, 15, 17, 18, 19):  # accept, getsockname, recv, ...
        assert run_bpf(LOOPBACK, i386, 102, call) == ALLOW, call
    assert run_bpf(LOOPBACK, ARCH["x86_64"], 0x40000000 | 42) == EPERM  # x32 connect


def test_the_loopback_supervisor_is_inlined_once_and_shares_no_name_with_the_launcher() -> None:
    import ast
    from pathlib import Path

    def defined(source: str) -> set[str]:
        names: set[str] = set()
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        return names

    folder = Path(launcher.__file__).parent
    own = defined((folder / "launcher.py").read_text())
    inlined = defined((folder / "loopback.py").read_text())
    assert own & inlined == set()
    text = launcher_source()
    imports = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)]
    assert [n.module for n in imports if (n.module or "").startswith("job_launcher")] == []
    assert text.count("job_launcher/loopback.py, inlined by job_launcher.builder") == 1
    assert defined(text) == own | inlined
