"""The sandbox, checked from inside real jobs: each test's script is what an agent could submit."""

from __future__ import annotations

import json
import os
import platform
import socket
from pathlib import Path

import pytest

from job_launcher import launcher
from job_launcher.trusted_lines import read_score
from tests.processes import live_pids_of_uid

from .conftest import SCRIPT_PRELUDE, assert_ran

NRS = launcher.SYSCALLS[launcher.native_arch()]
IS_X86_64 = platform.machine() == "x86_64"


def script(body: str, **constants: object) -> str:
    """A job script: the prelude, JSON constants, then the body (dedented by run_job)."""
    consts = "".join(
        f"{k} = json.loads({json.dumps(json.dumps(v))})\n" for k, v in constants.items()
    )
    return SCRIPT_PRELUDE + consts + body


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------

# int 0x80 from a 64-bit process enters the kernel as i386 (AUDIT_ARCH_I386): the filter's i386
# table must refuse socket(2) there too. Machine code, since Python cannot issue int 0x80.
I386_PROBE = r"""
def i386_syscalls():
    import mmap, struct
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    MAP_32BIT = 0x40
    page = libc.mmap(None, 4096, 7, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_32BIT, -1, 0)
    args = page + 0x800
    ctypes.memmove(args, struct.pack("<III", socket.AF_INET, socket.SOCK_STREAM, 0), 12)
    def call(nr, ebx, ecx, edx):
        code = (b"\x53" + b"\xb8" + struct.pack("<I", nr) + b"\xbb" + struct.pack("<I", ebx)
                + b"\xb9" + struct.pack("<I", ecx) + b"\xba" + struct.pack("<I", edx)
                + b"\xcd\x80\x5b\xc3")
        ctypes.memmove(page, code, len(code))
        return ctypes.CFUNCTYPE(ctypes.c_int)(page)()
    return {
        "getpid": call(20, 0, 0, 0) == os.getpid(),
        "socket": call(359, socket.AF_INET, socket.SOCK_STREAM, 0),
        "socketcall": call(102, 1, args, 0),
        "unix": call(359, socket.AF_UNIX, socket.SOCK_STREAM, 0) >= 0,
    }
"""


def test_the_af_unix_only_filter_refuses_every_network_socket(run_job, http_server) -> None:
    # The fallback filter (and the loopback helper's), asked for here: with the loopback
    # policy on, TCP sockets open and their connects are checked (tests/launcher/test_loopback.py).
    body = (
        I386_PROBE
        + """
out = {}
for name, kind in [("AF_INET", socket.SOCK_STREAM), ("AF_INET_UDP", socket.SOCK_DGRAM),
                   ("AF_INET6", socket.SOCK_STREAM), ("AF_NETLINK", socket.SOCK_RAW),
                   ("AF_PACKET", socket.SOCK_RAW)]:
    try:
        socket.socket(getattr(socket, name.replace("_UDP", "")), kind).close()
        out[name] = 0
    except OSError as exc:
        out[name] = exc.errno
a, b = socket.socketpair()
a.sendall(b"ping")
out["socketpair"] = b.recv(4).decode()
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
u.bind(os.path.join(os.environ["HOME"], "sock"))
out["unix_bind"] = True
import urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{PORT}/from-the-job", timeout=5)
    out["http"] = "reached"
except Exception as exc:
    out["http"] = repr(exc)
out["x32_socket"] = sys_errno(0x40000000 | 41, socket.AF_INET, socket.SOCK_STREAM, 0)
if IS_X86_64:
    out["i386"] = i386_syscalls()
report(**out)
"""
    )
    result = run_job(script(body, PORT=http_server.port, IS_X86_64=IS_X86_64), loopback_tcp=False)
    assert_ran(result)
    assert result.payloads[1] == {
        "stage": "sandbox",
        "loopback_tcp": False,
        "loopback_reason": "the backend turned the loopback policy off",
    }
    out = result.report()
    for name in ("AF_INET", "AF_INET_UDP", "AF_INET6", "AF_NETLINK", "AF_PACKET"):
        assert out[name] == 1, name  # EPERM
    assert out["socketpair"] == "ping" and out["unix_bind"] is True
    assert "Operation not permitted" in out["http"]
    assert http_server.requests == []
    if IS_X86_64:
        assert out["x32_socket"] == 1
        assert out["i386"] == {"getpid": True, "socket": -1, "socketcall": -1, "unix": True}


