"""The loopback-only TCP policy (job_launcher/loopback.py), from inside real jobs run as root the
way the local backend and Hugging Face run them: what a job's own processes may do over TCP,
and every way out that stays shut, with the policy on and where a container's default profile
makes the launcher fall back to AF_UNIX only (tests/launcher/container_profile.py).

These jobs share this machine's network namespace, so "outside" is real here: a server of the
test's own on this machine's other address and on its loopback counts every connection."""

from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from job_launcher import launcher

from .conftest import JOB_PYTHON, SCRIPT_PRELUDE, assert_ran, job_config, write_launcher

NRS = launcher.SYSCALLS[launcher.native_arch()]
IS_X86_64 = platform.machine() == "x86_64"
ON = {"stage": "sandbox", "loopback_tcp": True}


def script(body: str, **constants: object) -> str:
    consts = "".join(
        f"{k} = json.loads({json.dumps(json.dumps(v))})\n" for k, v in constants.items()
    )
    return SCRIPT_PRELUDE + consts + body


def this_machines_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def children_of(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(name))
            except OSError:
                continue
    return found


def uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith("Uid:")).split()[1])


class CountingServer:
    """A TCP server outside the job (root's): every connection it accepts is an escape."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(str(peer))
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


# Where the escape scripts aim, besides this machine's own addresses: a packet to any of them
# on an interface but loopback is an escape, and so is one to a loopback address or with a
# source route (IPv4 options, an IPv6 routing header) anywhere but on loopback.
AIMED_AT = {"10.0.0.1", "1.1.1.1", "169.254.169.254", "224.0.0.1", "::ffff:1.1.1.1", "fe80::1",
            "ff02::1", "2606:4700::1111"}  # fmt: skip
ETH_P_ALL, IPV6_ROUTING_HEADER = 0x0003, 43
# The name the job asks the resolver for: a query for it on the wire is the job's. (The
# resolver itself is asked by everything else on the machine: a loaded run saw another
# process's query to it taken for the job's.)
PROBE_NAME = "posttrain-leak-probe.example.com"
PROBE_LABELS = b"".join(bytes([len(part)]) + part.encode() for part in PROBE_NAME.split("."))


def resolvers() -> set[str]:
    try:
        with open("/etc/resolv.conf") as fh:
            return {line.split()[1] for line in fh if line.startswith("nameserver ")}
    except OSError:
        return set()


class LeakSniffer:
    """Every packet this machine sends on an interface other than loopback (AF_PACKET, root)
    while a job runs, kept when it is one of the job's ways out (AIMED_AT, the resolvers, a
    loopback destination, a source route). Other engineers' traffic on a shared machine goes
    elsewhere, but for the resolvers: a packet to one is the job's only when it asks for
    PROBE_NAME."""

    def __init__(self) -> None:
        self.aimed = set(AIMED_AT)
        self.resolvers = resolvers()
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.settimeout(0.05)
        self.leaks: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sniff, daemon=True)
        self._thread.start()

    def _sniff(self) -> None:
        while not self._stop.is_set():
            try:
                packet, (interface, _proto, kind, *_rest) = self.sock.recvfrom(65536)
            except TimeoutError:
                continue
            if interface != "lo" and kind == socket.PACKET_OUTGOING:
                why = self.leak(packet[14:])
                if why:
                    self.leaks.append(f"{interface}: {why}")

    def leak(self, ip: bytes) -> str:
        if len(ip) >= 20 and ip[0] >> 4 == 4:
            dst = socket.inet_ntoa(ip[16:20])
            if dst in self.resolvers and PROBE_LABELS in ip:
                return f"IPv4 to {dst}, a query for {PROBE_NAME}"
            if dst in self.aimed or dst.startswith("127.") or ip[0] & 0xF > 5:
                return f"IPv4 to {dst}, header {ip[0] & 0xF} words"
        if len(ip) >= 40 and ip[0] >> 4 == 6:
            dst = socket.inet_ntop(socket.AF_INET6, ip[24:40])
            if dst in self.resolvers and PROBE_LABELS in ip:
                return f"IPv6 to {dst}, a query for {PROBE_NAME}"
            if dst in self.aimed or dst == "::1" or ip[6] == IPV6_ROUTING_HEADER:
                return f"IPv6 to {dst}, next header {ip[6]}"
        return ""

    def close(self) -> list[str]:
        self._stop.set()
        self._thread.join()
        self.sock.close()
        return self.leaks


@pytest.fixture
def sniffer() -> Iterator[LeakSniffer]:
    watching = LeakSniffer()
    yield watching
    watching.close()


@pytest.fixture
def outside() -> Iterator[dict[str, CountingServer]]:
    """Servers the job must never reach: on every address of this machine (0.0.0.0, so also its
    loopback: a listener of another uid) and on its loopback only."""
    servers = {"any": CountingServer("0.0.0.0"), "loopback": CountingServer("127.0.0.1")}
    yield servers
    for server in servers.values():
        server.close()


# ---------------------------------------------------------------------------------------------
# What works: TCP between a job's own processes
# ---------------------------------------------------------------------------------------------

OWN_TCP = """
import multiprocessing, struct, sys
def serve(sock, replies):
    for _ in range(replies):
        conn, _ = sock.accept()
        conn.sendall(conn.recv(64).upper())
        conn.close()

