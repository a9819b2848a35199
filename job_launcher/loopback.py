"""Loopback-only TCP for a job (DESIGN §6 item 4, issue 42): the seccomp supervisor that performs
a job's connect, bind and listen itself.

Standard library only, Python >= 3.10, Linux. `job_launcher.builder` inlines this file into the
launcher in place of launcher.py's one `from job_launcher.loopback import ...` statement, so a
job still uploads one file; hence no `from __future__` import here and nothing of the project.

The launcher's filter (launcher.py, `seccomp_program(loopback=True)`) lets a job create AF_UNIX
sockets, TCP ones (AF_INET/AF_INET6, SOCK_STREAM, protocol 0 or IPPROTO_TCP) and NETLINK_ROUTE
ones (getifaddrs(3) needs one: gloo's and NCCL's `*_SOCKET_IFNAME=lo` look the interface up
with it); it refuses in-kernel whatever would send a TCP packet to an address the supervisor
never sees: MSG_FASTOPEN, TCP_FASTOPEN_CONNECT, and source routes (IP_OPTIONS; IPV6_RTHDR and
its RFC 2292 forms: a SYN to 127.0.0.1 with a loose source route through an outside address
leaves by that address, measured here). Every connect, bind and listen comes here
(SECCOMP_RET_USER_NOTIF): BPF cannot see an fd's family, nor an address in memory. For each, a
worker thread of the supervisor process

1. opens the calling thread with pidfd_open and takes its own copy of the socket with
   pidfd_getfd: the very socket the job named, whatever the job does to its fd table after;
2. reads the address once from the job's memory (process_vm_readv) into its own buffer;
3. checks SECCOMP_IOCTL_NOTIF_ID_VALID (the caller is still the trapped thread, so every pid
   it used named it), decides on its copy, and
4. performs the call itself on its copy of the socket with its copy of the address, and
   answers with the result. It never answers SECCOMP_USER_NOTIF_FLAG_CONTINUE: the kernel
   would read the address and the fd again, and another thread of the job may have changed
   either by then (seccomp_unotify(2), "Caveats"; gVisor, LXD and sandlock make the same call).

The policy (`inet_address`, `listeners_allow`):
- TCP connect: to 127.0.0.0/8, ::1 or ::ffff:127.0.0.0/104 only, and only to a port on which a
  socket of the job's uid listens (sock_diag, else /proc/net/tcp: so a loopback shared with
  others, a container's or a pod's, is still only the job's own: no DNS stub, no sidecar
  proxy); no listener: ECONNREFUSED, as the kernel would answer; 0.0.0.0 and :: name the
  local host (the kernel routes them to loopback) and are connected as 127.0.0.1 / ::1.
  Anything else: EPERM.
- TCP bind: to those addresses; a wildcard (0.0.0.0, ::, ::ffff:0.0.0.0, AF_UNSPEC with
  INADDR_ANY) is bound to loopback instead (127.0.0.1; `::` on a dual-stack socket to
  ::ffff:127.0.0.1, on a v6-only one to ::1): torch's TCPStore binds `::` dual-stack and its
  clients connect to MASTER_ADDR=127.0.0.1, and vLLM's port finder binds ("", 0); refusing
  would break both, and the bound address is loopback either way. Ports below the netns's
  ip_unprivileged_port_start: EACCES, as for the job's uid. Anything else: EPERM.
- listen: on a TCP socket bound to loopback; an unbound one (which the kernel would bind to
  the wildcard) is bound to loopback first.
- A TCP socket bound to an interface other than loopback (SO_BINDTODEVICE): EPERM.
- AF_UNIX and NETLINK_ROUTE connect, bind and listen: as the job itself would do them, by a
  helper process with the job's uid and gid and no groups or capabilities (so socket-file
  permissions, SO_PEERCRED and netlink's group checks are the job's; root would bypass the
  first, lend its uid to the second and its CAP_NET_ADMIN to the third), in the caller's cwd
  and umask. The helper runs under the launcher's AF_UNIX-only filter.
- A socket of any other kind (one passed in over AF_UNIX): EPERM.

Out of the job's reach: the supervisor runs as root (never the job's uid), non-dumpable (its
/proc files need ptrace access), outside the job's filter, and dies with the launcher's
supervisor (PR_SET_PDEATHSIG). The job cannot ptrace, process_vm_* or pidfd_getfd anything
(its filter). When the supervisor dies the listener closes and every trapped call fails with
ENOSYS (fail closed). The helper shares the job's uid, so the job can signal it; it is
non-dumpable and filtered, and without it AF_UNIX connects and binds fail (EPERM), nothing more.

Public API (used by launcher.py):

    TRAPPED                             {audit arch: {syscall nr: "connect"|"bind"|"listen"}}
    loopback_support(arch, uid, gid) -> str   "" when this machine lets the supervisor work for
                                        a job of `uid`, else why not (the fallback's reason)
    start_supervisor(arch, uid, gid, confine) -> (pid, handoff)   fork the supervisor; it
                                        waits on `handoff` for the job's listener fd
    install_listener_filter(arch, prog) -> fd   the job's side: its filter, with a listener
    hand_over(sock, listener_fd)        the job's side: send the listener, wait until served
"""