@pytest.mark.skipif(not IS_X86_64, reason="int 0x80 probe is x86_64 machine code")
def test_the_i386_probe_opens_sockets_without_the_filter(tmp_path: Path) -> None:
    # Control for the test above: unfiltered, the same machine code does create an AF_INET socket.
    probe = SCRIPT_PRELUDE + I386_PROBE + "report(**i386_syscalls())\n"
    import subprocess

    out = subprocess.run(["/usr/bin/python3", "-c", probe], capture_output=True, check=True)
    values = json.loads(out.stdout.decode().split("REPORT ", 1)[1])
    assert values["getpid"] is True and values["socket"] >= 3 and values["socketcall"] >= 3


# ---------------------------------------------------------------------------------------------
# Cross-process access, namespaces and the rest of the deny list
# ---------------------------------------------------------------------------------------------


def test_cross_process_and_kernel_attack_surface_is_refused(run_job) -> None:
    body = """
import threading, subprocess
ppid = os.getppid()
iov = (ctypes.c_char * 8)()
out = {
    "io_uring_setup": sys_errno(NR["io_uring_setup"], 8, ctypes.addressof(iov)),
    "io_uring_enter": sys_errno(NR["io_uring_enter"], 0, 0, 0, 0, 0),
    "process_vm_readv": sys_errno(NR["process_vm_readv"], ppid, 0, 1, 0, 1, 0),
    "process_vm_writev": sys_errno(NR["process_vm_writev"], ppid, 0, 1, 0, 1, 0),
    "ptrace_traceme": sys_errno(NR["ptrace"], 0, 0, 0, 0),
    "ptrace_attach": sys_errno(NR["ptrace"], 16, ppid, 0, 0),
    "pidfd_getfd": sys_errno(NR["pidfd_getfd"], 0, 0, 0),
    "unshare_user": sys_errno(NR["unshare"], 0x10000000),
    "unshare_net": sys_errno(NR["unshare"], 0x40000000),
    "setns": sys_errno(NR["setns"], 0, 0),
    "bpf": sys_errno(NR["bpf"], 0, 0, 0),
    "userfaultfd": sys_errno(NR["userfaultfd"], 0),
    "perf_event_open": sys_errno(NR["perf_event_open"], 0, 0, -1, -1, 0),
    "keyctl": sys_errno(NR["keyctl"], 0, -3, 0),
    "add_key": sys_errno(NR["add_key"], 0, 0, 0, 0, 0),
    "mount": sys_errno(NR["mount"], 0, 0, 0, 0, 0),
    "fsopen": sys_errno(NR["fsopen"], 0, 0),
    "kcmp": sys_errno(NR["kcmp"], ppid, os.getpid(), 0, 0, 0),
    "finit_module": sys_errno(NR["finit_module"], -1, 0, 0),
    "clone3": sys_errno(NR["clone3"], 0, 0),
}
# clone(2) with a namespace flag: refused (if it ever forked, the child leaves at once).
rc = libc.syscall(ctypes.c_long(NR["clone"]), ctypes.c_long(0x10000000 | 17), 0, 0, 0, 0)
if rc == 0:
    os._exit(0)
out["clone_newuser"] = ctypes.get_errno() if rc == -1 else "forked"
# With clone3 refused, libc falls back to clone: threads, fork and subprocesses still work.
box = []
t = threading.Thread(target=lambda: box.append(1)); t.start(); t.join()
out["thread"] = box == [1]
out["subprocess"] = subprocess.run(["/bin/echo", "ok"], capture_output=True).stdout == b"ok\\n"
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
report(**out)
"""
    result = run_job(script(body, NR=NRS))
    assert_ran(result)
    out = result.report()
    clone3 = out.pop("clone3")
    assert clone3 == 38  # ENOSYS
    assert {k: v for k, v in out.items() if k not in ("thread", "subprocess", "fork")} == {
        k: 1 for k in out if k not in ("thread", "subprocess", "fork")
    }
    assert out["thread"] and out["subprocess"] and out["fork"]


