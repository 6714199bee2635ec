"""Framed, token-checked pickle messages over blocking TCP sockets (threads, not asyncio).

Every connection of the program layer (courier calls, the controller) opens with
the program's token; a peer that does not present it is dropped before anything
it sent is unpickled. A frame is a 4-byte big-endian length and a cloudpickle.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import cloudpickle

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30
HELLO_TIMEOUT = 10.0


class WireError(ConnectionError):
    """The peer closed the connection, sent a bad frame, or did not authenticate."""


def send_obj(sock: socket.socket, obj: Any, lock: threading.Lock | None = None) -> None:
    """Pickle ``obj`` and write it as one frame (under ``lock`` if several threads send)."""
    data = cloudpickle.dumps(obj)
    frame = _HEADER.pack(len(data)) + data
    if lock is None:
        sock.sendall(frame)
    else:
        with lock:
            sock.sendall(frame)


def recv_obj(sock: socket.socket) -> Any:
    """Read one frame and unpickle it. Raises WireError at EOF or on a bad frame."""
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > MAX_FRAME:
        raise WireError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return cloudpickle.loads(_recv_exact(sock, size))


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise WireError("connection closed")
        got += n
    return bytes(buf)


def connect(address: str, token: str, timeout: float = HELLO_TIMEOUT) -> socket.socket:
    """Connect to ``host:port`` and present ``token``. Raises OSError or WireError."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    token_bytes = token.encode()
    sock.sendall(_HEADER.pack(len(token_bytes)) + token_bytes)
    sock.settimeout(None)
    return sock


def accept_hello(sock: socket.socket, token: str) -> bool:
    """Read the peer's token (raw bytes, never unpickled); True if it matches."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(HELLO_TIMEOUT)
    try:
        (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
        if size > 1024:
            return False
        presented = _recv_exact(sock, size)
    except (OSError, WireError, struct.error):
        return False
    sock.settimeout(None)
    return hmac.compare_digest(presented, token.encode())


def listen(host: str) -> socket.socket:
    """A listening TCP socket on ``host`` and a free port."""
    return socket.create_server((host, 0), backlog=128)


def address_of(listener: socket.socket) -> str:
    host, port = listener.getsockname()[:2]
    return f"{host}:{port}"


class Acceptor:
    """A listening socket on ``host`` (a free port) whose connections must present
    ``token``; each admitted one is handed to ``serve(sock)`` on its own thread."""

    def __init__(self, host: str, token: str, serve: Callable[[socket.socket], None],
                 name: str) -> None:
        self.token, self.serve, self.name = token, serve, name
        self.listener = listen(host)
        self.address = address_of(self.listener)
        self._conns: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name=f"lp-{name[:20]}-accept",
                         daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self._conns.append(sock)
            threading.Thread(target=self._admit, args=(sock,), daemon=True,
                             name=f"lp-{self.name[:20]}").start()

    def _admit(self, sock: socket.socket) -> None:
        try:
            admitted = accept_hello(sock, self.token)
        except OSError:  # closed under us: the server is stopping
            return
        if not admitted:
            log.warning("%s refused a connection: wrong program token", self.name)
            sock.close()
            return
        self.serve(sock)

    def close(self) -> None:
        """Stop accepting and cut every connection."""
        self._closed = True
        self.listener.close()
        for sock in self._conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