import ctypes
import errno
import os
import select
import signal
import socket
import struct
import sys
import threading
from collections.abc import Callable, Iterator

RET_USER_NOTIF = 0x7FC00000
FILTER_FLAG_NEW_LISTENER = 1 << 3
FILTER_FLAG_WAIT_KILLABLE_RECV = 1 << 5
SECCOMP_SET_MODE_FILTER, SECCOMP_GET_NOTIF_SIZES = 1, 3
IOCTL_NOTIF_RECV = 0xC0502100  # _IOWR('!', 0, struct seccomp_notif)
IOCTL_NOTIF_SEND = 0xC0182101  # _IOWR('!', 1, struct seccomp_notif_resp)
IOCTL_NOTIF_ID_VALID = 0x40082102  # _IOW('!', 2, __u64)
PIDFD_THREAD = 0x80  # O_EXCL: a pidfd for one thread (Linux 6.9); else the thread group's
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
MSG_FASTOPEN = 0x20000000
TCP_FASTOPEN_CONNECT = 30
SOL_IPV6, IPV6_V6ONLY = 41, 26
SO_DOMAIN, SO_PROTOCOL, SO_BINDTOIFINDEX = 39, 38, 62
AUDIT_I386, AUDIT_ARM = 0x40000003, 0x40000028

# The calls the filter sends here, per architecture of the calling code (a 64-bit process can
# enter the kernel as i386 with `int 0x80`: those calls come here too). launcher.SYSCALLS holds
# the same numbers (a test asserts it).
TRAPPED: dict[int, dict[int, str]] = {
    0xC000003E: {42: "connect", 49: "bind", 50: "listen"},  # x86_64
    AUDIT_I386: {362: "connect", 361: "bind", 363: "listen"},
    0xC00000B7: {203: "connect", 200: "bind", 201: "listen"},  # aarch64
    AUDIT_ARM: {283: "connect", 282: "bind", 284: "listen"},
}
# The supervisor's own syscalls, by its (the launcher's) architecture.
NATIVE = {
    "x86_64": {"seccomp": 317, "process_vm_readv": 310},
    "i386": {"seccomp": 354, "process_vm_readv": 347},
    "aarch64": {"seccomp": 277, "process_vm_readv": 270},
    "arm": {"seccomp": 383, "process_vm_readv": 376},
}
PIDFD_OPEN, PIDFD_GETFD = 434, 438  # the same on every architecture

WORKERS = 4  # trapped calls served at once (a blocking connect holds one)
HANDOFF_TIMEOUT_S = 30.0
MAX_SOCKADDR = 128  # sizeof(struct sockaddr_storage): the kernel refuses more (EINVAL)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
for _name in ("connect", "bind"):
    getattr(_libc, _name).argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.listen.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.getsockopt.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_uint32),
]
_libc.getsockname.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint32)]
_libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4  # unused ones must be 0


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _syscall(nr: int, *args: object) -> int:
    """A raw syscall; raises OSError(errno) when it fails."""
    values = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = _libc.syscall(ctypes.c_long(nr), *values)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def _errno_of(result: int) -> int:
    return ctypes.get_errno() if result < 0 else 0


# -- the policy (pure) ------------------------------------------------------------------------

_V4_MAPPED = b"\0" * 10 + b"\xff\xff"
_V4_LOOPBACK = bytes([127, 0, 0, 1])
_V6_LOOPBACK = b"\0" * 15 + b"\x01"
_V6_ANY = b"\0" * 16


def _v4_kind(ip4: bytes) -> str:
    if ip4[0] == 127:
        return "loopback"
    return "any" if ip4 == b"\0\0\0\0" else "other"