def exchange(family, address, port):
    with socket.socket(family) as c:
        c.connect((address, port))
        c.sendall(b"ping")
        return c.recv(64).decode()

out = {"env": os.environ["POSTTRAIN_LOOPBACK_TCP"]}
v4 = socket.socket(); v4.bind(("0.0.0.0", 0)); v4.listen()          # the wildcard: loopback
dual = socket.socket(socket.AF_INET6); dual.bind(("::", 0)); dual.listen()  # v4 loopback
only6 = socket.socket(socket.AF_INET6)
only6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
only6.bind(("::", 0)); only6.listen()                                # v6 loopback
unbound = socket.socket(); unbound.listen()                          # listen binds loopback
out["bound"] = [s.getsockname()[0] for s in (v4, dual, only6, unbound)]
children = [multiprocessing.Process(target=serve, args=(s, n)) for s, n in
            ((v4, 2), (dual, 1), (only6, 1), (unbound, 1))]
for child in children:
    child.start()
out["v4"] = exchange(socket.AF_INET, "127.0.0.1", v4.getsockname()[1])
out["any_is_local"] = exchange(socket.AF_INET, "0.0.0.0", v4.getsockname()[1])
out["dual_from_v4"] = exchange(socket.AF_INET, "127.0.0.1", dual.getsockname()[1])
out["v6"] = exchange(socket.AF_INET6, "::1", only6.getsockname()[1])
out["unbound"] = exchange(socket.AF_INET, "127.0.0.1", unbound.getsockname()[1])
for child in children:
    child.join()
nb = socket.socket(); nb.setblocking(False)
out["nonblocking"] = nb.connect_ex(("127.0.0.1", v4.getsockname()[1]))
out["refused"] = socket.socket().connect_ex(("127.0.0.1", 1))
low = socket.socket()
try:
    low.bind(("127.0.0.1", 80)); out["low_port"] = 0
except OSError as exc:
    out["low_port"] = exc.errno
# AF_UNIX: made as the job, in its cwd, with its umask.
os.chdir(os.environ["HOME"]); os.umask(0o077)
server = socket.socket(socket.AF_UNIX); server.bind("relative.sock"); server.listen()
client = socket.socket(socket.AF_UNIX); client.connect("relative.sock")
conn, _ = server.accept()
uid_of_peer = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
st = os.stat("relative.sock")
out["unix"] = {"owner": st.st_uid, "mode": oct(st.st_mode & 0o777), "peer": uid_of_peer}
try:
    socket.socket(socket.AF_UNIX).connect(ROOT_ONLY)
    out["root_only"] = 0
except OSError as exc:
    out["root_only"] = exc.errno