def test_the_filter_holds_in_threads_subprocesses_and_multiprocessing_children(run_job) -> None:
    body = """
import multiprocessing, subprocess, threading

def probe():
    with open("/proc/self/status") as fh:
        mode = [l.split()[1] for l in fh if l.startswith("Seccomp:")][0]
    try:  # UDP: refused by either filter (the loopback policy's and AF_UNIX only)
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()
        return (mode, "socket opened")
    except OSError as exc:
        return (mode, exc.errno)

if __name__ == "__main__":
    out = {"main": probe()}
    box = []
    t = threading.Thread(target=lambda: box.append(probe())); t.start(); t.join()
    out["thread"] = box[0]
    child = subprocess.run([sys.executable, "-c", "import socket\\n"
        "try:\\n socket.socket(socket.AF_INET, socket.SOCK_DGRAM); print('opened')\\n"
        "except OSError as e: print(e.errno)"], capture_output=True, text=True)
    out["subprocess"] = child.stdout.strip()
    for method in ("fork", "spawn", "forkserver"):
        with multiprocessing.get_context(method).Pool(1) as pool:
            out[method] = pool.apply(probe)
    # A permissive filter stacked on top cannot lift ours, and no_new_privs cannot be unset.
    import struct
    allow = struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000)
    buf = ctypes.create_string_buffer(allow, len(allow))
    prog = struct.pack("HxxxxxxQ", 1, ctypes.addressof(buf))
    pbuf = ctypes.create_string_buffer(prog, len(prog))
    out["stack_rc"] = sys_errno(NR["seccomp"], 1, 0, ctypes.addressof(pbuf))
    out["after_stack"] = probe()
    out["unset_nnp"] = sys_errno(157, 38, 0, 0, 0, 0) if NR["socket"] == 41 else 22
    out["disable_seccomp"] = sys_errno(157, 22, 0, 0, 0, 0) if NR["socket"] == 41 else 22
    out["get_seccomp"] = libc.prctl(21, 0, 0, 0, 0)
    report(**out)
"""
    result = run_job(script(body, NR=NRS))
    assert_ran(result)
    out = result.report()
    for where in ("main", "thread", "fork", "spawn", "forkserver", "after_stack"):
        assert out[where] == ["2", 1], where
    assert out["subprocess"] == "1"
    assert out["stack_rc"] == 0  # the stacked filter was accepted …
    assert out["unset_nnp"] == 22 and out["disable_seccomp"] == 22  # EINVAL
    assert out["get_seccomp"] == 2


# ---------------------------------------------------------------------------------------------
# Fds, uid, files, environment
# ---------------------------------------------------------------------------------------------


def test_inherited_fds_are_closed_and_an_inherited_tcp_socket_is_unusable(
    job_root: Path, wheelhouse: Path
) -> None:
    from .conftest import job_config, run_launcher, write_launcher

    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server_side, _ = listener.accept()
    fds = [listener.fileno(), client.fileno(), server_side.fileno()]
    body = """
out = {"open": sorted(int(n) for n in os.listdir("/proc/self/fd")), "fds": {}}
for fd in FDS:
    try:
        os.fstat(fd)
        out["fds"][fd] = "open"
    except OSError as exc:
        out["fds"][fd] = exc.errno
    try:
        os.write(fd, b"leak")
    except OSError:
        pass
report(**out)
"""
    config = job_config(job_root, wheelhouse)
    launcher_path = write_launcher(job_root, script(body, FDS=fds), [], config)
    try:
        result = run_launcher(job_root, launcher_path, config, pass_fds=fds)
        assert_ran(result)
        out = result.report()
        assert out["fds"] == {str(fd): 9 for fd in fds}  # EBADF
        assert len(out["open"]) == 4 and out["open"][:3] == [0, 1, 2]  # + the listing's own fd
        server_side.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server_side.recv(4)  # nothing ever arrived through the inherited client socket
    finally:
        for s in (listener, client, server_side):
            s.close()


def test_a_tcp_socket_as_stdout_is_refused(job_root: Path, wheelhouse: Path) -> None:
    from .conftest import job_config, run_launcher, write_launcher

    marker = job_root / "data" / "outputs" / "ran"
    config = job_config(job_root, wheelhouse)
    launcher_path = write_launcher(job_root, f"open({str(marker)!r}, 'w')\n", [], config)
    listener = socket.create_server(("127.0.0.1", 0))
    writer = socket.create_connection(listener.getsockname())
    reader, _ = listener.accept()
    try:
        result = run_launcher(job_root, launcher_path, config, stdout=writer.fileno())
        writer.close()
        received = b""
        reader.settimeout(5)
        while chunk := reader.recv(65536):
            received += chunk
    finally:
        for s in (listener, writer, reader):
            s.close()
    from job_launcher.trusted_lines import LAUNCHER_TAG, trusted_payloads

    payloads = trusted_payloads(received.decode().splitlines(), LAUNCHER_TAG, result.nonce)
    assert payloads[-1]["stage"] == "fds" and "socket" in payloads[-1]["error"]
    assert result.returncode == launcher.NEVER_RAN_EXIT
    assert not marker.exists()