def _v6_kind(ip16: bytes) -> str:
    if ip16 == _V6_LOOPBACK:
        return "loopback"
    if ip16 == _V6_ANY:
        return "any"
    if ip16[:12] == _V4_MAPPED:
        kind = _v4_kind(ip16[12:])
        return "mapped-any" if kind == "any" else kind
    return "other"


def _sockaddr_in(port: int, ip4: bytes) -> bytes:
    return struct.pack("=H", socket.AF_INET) + struct.pack(">H", port) + ip4 + bytes(8)


def _sockaddr_in6(port: int, ip16: bytes) -> bytes:
    """No flow label, no scope id: neither means anything for loopback."""
    head = struct.pack("=H", socket.AF_INET6) + struct.pack(">HI", port, 0)
    return head + ip16 + struct.pack("=I", 0)


def inet_address(op: str, family: int, addr: bytes, *, v6only: bool) -> bytes | int:
    """The address to `op` ("connect" or "bind") a TCP socket of `family` with, rebuilt from the
    job's `addr` (never passed on as it came), or the errno to answer: EINVAL for a short
    address, EAFNOSUPPORT for another family (as the kernel would), EPERM for anything that is
    not loopback. A connect with AF_UNSPEC (a disconnect) is passed on as AF_UNSPEC."""
    if len(addr) < 2:
        return errno.EINVAL
    (sa_family,) = struct.unpack_from("=H", addr)
    if op == "connect" and sa_family == socket.AF_UNSPEC:
        return struct.pack("=H", socket.AF_UNSPEC) + bytes(14)
    if family == socket.AF_INET:
        if len(addr) < 16:
            return errno.EINVAL
        (port,) = struct.unpack_from(">H", addr, 2)
        ip4 = addr[4:8]
        if sa_family == socket.AF_UNSPEC and op == "bind" and ip4 == b"\0\0\0\0":
            sa_family = socket.AF_INET  # the kernel's compatibility case: a wildcard bind
        if sa_family != socket.AF_INET:
            return errno.EAFNOSUPPORT
        kind = _v4_kind(ip4)
        if kind == "other":
            return errno.EPERM
        return _sockaddr_in(port, _V4_LOOPBACK if kind == "any" else ip4)
    if family == socket.AF_INET6:
        if len(addr) < 24:  # SIN6_LEN_RFC2133
            return errno.EINVAL
        if sa_family != socket.AF_INET6:
            return errno.EAFNOSUPPORT
        (port,) = struct.unpack_from(">H", addr, 2)
        ip16 = addr[8:24]
        kind = _v6_kind(ip16)
        if kind == "other":
            return errno.EPERM
        if kind == "mapped-any":
            ip16 = _V4_MAPPED + _V4_LOOPBACK
        elif kind == "any":
            dual = op == "bind" and not v6only
            ip16 = _V4_MAPPED + _V4_LOOPBACK if dual else _V6_LOOPBACK
        return _sockaddr_in6(port, ip16)
    return errno.EPERM


def _as_v6(family: int, sockaddr: bytes) -> tuple[bytes, int]:
    """(the address as 16 bytes, v4 ones mapped; the port) of a rebuilt TCP sockaddr."""
    (port,) = struct.unpack_from(">H", sockaddr, 2)
    if family == socket.AF_INET:
        return _V4_MAPPED + sockaddr[4:8], port
    return sockaddr[8:24], port


def _proc_net_listeners(port: int) -> list[tuple[bytes, int]]:
    """(address as 16 bytes, uid) of every TCP socket listening on `port` in this network
    namespace (/proc/net/tcp and tcp6: state 0A; v4 addresses mapped)."""
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            with open(table, encoding="ascii") as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != "0A":
                continue
            address, _, port_hex = fields[1].partition(":")
            if int(port_hex, 16) != port:
                continue
            # Each 32-bit word is printed as the host-order integer of its network bytes.
            words = [int(address[i : i + 8], 16) for i in range(0, len(address), 8)]
            raw = b"".join(struct.pack("=I", w) for w in words)
            found.append((raw if v6 else _V4_MAPPED + raw, int(fields[7])))
    return found


NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
NLM_F_DUMP_REQUEST, NLMSG_DONE, NLMSG_ERROR = 0x301, 3, 2  # NLM_F_REQUEST | NLM_F_DUMP
TCPF_LISTEN = 1 << 10
_NLMSG_HEADER = struct.Struct("=IHHII")
# inet_diag_msg: family, state, timer, retrans, then inet_diag_sockid (sport, dport: big-endian;
# src, dst: 16 bytes each; interface; cookie), expires, rqueue, wqueue, uid, inode.
_DIAG_MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")


def _diag_listeners(port: int) -> list[tuple[bytes, int]]:
    """(address as 16 bytes, uid) of every TCP socket listening on `port` in this network
    namespace, from the kernel's sock_diag (inet_diag), which walks the listeners only and
    keeps those of `port` itself: its cost does not grow with the connections (TIME_WAIT
    ones included) that /proc/net/tcp lists. Raises OSError where sock_diag is refused."""
    found = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as diag:
        diag.settimeout(5)
        for family in (socket.AF_INET, socket.AF_INET6):
            # inet_diag_req_v2: family, protocol, ext, pad, states, then the sockid (sport set:
            # the kernel's listener walk skips every other port).
            sockid = struct.pack(">HH", port, 0) + bytes(16 + 16 + 4 + 8)
            body = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, TCPF_LISTEN) + sockid
            head = _NLMSG_HEADER.pack(16 + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_DUMP_REQUEST, 1, 0)
            diag.sendall(head + body)
            for message in _dump_messages(diag):
                fields = _DIAG_MSG.unpack_from(message)
                sport, src, uid = struct.unpack(">H", fields[4])[0], fields[6], fields[13]
                if sport == port:
                    found.append((src if family == socket.AF_INET6 else _V4_MAPPED + src[:4], uid))
    return found


def _dump_messages(diag: socket.socket) -> Iterator[bytes]:
    """The payloads of one netlink dump's messages, up to its NLMSG_DONE."""
    while True:
        data = diag.recv(65536)
        if not data:
            return
        offset = 0
        while offset + _NLMSG_HEADER.size <= len(data):
            size, kind, _flags, _seq, _pid = _NLMSG_HEADER.unpack_from(data, offset)
            if kind == NLMSG_DONE or size < _NLMSG_HEADER.size:
                return
            payload = data[offset + _NLMSG_HEADER.size : offset + size]
            if kind == NLMSG_ERROR:
                (err,) = struct.unpack_from("=i", payload)
                raise OSError(-err, "sock_diag refused the dump")
            if kind == SOCK_DIAG_BY_FAMILY and len(payload) >= _DIAG_MSG.size:
                yield payload
            offset += (size + 3) & ~3


def _listeners(port: int) -> list[tuple[bytes, int]]:
    """The listeners on `port`: sock_diag's, else (refused) /proc/net/tcp's."""
    try:
        return _diag_listeners(port)
    except OSError:
        return _proc_net_listeners(port)


def listeners_allow(ip16: bytes, port: int, uid: int, listeners: list[tuple[bytes, int]]) -> int:
    """0 when a connect to [ip16]:port reaches only the job's own listener; ECONNREFUSED when
    nothing listens there (nothing is connected: the kernel's own answer); EPERM when a socket
    of another uid listens on an address that covers it (equal, or a wildcard)."""
    covering = []
    for address, owner in listeners:
        wildcard = address == _V6_ANY or address == _V4_MAPPED + b"\0\0\0\0"
        if address == ip16 or (wildcard and (ip16[:12] == _V4_MAPPED or address == _V6_ANY)):
            covering.append(owner)
    if not covering:
        return errno.ECONNREFUSED
    return 0 if all(owner == uid for owner in covering) else errno.EPERM


def _loopback_index() -> int:
    try:
        return socket.if_nametoindex("lo")
    except OSError:
        return 1  # the loopback device is the first of every network namespace


def _unprivileged_port_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start", encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return 1024


# -- the supervisor process ---------------------------------------------------------------------


class _Notification:
    __slots__ = ("arch", "args", "id", "nr", "pid")

    def __init__(self, raw: bytes) -> None:
        self.id, self.pid, _flags, self.nr, self.arch, _ip = struct.unpack_from("=QIIiIQ", raw)
        args = struct.unpack_from("=6Q", raw, 32)
        if self.arch in (AUDIT_I386, AUDIT_ARM):  # 32-bit code: registers are 32 bits
            args = tuple(a & 0xFFFFFFFF for a in args)
        self.args = args