report(**out)
"""


def test_a_jobs_own_processes_talk_tcp_on_loopback_and_wildcards_bind_loopback(run_job) -> None:
    folder = Path(tempfile.mkdtemp(prefix="posttrain-root-only-"))
    os.chmod(folder, 0o755)
    root_only = socket.socket(socket.AF_UNIX)
    root_only.bind(str(folder / "root.sock"))  # root's, mode 0755 minus umask: not writable
    os.chmod(folder / "root.sock", 0o700)
    root_only.listen()
    root_only.settimeout(0)
    try:
        result = run_job(script(OWN_TCP, ROOT_ONLY=str(folder / "root.sock")))
        with pytest.raises(BlockingIOError):
            root_only.accept()  # the job's connect never reached it
    finally:
        root_only.close()
        shutil.rmtree(folder)
    assert_ran(result)
    assert result.payloads[1] == ON
    out = result.report()
    assert out["env"] == "1"
    assert out["bound"] == ["127.0.0.1", "::ffff:127.0.0.1", "::1", "127.0.0.1"]
    for key in ("v4", "any_is_local", "dual_from_v4", "v6", "unbound"):
        assert out[key] == "PING", key
    assert out["nonblocking"] in (0, errno.EINPROGRESS)
    assert out["refused"] == errno.ECONNREFUSED  # nothing listens there: the kernel's answer
    assert out["low_port"] == errno.EACCES  # as for any unprivileged uid
    uid = out["unix"]["owner"]
    assert uid != 0 and out["unix"] == {"owner": uid, "mode": "0o700", "peer": uid}
    assert out["root_only"] == errno.EACCES  # as the job, never as root


# ---------------------------------------------------------------------------------------------
# What stays shut
# ---------------------------------------------------------------------------------------------

# A static binary (no libc of the job's, no Python) making the calls itself.
STATIC_PROBE_C = r"""
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(argv[2]));
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    long tcp = syscall(SYS_socket, AF_INET, SOCK_STREAM, 0);
    int tcp_err = tcp < 0 ? errno : 0, connect_err = -1;
    if (tcp >= 0) connect_err = syscall(SYS_connect, tcp, &a, sizeof a) < 0 ? errno : 0;
    long udp = syscall(SYS_socket, AF_INET, SOCK_DGRAM, 0);
    int udp_err = udp < 0 ? errno : 0;
    if (udp >= 0) udp_err = syscall(SYS_sendto, udp, "x", 1, 0, &a, sizeof a) < 0 ? errno : 0;
    printf("STATIC {\"socket\": %d, \"connect\": %d, \"udp\": %d}\n", tcp_err, connect_err,
           udp_err);
    return 0;
}
"""


@pytest.fixture(scope="session")
def static_probe() -> Iterator[Path]:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("these tests build a static binary with gcc (apt-get install gcc)")
    folder = Path(tempfile.mkdtemp(prefix="posttrain-static-"))
    os.chmod(folder, 0o755)
    source = folder / "probe.c"
    source.write_text(STATIC_PROBE_C)
    subprocess.run([gcc, "-static", "-O1", "-o", str(folder / "probe"), str(source)], check=True)
    os.chmod(folder / "probe", 0o755)
    yield folder / "probe"
    shutil.rmtree(folder)


ESCAPES = r"""
import subprocess, threading
def tcp_connect(family, address):
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        return ("socket", exc.errno)
    with s:
        return ("connect", s.connect_ex(address))

