"""A hostile loopback HTTP server for the reliability tests: each connection gets ``reply(sock)``."""
from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator


def read_request(conn: socket.socket) -> bytes:
    """Read one request (head and Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head


@contextlib.contextmanager
def hostile_server(reply: Callable[[socket.socket], None]) -> Iterator[str]:
    """Serve ``reply`` on 127.0.0.1 (a thread per connection); yields the base URL."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(0.2)
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(30)
                read_request(conn)
                reply(conn)
            except OSError:
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        srv.close()


def canned(data: bytes) -> Callable[[socket.socket], None]:
    """Send ``data`` and close."""
    def reply(conn: socket.socket) -> None:
        conn.sendall(data)
    return reply