def test_the_script_runs_unprivileged_and_cannot_touch_the_launcher_or_the_broker(
    run_job,
) -> None:
    uid = 3_000_000 + os.getpid() % 1000
    body = """
import getpass, signal
ppid = os.getppid()
out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
       "user": getpass.getuser(), "cwd": os.getcwd()}
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = exc.errno
attempt("signal_parent", lambda: os.kill(ppid, signal.SIGTERM))
attempt("parent_environ", lambda: open(f"/proc/{ppid}/environ", "rb").read())
attempt("parent_mem", lambda: open(f"/proc/{ppid}/mem", "rb").read(1))
attempt("read_launcher", lambda: open(LAUNCHER, "rb").read())
attempt("write_data", lambda: open("not-outputs.txt", "w").write("x"))
attempt("write_venv", lambda: open(os.path.join(VENV, "x"), "w").write("x"))
attempt("write_script", lambda: open(__file__, "a").write("x"))
attempt("write_script_dir", lambda: open(os.path.join(os.path.dirname(__file__), "x"), "w"))
attempt("write_outputs", lambda: open("outputs/model.safetensors", "w").write("x"))
attempt("setuid_root", lambda: os.setuid(0))
# The nonce and the token: nowhere in this process, and in no other process this uid can read.
found = []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    for part in ("environ", "cmdline"):
        try:
            blob = open(f"/proc/{pid}/{part}", "rb").read()
        except OSError:
            continue
        if NONCE.encode() in blob or b"hf_secret_value" in blob:
            found.append(f"{pid}/{part}")
out["found"] = found
out["environ"] = sorted(os.environ)
out["env"] = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
              "TRANSFORMERS_OFFLINE", "USER", "LOGNAME")}
report(**out)
"""
    nonce = os.urandom(16).hex()
    constants = {
        "NONCE": nonce,
        "LAUNCHER": str(run_job.root / "launcher.py"),
        "VENV": str(run_job.root / "venv"),
    }
    result = run_job(
        script(body, **constants),
        env={"HF_TOKEN": "hf_secret_value", "HUGGING_FACE_HUB_TOKEN": "hf_secret_value"},
        nonce=nonce,
        uid=uid,
        gid=uid,
    )
    assert_ran(result)
    out = result.report()
    assert (out["uid"], out["euid"], out["gid"], out["groups"]) == (uid, uid, uid, [])
    assert out["user"] == "job" and out["cwd"] == str(result.data_dir)
    for name in ("signal_parent", "setuid_root"):
        assert out[name] == 1, name  # EPERM
    for name in (
        "parent_environ",
        "parent_mem",
        "read_launcher",
        "write_data",
        "write_venv",
        "write_script",
        "write_script_dir",
    ):
        assert out[name] == 13, name  # EACCES
    assert out["write_outputs"] == "ok"
    assert (result.data_dir / "outputs" / "model.safetensors").stat().st_uid == uid
    assert out["found"] == []
    allowed = (
        set(launcher.FIXED_ENV)
        | set(launcher.PASS_THROUGH_ENV)
        | {"HOME", "USER", "LOGNAME", "PATH", "VIRTUAL_ENV", "TMPDIR", launcher.LOOPBACK_ENV}
    )
    assert set(out["environ"]) <= allowed
    assert out["env"] == {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "USER": "job",
        "LOGNAME": "job",
    }
    assert live_pids_of_uid(uid) == []


def test_without_a_configured_uid_the_launcher_picks_an_unused_one(run_job) -> None:
    result = run_job(script("report(uid=os.getuid(), gid=os.getgid())\n"))
    assert_ran(result)
    out = result.report()
    assert out["uid"] >= 100_000 and out["gid"] == out["uid"]
    with open("/etc/passwd") as fh:
        assert str(out["uid"]) not in {line.split(":")[2] for line in fh}


# ---------------------------------------------------------------------------------------------
# Trusted lines
# ---------------------------------------------------------------------------------------------