def make(family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        return 0
    except OSError as exc:
        return exc.errno

out = {}
targets = {"10.0.0.1": ("10.0.0.1", 80), "1.1.1.1": ("1.1.1.1", 443),
           "link_local": ("169.254.169.254", 80), "multicast": ("224.0.0.1", 80)}
for name, target in targets.items():
    out[name] = tcp_connect(socket.AF_INET, target)
targets6 = {"mapped_1.1.1.1": ("::ffff:1.1.1.1", 443), "v6_link_local": ("fe80::1", 80),
            "v6_multicast": ("ff02::1", 80), "v6_global": ("2606:4700::1111", 443)}
for name, target in targets6.items():
    out[name] = tcp_connect(socket.AF_INET6, target)
if MACHINE:
    out["machine"] = tcp_connect(socket.AF_INET, (MACHINE, ANY_PORT))
    out["machine_mapped"] = tcp_connect(socket.AF_INET6, ("::ffff:" + MACHINE, ANY_PORT))
out["others_loopback"] = tcp_connect(socket.AF_INET, ("127.0.0.1", LOOPBACK_PORT))
out["others_wildcard"] = tcp_connect(socket.AF_INET, ("127.0.0.1", ANY_PORT))
out["others_mapped"] = tcp_connect(socket.AF_INET6, ("::ffff:127.0.0.1", LOOPBACK_PORT))
out["dns_stub"] = tcp_connect(socket.AF_INET, ("127.0.0.53", 53))
out["udp"] = make(socket.AF_INET, socket.SOCK_DGRAM)
out["udp6"] = make(socket.AF_INET6, socket.SOCK_DGRAM)
out["raw"] = make(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
out["packet"] = make(socket.AF_PACKET, socket.SOCK_RAW)
out["sctp_stream"] = make(socket.AF_INET, socket.SOCK_STREAM, 132)
out["mptcp"] = make(socket.AF_INET, socket.SOCK_STREAM, 262)
out["netlink_diag"] = make(socket.AF_NETLINK, socket.SOCK_RAW, 4)
out["netlink_uevent"] = make(socket.AF_NETLINK, socket.SOCK_DGRAM, 15)
try:
    socket.getaddrinfo("posttrain-leak-probe.example.com", 443)  # PROBE_NAME
    out["dns"] = "resolved"
except OSError as exc:
    out["dns"] = type(exc).__name__
# Options that would route a loopback connection's packets out of another interface: set on a
# fresh socket, and on one connected to the job's own listener already.
try:
    own = socket.socket(); own.bind(("127.0.0.1", 0)); own.listen()
except OSError:
    pass  # AF_UNIX only: every option() below fails at its socket()
def option(family, level, name, value, connected=False):
    try:
        s = socket.socket(family)
    except OSError as exc:
        return ("socket", exc.errno)
    with s:
        s.settimeout(3)  # a SYN sent elsewhere is never answered
        if connected:
            s.connect(own.getsockname())
        try:
            s.setsockopt(level, name, value)
            return ("set", 0 if connected else s.connect_ex(own.getsockname()))
        except OSError as exc:
            return ("set", exc.errno)
LSRR = bytes([1, 131, 7, 4]) + socket.inet_aton("1.1.1.1")  # a loose source route via 1.1.1.1
SRH = bytes([59, 2, 4, 0, 0, 0, 0, 0]) + socket.inet_pton(socket.AF_INET6, "2606:4700::1111")
out["source_route"] = option(socket.AF_INET, 0, 4, LSRR)
out["source_route_connected"] = option(socket.AF_INET, 0, 4, LSRR, connected=True)
out["routing_header"] = option(socket.AF_INET6, 41, 57, SRH)
out["routing_header_2292"] = option(socket.AF_INET6, 41, 5, SRH)
for device in (b"eth0", b"lo"):
    out["bind_device_" + device.decode()] = option(socket.AF_INET, 1, 25, device)
out["bind_device_connected"] = option(socket.AF_INET, 1, 25, b"eth0", connected=True)
out["bind_ifindex"] = option(socket.AF_INET, 1, 62, struct.pack("=i", 2))
try:
    s = socket.socket()
    out["fastopen_sendto"] = sys_errno(NR["sendto"], s.fileno(), 0, 0, 0x20000000,
                                       ctypes.addressof(OUTSIDE), 16)
    out["fastopen_connect_opt"] = sys_errno(NR["setsockopt"], s.fileno(), 6, 30,
                                            ctypes.addressof(ONE), 4)
except OSError as exc:
    out["fastopen_sendto"] = out["fastopen_connect_opt"] = ("socket", exc.errno)
out["userfaultfd"] = sys_errno(NR["userfaultfd"], 0)
out["io_uring"] = sys_errno(NR["io_uring_setup"], 8, ctypes.addressof(PARAMS))
# A filter of the job's own with a listener would answer "continue" for itself.
allow = (ctypes.c_ubyte * 8).from_buffer_copy(bytes.fromhex("060000000000ff7f"))
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(1, ctypes.addressof(allow))
out["own_listener"] = sys_errno(NR["seccomp"], 1, 8, ctypes.addressof(fprog))
out["static"] = json.loads(subprocess.run([STATIC, "1.1.1.1", "443"], capture_output=True,
                                          text=True).stdout.split("STATIC ", 1)[1])
report(**out)
"""
PRELUDE_BUFFERS = """
import struct
OUTSIDE = ctypes.create_string_buffer(struct.pack("=H", 2) + struct.pack(">H", 443)
                                      + bytes([1, 1, 1, 1]) + bytes(8), 16)
ONE = ctypes.c_int(1)
PARAMS = (ctypes.c_char * 120)()
"""


@pytest.mark.parametrize("profile", [None, "seccomp+caps", "caps"])
def test_every_way_out_stays_shut(run_job, outside, sniffer, static_probe, profile) -> None:
    """The issue's list, with the policy on (no profile) and where a container's defaults make
    the launcher fall back to AF_UNIX only (its sandbox line says why)."""
    machine = this_machines_address()
    body = PRELUDE_BUFFERS + ESCAPES
    constants = {
        "NR": NRS,
        "MACHINE": machine,
        "ANY_PORT": outside["any"].port,
        "LOOPBACK_PORT": outside["loopback"].port,
        "STATIC": str(static_probe),
    }
    result = run_job(script(body, **constants), profile=profile)
    assert_ran(result)
    assert {s.port: s.accepted for s in outside.values()} == {s.port: [] for s in outside.values()}
    assert sniffer.close() == []  # not one packet of the job's left by another interface
    out = result.report()
    if profile is None:
        assert result.payloads[1] == ON
        refused = ("connect", errno.EPERM)  # by the supervisor, before any packet
        socket_refused = errno.EPERM
    else:
        sandbox = result.payloads[1]
        assert sandbox["loopback_tcp"] is False and "pidfd_getfd" in sandbox["loopback_reason"], (
            sandbox
        )
        refused = ("socket", errno.EPERM)  # AF_UNIX only: no TCP socket at all
        socket_refused = errno.EPERM
    for name in ("10.0.0.1", "1.1.1.1", "link_local", "multicast", "mapped_1.1.1.1",
                 "v6_link_local", "v6_multicast", "v6_global", "others_loopback",
                 "others_wildcard", "others_mapped"):  # fmt: skip
        assert tuple(out[name]) == refused, name
    if machine is not None:
        assert tuple(out["machine"]) == refused and tuple(out["machine_mapped"]) == refused
    # Nothing of the job listens on the stub resolver's address: the kernel's own answer.
    assert tuple(out["dns_stub"]) in (refused, ("connect", errno.ECONNREFUSED))
    for name in ("udp", "udp6", "raw", "packet", "sctp_stream", "mptcp", "netlink_diag",
                 "netlink_uevent", "userfaultfd", "io_uring", "own_listener"):  # fmt: skip
        assert out[name] == socket_refused, name
    assert out["dns"] == "gaierror"
    routes = (
        *("source_route", "source_route_connected", "routing_header", "routing_header_2292"),
        *("bind_device_eth0", "bind_device_lo", "bind_device_connected", "bind_ifindex"),
    )
    if profile is None:
        assert out["fastopen_sendto"] == errno.EPERM
        assert out["fastopen_connect_opt"] == errno.EPERM
        assert out["static"] == {"socket": 0, "connect": errno.EPERM, "udp": errno.EPERM}
        for name in routes:  # refused in-kernel, before and after a connect
            assert tuple(out[name]) == ("set", errno.EPERM), name
    else:
        assert tuple(out["fastopen_sendto"]) == ("socket", errno.EPERM)
        assert out["static"] == {"socket": errno.EPERM, "connect": -1, "udp": errno.EPERM}
        for name in routes:
            assert tuple(out[name]) == ("socket", errno.EPERM), name


# int 0x80 from a 64-bit process: the i386 entry to connect and socketcall, on a TCP socket
# made the 64-bit way.
I386_CONNECT = r"""
import mmap, struct
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
page = libc.mmap(None, 4096, 7, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40, -1, 0)
addr, args = page + 0x800, page + 0x900
def call(nr, ebx, ecx, edx):
    code = (b"\x53" + b"\xb8" + struct.pack("<I", nr) + b"\xbb" + struct.pack("<I", ebx)
            + b"\xb9" + struct.pack("<I", ecx) + b"\xba" + struct.pack("<I", edx)
            + b"\xcd\x80\x5b\xc3")
    ctypes.memmove(page, code, len(code))
    return ctypes.CFUNCTYPE(ctypes.c_int)(page)()
def sockaddr(ip, port):
    return struct.pack("=H", 2) + struct.pack(">H", port) + socket.inet_aton(ip) + bytes(8)
out = {}
own = socket.socket(); own.bind(("127.0.0.1", 0)); own.listen()
for name, ip, port in (("outside", "1.1.1.1", 443), ("own", "127.0.0.1", own.getsockname()[1])):
    s = socket.socket()
    ctypes.memmove(addr, sockaddr(ip, port), 16)
    out[name] = call(362, s.fileno(), addr, 16)  # i386 connect: -errno or 0
    t = socket.socket()
    ctypes.memmove(args, struct.pack("<III", t.fileno(), addr, 16), 12)
    out[name + "_socketcall"] = call(102, 3, args, 0)  # socketcall(SYS_CONNECT, ...)
report(**out)
"""


@pytest.mark.skipif(not IS_X86_64, reason="int 0x80 is x86_64 machine code")
def test_the_i386_entry_is_trapped_or_refused_too(run_job) -> None:
    result = run_job(script(I386_CONNECT))
    assert_ran(result)
    assert result.report() == {
        "outside": -errno.EPERM,  # to the supervisor, which reads the i386 arguments
        "own": 0,
        "outside_socketcall": -errno.EPERM,  # its arguments are in memory: refused in-kernel
        "own_socketcall": -errno.EPERM,
    }


RACE = r"""
import threading, struct
own = socket.socket(); own.bind(("127.0.0.1", 0)); own.listen(4096)
def drain():
    while True:
        c, _ = own.accept(); c.close()
threading.Thread(target=drain, daemon=True).start()
def sockaddr(ip, port):
    return struct.pack("=H", 2) + struct.pack(">H", port) + socket.inet_aton(ip) + bytes(8)
good, bad = sockaddr("127.0.0.1", own.getsockname()[1]), sockaddr(OUTSIDE_IP, OUTSIDE_PORT)
buf = ctypes.create_string_buffer(good, 16)
stop = False
def flip():  # rewrites the address the main thread passes, as fast as it can
    while not stop:
        ctypes.memmove(buf, bad, 16)
        ctypes.memmove(buf, good, 16)
threading.Thread(target=flip, daemon=True).start()
libc.connect.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32]
results = {}
for _ in range(ROUNDS):
    s = socket.socket()
    rc = libc.connect(s.fileno(), buf, 16)
    e = 0 if rc == 0 else ctypes.get_errno()
    if e == 0:
        peer = s.getpeername()
        e = "own" if peer == own.getsockname() else "ESCAPED " + repr(peer)
    results[str(e)] = results.get(str(e), 0) + 1
    s.close()
stop = True
# And the fd: a second thread swaps an AF_UNIX socket and a TCP one on the fd number the main
# thread connects to the outside address.
tcp, unix = socket.socket(), socket.socket(socket.AF_UNIX)
target = os.dup(tcp.fileno())
swap_stop = False
def swap():
    while not swap_stop:
        os.dup2(unix.fileno(), target)
        os.dup2(tcp.fileno(), target)
threading.Thread(target=swap, daemon=True).start()
bad_buf = ctypes.create_string_buffer(bad, 16)
swapped = {}
for _ in range(ROUNDS // 4):
    rc = libc.connect(target, bad_buf, 16)
    e = "0" if rc == 0 else str(ctypes.get_errno())
    swapped[e] = swapped.get(e, 0) + 1
swap_stop = True
report(results=results, swapped=swapped)
"""


def test_a_second_thread_rewriting_the_address_or_the_fd_never_gets_a_connection_out(
    run_job, outside
) -> None:
    rounds = 4000
    target = this_machines_address() or "127.0.0.1"  # loopback: the server is root's
    result = run_job(
        script(RACE, OUTSIDE_IP=target, OUTSIDE_PORT=outside["any"].port, ROUNDS=rounds),
        timeout=300,
    )
    assert_ran(result)
    assert outside["any"].accepted == []
    out = result.report()
    assert set(out["results"]) <= {"own", str(errno.EPERM)}, out
    assert sum(out["results"].values()) == rounds
    assert out["results"].get("own", 0) > 0  # the race ran both ways
    assert out["results"].get(str(errno.EPERM), 0) > 0
    # A TCP socket with the outside address: EPERM; an AF_UNIX one: the kernel's EINVAL (the
    # helper makes the call); EISCONN never: nothing connected it.
    assert set(out["swapped"]) <= {str(errno.EPERM), str(errno.EINVAL)}, out


# ---------------------------------------------------------------------------------------------
# The supervisor, out of reach; its death fails closed
# ---------------------------------------------------------------------------------------------

REACH = r"""
import glob
me, launcher_pid = os.getpid(), os.getppid()
def parent_of(pid):
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])
def uid_of(pid):
    with open(f"/proc/{pid}/status") as fh:
        return int(next(l for l in fh if l.startswith("Uid:")).split()[1])