class _Refused(Exception):
    def __init__(self, err: int) -> None:
        super().__init__(err)
        self.err = err


class Supervisor:
    """Serves one job's trapped calls (in the supervisor process; see the module docstring)."""

    def __init__(self, arch: str, listener: int, uid: int, channels: list[socket.socket]):
        self.listener = listener
        self.uid = uid
        self.channels = channels
        self.vm_readv = NATIVE[arch]["process_vm_readv"]
        self.port_start = _unprivileged_port_start()
        self.loopback_index = _loopback_index()
        self.thread_pidfds = True
        sizes = (ctypes.c_uint16 * 3)()
        _syscall(NATIVE[arch]["seccomp"], SECCOMP_GET_NOTIF_SIZES, 0, ctypes.byref(sizes))
        self.notif_size, self.resp_size = sizes[0], sizes[1]

    def serve_forever(self) -> None:
        workers = [
            threading.Thread(target=self._work, args=(channel,), daemon=True)
            for channel in self.channels
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    def _work(self, channel: socket.socket) -> None:
        while True:
            buf = ctypes.create_string_buffer(self.notif_size)
            if _libc.ioctl(self.listener, IOCTL_NOTIF_RECV, buf) < 0:
                err = ctypes.get_errno()
                if err in (errno.EINTR, errno.ENOENT):
                    continue  # the caller was killed before we took its call
                return  # the listener is gone: nothing more to serve
            notif = _Notification(buf.raw)
            try:
                err = self._handle(notif, channel)
            except _Refused as refused:
                err = refused.err
            except Exception as exc:  # a bug here must refuse the call, never allow it
                why = f"{type(exc).__name__}: {exc}"
                print(f"launcher: loopback supervisor: {why}", file=sys.stderr)
                err = errno.EPERM
            if err is None:
                continue  # the caller is gone: no answer to send
            resp = ctypes.create_string_buffer(
                struct.pack("=QqiI", notif.id, 0, -err, 0).ljust(self.resp_size, b"\0")
            )
            _libc.ioctl(self.listener, IOCTL_NOTIF_SEND, resp)  # ENOENT: the caller is gone

    # -- one call ---------------------------------------------------------------------------

    def _still_waiting(self, notif: _Notification) -> bool:
        ident = ctypes.c_uint64(notif.id)
        return _libc.ioctl(self.listener, IOCTL_NOTIF_ID_VALID, ctypes.byref(ident)) == 0

    def _pidfd(self, tid: int) -> int:
        if self.thread_pidfds:
            try:
                return _syscall(PIDFD_OPEN, tid, PIDFD_THREAD)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise _Refused(errno.EPERM) from None
                self.thread_pidfds = False  # before Linux 6.9: the thread group's pidfd
        try:
            with open(f"/proc/{tid}/status", encoding="ascii") as fh:
                tgid = next(int(line.split()[1]) for line in fh if line.startswith("Tgid:"))
            return _syscall(PIDFD_OPEN, tgid, 0)
        except (OSError, StopIteration, ValueError):
            raise _Refused(errno.EPERM) from None

    def _read(self, pid: int, address: int, size: int) -> bytes:
        out = ctypes.create_string_buffer(size)
        local = _Iovec(ctypes.cast(out, ctypes.c_void_p), size)
        remote = _Iovec(address, size)
        try:
            got = _syscall(self.vm_readv, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        except OSError:
            raise _Refused(errno.EFAULT) from None
        if got != size:
            raise _Refused(errno.EFAULT)
        return out.raw

    def _handle(self, notif: _Notification, channel: socket.socket) -> int | None:
        op = TRAPPED.get(notif.arch, {}).get(notif.nr)
        if op is None:
            return errno.EPERM
        fd_number = ctypes.c_int(notif.args[0] & 0xFFFFFFFF).value
        pidfd = self._pidfd(notif.pid)
        sock = cwd = -1
        try:
            try:
                sock = _syscall(PIDFD_GETFD, pidfd, fd_number, 0)
            except OSError as exc:
                return exc.errno if exc.errno == errno.EBADF else errno.EPERM
            addr = b""
            if op != "listen":
                size = ctypes.c_int32(notif.args[2] & 0xFFFFFFFF).value
                if not 0 <= size <= MAX_SOCKADDR:
                    return errno.EINVAL
                addr = self._read(notif.pid, notif.args[1], size) if size else b""
            family = self._sockopt(sock, socket.SOL_SOCKET, SO_DOMAIN)
            if family == socket.AF_UNIX and op != "listen" and _relative(addr):
                cwd = os.open(f"/proc/{notif.pid}/cwd", os.O_PATH | os.O_DIRECTORY)
            umask = _umask_of(notif.pid) if family == socket.AF_UNIX else 0
            if not self._still_waiting(notif):
                return None  # everything above named the trapped thread; it is gone now
            backlog = ctypes.c_int(notif.args[1]).value if op == "listen" else 0
            if family in (socket.AF_INET, socket.AF_INET6):
                return self._inet(op, sock, family, addr, backlog)
            if family in (socket.AF_UNIX, socket.AF_NETLINK):
                # Made as the job: root would bypass socket-file permissions, lend its uid to
                # SO_PEERCRED and its CAP_NET_ADMIN to netlink's privileged groups.
                return _ask_helper(channel, op, sock, cwd, umask, addr, backlog)
            return errno.EPERM  # a socket the job cannot make itself (passed in): refused
        finally:
            for fd in (sock, cwd, pidfd):
                if fd >= 0:
                    os.close(fd)

    def _sockopt(self, sock: int, level: int, name: int) -> int:
        value, size = ctypes.c_int(0), ctypes.c_uint32(4)
        if _libc.getsockopt(sock, level, name, ctypes.byref(value), ctypes.byref(size)) < 0:
            raise _Refused(ctypes.get_errno() or errno.ENOTSOCK)
        return value.value

    def _inet(self, op: str, sock: int, family: int, addr: bytes, backlog: int) -> int:
        kind = self._sockopt(sock, socket.SOL_SOCKET, socket.SO_TYPE)
        protocol = self._sockopt(sock, socket.SOL_SOCKET, SO_PROTOCOL)
        if kind != socket.SOCK_STREAM or protocol not in (0, socket.IPPROTO_TCP):
            return errno.EPERM
        device = self._sockopt(sock, socket.SOL_SOCKET, SO_BINDTOIFINDEX)
        if device not in (0, self.loopback_index):
            return errno.EPERM  # bound to another interface (SO_BINDTODEVICE): never loopback
        v6only = family == socket.AF_INET6 and bool(self._sockopt(sock, SOL_IPV6, IPV6_V6ONLY))
        if op == "listen":
            return self._listen(sock, family, v6only, backlog)
        target = inet_address(op, family, addr, v6only=v6only)
        if isinstance(target, int):
            return target
        if struct.unpack_from("=H", target)[0] == socket.AF_UNSPEC:
            return _errno_of(_libc.connect(sock, target, len(target)))
        ip16, port = _as_v6(family, target)
        if op == "bind":
            if 0 < port < self.port_start:
                return errno.EACCES  # as for the job's uid, which lacks CAP_NET_BIND_SERVICE
            return _errno_of(_libc.bind(sock, target, len(target)))
        refused = listeners_allow(ip16, port, self.uid, _listeners(port))
        if refused:
            return refused
        return _errno_of(_libc.connect(sock, target, len(target)))

    def _listen(self, sock: int, family: int, v6only: bool, backlog: int) -> int:
        name, size = ctypes.create_string_buffer(MAX_SOCKADDR), ctypes.c_uint32(MAX_SOCKADDR)
        if _libc.getsockname(sock, name, ctypes.byref(size)) < 0:
            return ctypes.get_errno()
        bound = name.raw[: size.value]
        ip16, port = _as_v6(family, bound)
        if port == 0:  # unbound: listen would bind the wildcard; bind loopback first
            if family == socket.AF_INET:
                loop = _sockaddr_in(0, _V4_LOOPBACK)
            else:
                ip = _V6_LOOPBACK if v6only else _V4_MAPPED + _V4_LOOPBACK
                loop = _sockaddr_in6(0, ip)
            err = _errno_of(_libc.bind(sock, loop, len(loop)))
            if err:
                return err
        elif _v6_kind(ip16) != "loopback":
            return errno.EPERM  # bound elsewhere before it reached the job: refused
        return _errno_of(_libc.listen(sock, backlog))


def _relative(addr: bytes) -> bool:
    """An AF_UNIX address naming a path relative to the caller's cwd."""
    return len(addr) > 2 and addr[2:3] not in (b"/", b"\0")


def _umask_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            return next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        return 0o022


def _ask_helper(
    channel: socket.socket, op: str, sock: int, cwd: int, umask: int, addr: bytes, backlog: int
) -> int:
    """The AF_UNIX call, made by the helper as the job; EPERM when the helper is gone."""
    fds = [sock] if cwd < 0 else [sock, cwd]
    request = struct.pack("=cHi", op[0].encode(), umask, backlog) + addr
    try:
        socket.send_fds(channel, [request], fds)
        answer = channel.recv(4)
    except OSError:
        return errno.EPERM
    if len(answer) != 4:
        return errno.EPERM
    return struct.unpack("=i", answer)[0]


# -- the helper (the job's uid: AF_UNIX calls made as the job) -------------------------------------


def _helper_serve(channel: socket.socket, ready: threading.Barrier) -> None:
    ctypes.CDLL(None, use_errno=True).unshare(0x200)  # CLONE_FS: this thread's own cwd, umask
    ready.wait()
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(channel, 4 + MAX_SOCKADDR + 8, 2)
        except OSError:
            return
        if not data:
            return  # the supervisor is gone
        err = errno.EPERM
        try:
            if fds and len(data) >= 7:
                op, umask, backlog = struct.unpack_from("=cHi", data)
                addr = data[7:]
                os.umask(umask)
                if len(fds) > 1:
                    os.fchdir(fds[1])
                if op == b"c":
                    err = _errno_of(_libc.connect(fds[0], addr, len(addr)))
                elif op == b"b":
                    err = _errno_of(_libc.bind(fds[0], addr, len(addr)))
                elif op == b"l":
                    err = _errno_of(_libc.listen(fds[0], backlog))
        except OSError as exc:
            err = exc.errno or errno.EPERM
        finally:
            for fd in fds:
                os.close(fd)
            os.chdir("/")
        try:
            channel.send(struct.pack("=i", err))
        except OSError:
            return


def _run_helper(
    channels: list[socket.socket],
    uid: int,
    gid: int,
    confine: Callable[[], None],
    confined: int,
) -> None:
    """The helper process: the job's uid and gid, no groups, non-dumpable, dies with the
    supervisor, confined by the launcher's AF_UNIX-only filter; it writes a byte on the pipe
    `confined` once it is all of these. Never returns."""
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the job shares this uid: no /proc/<pid>/mem
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        ready = threading.Barrier(len(channels) + 1)
        for channel in channels:
            threading.Thread(target=_helper_serve, args=(channel, ready), daemon=True).start()
        ready.wait()  # every thread has its own fs struct: unshare is refused from here on
        confine()
        os.write(confined, b"r")
        os.close(confined)
        threading.Event().wait()
    except BaseException as exc:
        print(f"launcher: loopback helper: {type(exc).__name__}: {exc}", file=sys.stderr)
    os._exit(0)


# -- starting it --------------------------------------------------------------------------------


def start_supervisor(
    arch: str, uid: int, gid: int, confine: Callable[[], None]
) -> tuple[int, socket.socket]:
    """Fork the supervisor (root, non-dumpable, PR_SET_PDEATHSIG) and, from it, its helper.
    Returns (the supervisor's pid, the job's end of the handoff socket): the job's process
    sends its listener fd on it (`hand_over`) and waits until it is served."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    pid = os.fork()
    if pid:
        ours.close()
        return pid, theirs
    theirs.close()
    code = 0
    try:
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(0)
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(WORKERS)]
        helper_ready, confined = os.pipe2(os.O_CLOEXEC)
        if os.fork() == 0:
            ours.close()
            os.close(helper_ready)
            for mine, _ in pairs:
                mine.close()
            _run_helper([helper for _, helper in pairs], uid, gid, confine, confined)
        os.close(confined)
        for _, helper in pairs:
            helper.close()
        ours.settimeout(HANDOFF_TIMEOUT_S)
        try:
            _msg, fds, _flags, _addr = socket.recv_fds(ours, 16, 1)
        except OSError:
            fds = []
        if not fds:
            os._exit(0)  # the job fell back to the AF_UNIX-only filter: nothing to serve
        # The job is told it is served only once the helper runs as the job's uid under its
        # own filter: before, a loaded machine let the agent's code start while the helper was
        # still root and unconfined (a test of the supervisor's reach saw helper_uid 0).
        if (
            not select.select([helper_ready], [], [], HANDOFF_TIMEOUT_S)[0]
            or os.read(helper_ready, 1) != b"r"
        ):
            raise OSError(errno.ECHILD, "the loopback helper did not confine itself in time")
        os.close(helper_ready)
        supervisor = Supervisor(arch, fds[0], uid, [mine for mine, _ in pairs])
        ours.sendall(b"k")
        ours.close()
        supervisor.serve_forever()
    except BaseException as exc:
        print(f"launcher: loopback supervisor: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    os._exit(code)


def hand_over(sock: socket.socket, listener: int, timeout_s: float = HANDOFF_TIMEOUT_S) -> None:
    """The job's side, before anything of the agent's runs: give the supervisor the listener
    and wait until it serves it. Raises OSError if it does not answer."""
    sock.settimeout(timeout_s)
    socket.send_fds(sock, [b"L"], [listener])
    if sock.recv(1) != b"k":
        raise OSError(errno.EPIPE, "the loopback supervisor did not take the listener")


# -- whether this machine allows it ----------------------------------------------------------------


def install_listener_filter(arch: str, prog: bytes) -> int:
    """Install `prog` (struct sock_filter bytes) with a new listener on this (single-threaded)
    process; the listener's fd. Waits killably once a call is received (Linux 5.19), or
    interruptibly where that flag is unknown. Raises OSError."""
    buf = ctypes.create_string_buffer(prog, len(prog))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    nr = NATIVE[arch]["seccomp"]
    flags = FILTER_FLAG_NEW_LISTENER | FILTER_FLAG_WAIT_KILLABLE_RECV
    try:
        return _syscall(nr, SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(fprog))
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    return _syscall(nr, SECCOMP_SET_MODE_FILTER, FILTER_FLAG_NEW_LISTENER, ctypes.byref(fprog))


_ALLOW_ALL = struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000)  # ret SECCOMP_RET_ALLOW


def loopback_support(arch: str, uid: int, gid: int) -> str:
    """ "" when a supervisor can serve a job of `uid` here, else why not: a child with the job's
    uid installs a filter with a listener (the kernel and any seccomp profile around us must
    allow one: Linux 5.0, none nested), and this process takes an fd from it (pidfd_getfd,
    Linux 5.6) and reads its memory (process_vm_readv): both need CAP_SYS_PTRACE across uids,
    which Docker's and containerd's default capability sets lack (their default seccomp
    profiles refuse pidfd_getfd without it, too)."""
    marker = ctypes.create_string_buffer(b"posttrain-loopback-probe")
    report_r, report_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(report_r)
        os.close(hold_w)
        message = b"ok"
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if _libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
                raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
            os.close(install_listener_filter(arch, _ALLOW_ALL))
        except OSError as exc:
            message = f"a filter with a listener is refused: {exc.strerror or exc}".encode()
        os.write(report_w, message)
        os.read(hold_r, 1)
        os._exit(0)
    os.close(report_w)
    os.close(hold_r)  # the probe keeps its own, under the same number: the fd to take from it
    why = ""
    try:
        answer = os.read(report_r, 400).decode(errors="replace")
        if answer != "ok":
            why = answer or "the probe process died"
        else:
            why = _probe_reach(arch, pid, hold_r, ctypes.addressof(marker), marker.raw)
    finally:
        os.close(hold_w)
        os.close(report_r)
        os.waitpid(pid, 0)
    return why


def _probe_reach(arch: str, pid: int, fd: int, address: int, expected: bytes) -> str:
    try:
        pidfd = _syscall(PIDFD_OPEN, pid, 0)
    except OSError as exc:
        return f"pidfd_open is refused: {exc.strerror}"
    try:
        try:
            os.close(_syscall(PIDFD_GETFD, pidfd, fd, 0))
        except OSError as exc:
            return (
                f"pidfd_getfd on a process of the job's uid is refused: {exc.strerror} (no "
                "CAP_SYS_PTRACE, or a seccomp profile refuses the call, as container defaults do)"
            )
    finally:
        os.close(pidfd)
    out = ctypes.create_string_buffer(len(expected))
    local = _Iovec(ctypes.cast(out, ctypes.c_void_p), len(expected))
    remote = _Iovec(address, len(expected))
    nr = NATIVE[arch]["process_vm_readv"]
    try:
        _syscall(nr, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    except OSError as exc:
        return f"process_vm_readv of a process of the job's uid is refused: {exc.strerror}"
    if out.raw != expected:
        return "process_vm_readv read something else than the probe's memory"
    return ""