def test_forged_lines_and_background_output_never_pass_for_the_supervisors(run_job) -> None:
    uid = 3_100_000 + os.getpid() % 1000
    body = """
import time
print('POSTTRAIN_LAUNCHER 0123456789abcdef {"stage":"exit","exit_code":0,"signal":null}')
print('POSTTRAIN_SCORE 0123456789abcdef {"score":1.0}')
print('POSTTRAIN_LAUNCHER  {"stage":"installed","packages":{}}', flush=True)
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork():
        os._exit(0)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: its /proc entry now shows root as owner
    while True:  # a detached grandchild that keeps printing after the script has exited
        print("LATE", flush=True)
        time.sleep(0.01)
os.waitpid(pid, 0)
time.sleep(0.1)
sys.stdout.write("a partial line without newline")
sys.stdout.flush()
"""
    result = run_job(script(body), uid=uid, gid=uid)
    assert [p["stage"] for p in result.payloads] == ["installed", "sandbox", "exit"]
    assert result.final == {"stage": "exit", "exit_code": 0, "signal": None, "loopback_tcp": True}
    lines = [line for line in result.lines if line.strip()]
    assert lines[-1].startswith(f"POSTTRAIN_LAUNCHER {result.nonce} ")
    assert "LATE" in result.stdout  # the background process did print …
    # … and the partial line never swallowed the supervisor's line, which stands alone.
    assert any("a partial line without newline" in line for line in lines[:-1])
    assert sum(result.nonce in line for line in lines) == 3  # installed, sandbox, exit
    assert read_score(result.lines, result.nonce).valid is False
    assert live_pids_of_uid(uid) == []


def test_exit_code_and_signal_are_reported_on_the_final_line(run_job) -> None:
    result = run_job("import sys\nprint('bye')\nsys.exit(3)\n")
    assert result.final == {"stage": "exit", "exit_code": 3, "signal": None, "loopback_tcp": True}
    assert result.returncode == 3
    result = run_job("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert result.final == {"stage": "exit", "exit_code": 137, "signal": 9, "loopback_tcp": True}


def test_a_missing_nonce_stops_the_launcher_before_anything_runs(run_job) -> None:
    result = run_job("open('outputs/ran', 'w')\n", nonce="")
    assert result.returncode == 2
    assert "POSTTRAIN_NONCE" in result.stderr
    assert not (result.data_dir / "outputs" / "ran").exists()


def test_terminating_the_launcher_stops_the_job_and_still_prints_the_final_line(
    job_root: Path, wheelhouse: Path
) -> None:
    import secrets
    import signal
    import subprocess

    from job_launcher.builder import NONCE_ENV
    from job_launcher.trusted_lines import LAUNCHER_TAG, trusted_payloads

    from .conftest import JOB_PYTHON, job_config, write_launcher

    config = job_config(job_root, wheelhouse)
    body = "import time\nprint('READY', flush=True)\ntime.sleep(120)\n"
    path = write_launcher(job_root, body, [], config)
    nonce = secrets.token_hex(16)
    proc = subprocess.Popen(
        [JOB_PYTHON, str(path)],
        env={"PATH": os.environ["PATH"], NONCE_ENV: nonce},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.strip() == "READY":
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=30)
    payloads = trusted_payloads((*seen, *rest.splitlines()), LAUNCHER_TAG, nonce)
    assert payloads[-1] == {"stage": "exit", "exit_code": 143, "signal": 15, "loopback_tcp": True}
    assert proc.returncode == 143


def test_a_tree_1500_folders_deep_in_home_is_removed_and_the_exit_line_still_follows(
    run_job,
) -> None:
    # shutil.rmtree recurses: on this tree it raised RecursionError and the launcher died
    # before its exit line (issue 17).
    script = (
        "import os\n"
        "home = os.environ['HOME']\n"
        "os.chdir(home)\n"
        "for _ in range(1500):\n"
        "    os.mkdir('d')\n"
        "    os.chdir('d')\n"
        "open('bottom', 'w').write('x')\n"
        "os.symlink('/', 'root-link')\n"
        "print('REPORT ' + repr(home), flush=True)\n"
    )
    result = run_job(script)
    assert_ran(result)
    home = next(line for line in result.lines if line.startswith("REPORT "))[len("REPORT ") :]
    assert not os.path.exists(home.strip("'"))