supervisor = next(int(p.split("/")[2]) for p in glob.glob("/proc/[0-9]*")
                  if int(p.split("/")[2]) != me and parent_of(int(p.split("/")[2])) == launcher_pid)
helper = next(int(p.split("/")[2]) for p in glob.glob("/proc/[0-9]*")
              if parent_of(int(p.split("/")[2])) == supervisor)
out = {"supervisor_uid": uid_of(supervisor), "helper_uid": uid_of(helper), "me": os.getuid()}
for who, pid in (("supervisor", supervisor), ("helper", helper)):
    for what in ("mem", "environ", "fd/0", "maps"):
        try:
            open(f"/proc/{pid}/{what}", "rb").read(1)
            out[f"{who}_{what}"] = "read"
        except OSError as exc:
            out[f"{who}_{what}"] = exc.errno
    out[f"{who}_ptrace"] = sys_errno(NR["ptrace"], 16, pid, 0, 0)  # PTRACE_ATTACH
    out[f"{who}_vm_readv"] = sys_errno(NR["process_vm_readv"], pid, 0, 1, 0, 1, 0)
    out[f"{who}_pidfd_getfd"] = sys_errno(NR["pidfd_getfd"], 0, 0, 0)
for sig in (0, signal.SIGSTOP, signal.SIGKILL):
    try:
        os.kill(supervisor, sig)
        out[f"signal_{int(sig)}"] = 0
    except OSError as exc:
        out[f"signal_{int(sig)}"] = exc.errno
