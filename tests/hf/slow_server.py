"""A real TCP server on loopback that answers as slowly as a misbehaving front end can: one
byte at a time, each well inside any read timeout, for far longer than a call may take. For
what an in-process fake transport cannot show: how the client's own sockets wait."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# A TLS handshake record (TLS 1.2) announcing 16 KiB that then arrive one byte at a time.
TLS_RECORD_HEADER = b"\x16\x03\x03\x40\x00"


@contextmanager
def trickling_server(first: bytes, every_s: float = 0.05, for_s: float = 10.0) -> Iterator[int]:
    """Serves each connection: reads what the client sends first, writes `first`, then one
    more byte every `every_s` until `for_s` passed or the client went away. Yields the port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(first)
            for _ in range(int(for_s / every_s)):
                if stop.wait(every_s):
                    return
                try:
                    conn.sendall(b"a")
                except OSError:
                    return  # the client gave up

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        acceptor.join(timeout=5)
        listener.close()


@contextmanager
def answering_server(body: bytes) -> Iterator[tuple[int, list[bytes]]]:
    """Answers every request with 200 and the JSON `body`; yields its port and the request
    lines it received (a proxy sees the absolute URL there)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    seen: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                seen.append(conn.recv(65536).split(b"\r\n", 1)[0])
                head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                conn.sendall(head.encode() + body)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        stop.set()
        acceptor.join(timeout=5)
        listener.close()
