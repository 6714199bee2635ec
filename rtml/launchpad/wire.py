"""Framed, token-checked pickle messages over blocking TCP sockets (threads, not asyncio).

Every connection of the program layer (courier calls, the controller) opens with a
handshake in which both sides prove they hold the program's token, without sending it
(as ``rtml.rpc.auth``'s, in fixed-size raw bytes)::

    listener --nonce S (16 bytes)-->  connector
    listener <--nonce C, proof(client, S, C) (48 bytes)--
    listener --proof(server, C, S) (32 bytes)-->

A peer that does not prove it is dropped before anything it sent is unpickled. Before
that, a connection gets HELLO_TIMEOUT seconds and 48 bytes, and a listener holds at
most MAX_PENDING of them (MAX_PENDING_PER_PEER from one address): a new one closes the
oldest still pending (from its address, if that is at its cap), so idle connections
cannot keep out a client that proves the token at once. A frame is a 4-byte big-endian length and a cloudpickle, read as it arrives (the
length alone allocates nothing).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from rtml.rpc.admission import HELLO_TIMEOUT, Admissions, RefusalLog
from rtml.rpc.auth import NONCE_BYTES, proof

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30
_CHUNK = 1 << 20
MAX_PENDING = 128
MAX_PENDING_PER_PEER = 16
_PROOF_BYTES = 32


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
    """Read one frame and unpickle it. Raises WireError at EOF, on a bad frame, or when
    its pickle does not load (the caller closes the connection)."""
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > MAX_FRAME:
        raise WireError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    data = _recv_exact(sock, size)
    try:
        return cloudpickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - whatever the pickle's code raised
        raise WireError(f"a frame did not unpickle: {type(exc).__name__}: {exc}") from exc


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes, the buffer grown as they arrive (a peer's length alone costs none)."""
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(min(size - len(buf), _CHUNK))
        if not chunk:
            raise WireError("connection closed")
        buf += chunk
    return bytes(buf)


def connect(address: str, token: str, timeout: float = HELLO_TIMEOUT) -> socket.socket:
    """Connect to ``host:port`` and run the handshake (module docstring). Raises OSError,
    or WireError if the listener does not prove it holds ``token``."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        theirs = _recv_exact(sock, NONCE_BYTES)
        ours = os.urandom(NONCE_BYTES)
        sock.sendall(ours + proof(token, b"client", theirs, ours))
        if not hmac.compare_digest(_recv_exact(sock, _PROOF_BYTES),
                                   proof(token, b"server", ours, theirs)):
            raise WireError(f"{address} did not prove it holds the program's token")
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


def accept_hello(sock: socket.socket, token: str) -> bool:
    """The listener's side of the handshake (raw bytes, never unpickled); True if the
    peer proved it holds ``token``."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(HELLO_TIMEOUT)
    ours = os.urandom(NONCE_BYTES)
    try:
        sock.sendall(ours)
        answer = _recv_exact(sock, NONCE_BYTES + _PROOF_BYTES)
        theirs, shown = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
        if not hmac.compare_digest(shown, proof(token, b"client", ours, theirs)):
            return False
        sock.sendall(proof(token, b"server", theirs, ours))
    except (OSError, WireError):
        return False
    sock.settimeout(None)
    return True


def listen(host: str) -> socket.socket:
    """A listening TCP socket on ``host`` and a free port."""
    return socket.create_server((host, 0), backlog=128)


def address_of(listener: socket.socket) -> str:
    host, port = listener.getsockname()[:2]
    return f"{host}:{port}"


class Acceptor:
    """A listening socket on ``host`` (a free port) whose connections must prove they hold
    ``token`` (capped as the module docstring says, each within HELLO_TIMEOUT); each
    admitted one is handed to ``serve(sock)`` on its own thread. The accept loop
    outlives any one connection's failure."""

    def __init__(self, host: str, token: str, serve: Callable[[socket.socket], None],
                 name: str) -> None:
        self.token, self.serve, self.name = token, serve, name
        self.listener = listen(host)
        self.address = address_of(self.listener)
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._pending: Admissions[socket.socket] = Admissions(MAX_PENDING,
                                                              MAX_PENDING_PER_PEER)
        self._refusals = RefusalLog(log, name)
        self._closed = False
        threading.Thread(target=self._accept, name=f"lp-{name[:20]}-accept",
                         daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, peer = self.listener.accept()
            except OSError as exc:
                if self._closed:
                    return
                self._refusals.refused(f"accept failed ({exc})")  # e.g. out of descriptors
                time.sleep(0.05)
                continue
            host = str(peer[0])
            with self._lock:
                self._conns.add(sock)
            victim = self._pending.arrive(sock, host)
            if victim is not None:  # its handshake thread sees it closed
                with contextlib.suppress(OSError):
                    victim.shutdown(socket.SHUT_RDWR)
                self._refusals.refused(f"closed the oldest connection still proving the "
                                       f"token, for a new one from {host}")
            try:
                threading.Thread(target=self._admit, args=(sock, host), daemon=True,
                                 name=f"lp-{self.name[:20]}").start()
            except RuntimeError as exc:  # no thread to be had: drop this one, keep going
                self._done(sock, admitted=False)
                self._refusals.refused(f"no thread for a connection ({exc})")

    def _admit(self, sock: socket.socket, host: str) -> None:
        try:
            admitted = accept_hello(sock, self.token)
        except OSError:  # closed under us: the server is stopping
            admitted = False
        self._done(sock, admitted)
        if not admitted:
            self._refusals.refused(f"a connection from {host} did not prove the program's "
                                   f"token in time")
            return
        try:
            self.serve(sock)
        finally:
            with self._lock:
                self._conns.discard(sock)

    def _done(self, sock: socket.socket, admitted: bool) -> None:
        """The handshake of ``sock`` is over: count it out; close it if not admitted."""
        self._pending.leave(sock)
        if not admitted:
            with self._lock:
                self._conns.discard(sock)
            sock.close()

    def close(self) -> None:
        """Stop accepting and cut every connection."""
        self._closed = True
        self.listener.close()
        with self._lock:
            conns = list(self._conns)
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