report(**out)
"""


def test_the_supervisor_is_out_of_the_jobs_reach(run_job) -> None:
    result = run_job(script("import signal\n" + REACH, NR=NRS))
    assert_ran(result)
    out = result.report()
    assert out["supervisor_uid"] == 0 and out["helper_uid"] == out["me"] != 0
    for who in ("supervisor", "helper"):
        for what in ("mem", "environ", "fd/0"):
            assert out[f"{who}_{what}"] == errno.EACCES, (who, what)
        assert out[f"{who}_ptrace"] == errno.EPERM  # the filter
        assert out[f"{who}_vm_readv"] == errno.EPERM
        assert out[f"{who}_pidfd_getfd"] == errno.EPERM
    assert out["supervisor_maps"] == errno.EACCES
    assert {k: v for k, v in out.items() if k.startswith("signal_")} == {
        "signal_0": errno.EPERM,
        "signal_19": errno.EPERM,
        "signal_9": errno.EPERM,
    }


DIES = r"""
own = socket.socket(); own.bind(("127.0.0.1", 0)); own.listen()
before = socket.socket(); before.connect(own.getsockname()); peer, _ = own.accept()
print("READY", flush=True)
while not os.path.exists(GO):
    time.sleep(0.02)
out = {}
out["connect"] = socket.socket().connect_ex(own.getsockname())
try:
    socket.socket().bind(("127.0.0.1", 0)); out["bind"] = 0
