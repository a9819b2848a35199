"""The loopback policy's decisions (job_launcher/loopback.py), without a job: which addresses a
TCP connect or bind may name, what a wildcard becomes, and whose listener a connect may reach."""

from __future__ import annotations

import errno
import os
import socket
import struct

import pytest

from job_launcher.loopback import (
    _diag_listeners,
    _proc_net_listeners,
    inet_address,
    listeners_allow,
)

V4, V6 = socket.AF_INET, socket.AF_INET6


def v4(ip: str, port: int = 80, family: int = V4) -> bytes:
    return struct.pack("=H", family) + struct.pack(">H", port) + socket.inet_aton(ip) + bytes(8)


def v6(ip: str, port: int = 80, scope: int = 0) -> bytes:
    head = struct.pack("=H", V6) + struct.pack(">HI", port, 0)
    return head + socket.inet_pton(V6, ip) + struct.pack("=I", scope)


def shown(addr: bytes | int) -> object:
    """An answer as (address, port), or the errno."""
    if isinstance(addr, int):
        return addr
    (family,) = struct.unpack_from("=H", addr)
    (port,) = struct.unpack_from(">H", addr, 2)
    if family == V4:
        return socket.inet_ntoa(addr[4:8]), port
    if family == V6:
        return socket.inet_ntop(V6, addr[8:24]), port
    return family


@pytest.mark.parametrize(
    ("op", "family", "addr", "v6only", "expected"),
    [
        ("connect", V4, v4("127.0.0.1"), False, ("127.0.0.1", 80)),
        ("connect", V4, v4("127.255.0.9"), False, ("127.255.0.9", 80)),
        ("connect", V4, v4("0.0.0.0"), False, ("127.0.0.1", 80)),  # "this host": loopback
        ("connect", V4, v4("10.0.0.1"), False, errno.EPERM),
        ("connect", V4, v4("1.1.1.1"), False, errno.EPERM),
        ("connect", V4, v4("169.254.169.254"), False, errno.EPERM),
        ("connect", V4, v4("224.0.0.1"), False, errno.EPERM),
        ("connect", V4, v4("255.255.255.255"), False, errno.EPERM),
        ("connect", V4, v4("1.1.1.1")[:15], False, errno.EINVAL),
        ("connect", V4, v6("::1"), False, errno.EAFNOSUPPORT),
        ("connect", V6, v6("::1"), False, ("::1", 80)),
        ("connect", V6, v6("::"), False, ("::1", 80)),
        ("connect", V6, v6("::ffff:127.0.0.1"), False, ("::ffff:127.0.0.1", 80)),
        ("connect", V6, v6("::ffff:0.0.0.0"), False, ("::ffff:127.0.0.1", 80)),
        ("connect", V6, v6("::ffff:1.1.1.1"), False, errno.EPERM),
        ("connect", V6, v6("::127.0.0.1"), False, errno.EPERM),  # v4-compatible: not loopback
        ("connect", V6, v6("fe80::1", scope=1), False, errno.EPERM),
        ("connect", V6, v6("ff02::1"), False, errno.EPERM),
        ("connect", V6, v6("::2"), False, errno.EPERM),
        ("connect", V6, v4("127.0.0.1"), False, errno.EINVAL),  # shorter than a sockaddr_in6
        ("connect", V6, v4("127.0.0.1") + bytes(12), False, errno.EAFNOSUPPORT),
        ("bind", V4, v4("0.0.0.0", 0), False, ("127.0.0.1", 0)),
        ("bind", V4, v4("0.0.0.0", 0, family=0), False, ("127.0.0.1", 0)),  # AF_UNSPEC + ANY
        ("bind", V4, v4("1.2.3.4", 0, family=0), False, errno.EAFNOSUPPORT),
        ("bind", V4, v4("127.0.0.2", 5), False, ("127.0.0.2", 5)),
        ("bind", V4, v4("192.0.2.2", 5), False, errno.EPERM),
        ("bind", V6, v6("::", 7), False, ("::ffff:127.0.0.1", 7)),  # dual stack: v4 clients
        ("bind", V6, v6("::", 7), True, ("::1", 7)),
        ("bind", V6, v6("::ffff:0.0.0.0", 7), False, ("::ffff:127.0.0.1", 7)),
        ("bind", V6, v6("fd00::2", 7), False, errno.EPERM),
        ("bind", V6, v6("::1", 7), True, ("::1", 7)),
    ],
)
def test_only_loopback_is_named_and_wildcards_become_loopback(
    op: str, family: int, addr: bytes, v6only: bool, expected: object
) -> None:
    assert shown(inet_address(op, family, addr, v6only=v6only)) == expected


def test_a_disconnect_is_passed_on_and_the_rest_of_the_address_never() -> None:
    assert shown(inet_address("connect", V4, struct.pack("=H", 0) + b"junk", v6only=False)) == 0
    got = inet_address("connect", V4, v4("127.0.0.1")[:8] + b"\xff" * 8, v6only=False)
    assert isinstance(got, bytes) and got[8:] == bytes(8)  # rebuilt: the padding is ours


MAPPED = b"\0" * 10 + b"\xff\xff"


def mapped(ip: str) -> bytes:
    return MAPPED + socket.inet_aton(ip)


@pytest.mark.parametrize(
    ("listeners", "expected"),
    [
        ([], errno.ECONNREFUSED),
        ([(mapped("127.0.0.1"), 1000)], 0),
        ([(mapped("127.0.0.1"), 0)], errno.EPERM),  # root's loopback server
        ([(mapped("0.0.0.0"), 0)], errno.EPERM),  # anyone's wildcard server covers loopback
        ([(b"\0" * 16, 0)], errno.EPERM),  # a dual-stack wildcard, too
        ([(mapped("127.0.0.2"), 0)], errno.ECONNREFUSED),  # another address: not reached
        ([(mapped("127.0.0.1"), 1000), (mapped("0.0.0.0"), 0)], errno.EPERM),
    ],
)
def test_a_connect_reaches_only_the_jobs_own_listener(listeners, expected) -> None:
    assert listeners_allow(mapped("127.0.0.1"), 5000, 1000, listeners) == expected


@pytest.mark.parametrize("read", [_diag_listeners, _proc_net_listeners])
def test_listeners_are_read_with_their_owner_from_sock_diag_or_proc_net(read) -> None:
    with socket.create_server(("127.0.0.1", 0)) as v4_server:
        port = v4_server.getsockname()[1]
        assert read(port) == [(mapped("127.0.0.1"), os.getuid())]
    with socket.socket(V6) as v6_server:
        v6_server.bind(("::1", 0))
        v6_server.listen()
        port = v6_server.getsockname()[1]
        assert read(port) == [(b"\0" * 15 + b"\x01", os.getuid())]
    with socket.socket(V6) as dual:
        dual.bind(("::", 0))
        dual.listen()
        assert read(dual.getsockname()[1]) == [(b"\0" * 16, os.getuid())]
    with socket.socket() as unbound:  # not listening: never counted
        unbound.bind(("127.0.0.1", 0))
        assert read(unbound.getsockname()[1]) == []