except OSError as exc:
    out["bind"] = exc.errno
u = socket.socket(socket.AF_UNIX)
try:
    u.bind(os.path.join(os.environ["HOME"], "u.sock")); out["unix_bind"] = 0
except OSError as exc:
    out["unix_bind"] = exc.errno
before.sendall(b"still"); out["data"] = peer.recv(5).decode()  # no trap on the data path
report(**out)
"""


def test_when_the_supervisor_dies_every_trapped_call_fails_closed(run_job, job_root) -> None:
    go = job_root / "data" / "go"
    config = job_config(job_root, None)
    path = write_launcher(job_root, script("import time\n" + DIES, GO=str(go)), [], config)
    env = {"PATH": os.environ["PATH"], "HOME": "/root", "POSTTRAIN_NONCE": "n" * 32}
    proc = subprocess.Popen(
        [JOB_PYTHON, str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("READY"):
            break
    supervisors = [pid for pid in children_of(proc.pid) if uid_of(pid) == 0]
    assert len(supervisors) == 1, children_of(proc.pid)
    os.kill(supervisors[0], signal.SIGKILL)
    go.write_text("go")
    stdout, stderr = proc.communicate(timeout=60)
    report = next(line for line in stdout.splitlines() if line.startswith("REPORT "))
    assert json.loads(report[len("REPORT ") :]) == {
        "connect": errno.ENOSYS,
        "bind": errno.ENOSYS,
        "unix_bind": errno.ENOSYS,
        "data": "still",
    }, stderr
    assert '"stage":"exit"' in stdout.splitlines()[-1] and proc.returncode == 0


PASSED_IN = r"""
import array
c = socket.socket(socket.AF_UNIX); c.connect(GIVER)
msg, anc, _, _ = c.recvmsg(16, socket.CMSG_LEN(2 * 4))
tcp_fd, udp_fd = array.array("i", anc[0][2])
tcp = socket.socket(fileno=tcp_fd); udp = socket.socket(fileno=udp_fd)
out = {"families": [tcp.type, udp.type],
       "tcp_outside": tcp.connect_ex(("1.1.1.1", 443)),
       "udp_connect": udp.connect_ex(("1.1.1.1", 53))}
try:
    udp.bind(("0.0.0.0", 0)); out["udp_bind"] = 0
except OSError as exc:
    out["udp_bind"] = exc.errno
report(**out)
"""


def test_a_socket_passed_in_over_af_unix_is_checked_like_any(run_job, job_root) -> None:
    folder = job_root / "giver"
    folder.mkdir(mode=0o755)
    giver = socket.socket(socket.AF_UNIX)
    giver.bind(str(folder / "giver.sock"))
    os.chmod(folder / "giver.sock", 0o777)
    giver.listen()

    def give() -> None:
        conn, _ = giver.accept()
        tcp, udp = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        socket.send_fds(conn, [b"x"], [tcp.fileno(), udp.fileno()])
        conn.close()

    thread = threading.Thread(target=give, daemon=True)
    thread.start()
    try:
        result = run_job(script(PASSED_IN, GIVER=str(folder / "giver.sock")))
    finally:
        giver.close()
    assert_ran(result)
    assert result.report() == {
        "families": [socket.SOCK_STREAM, socket.SOCK_DGRAM],
        "tcp_outside": errno.EPERM,
        "udp_connect": errno.EPERM,  # not a kind the job may make: refused whatever it names
        "udp_bind": errno.EPERM,
    }
