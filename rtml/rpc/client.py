"""Connecting to a daemon: one way to open the socket and one handshake rule, for the
blocking callers (the client runtime's reactor, the CLI) and the asyncio ones (daemons).

    make_hello(token, role, ...)           the first frame every connection sends
    connect_socket(address)                a socket to ``unix:/path`` or ``host:port``
    handshake(sock, hello)                 blocking: Hello out, HelloReply in (check_reply)
    request(address, hello, msg, Reply)    one blocking request and its answer
    FramedClient.connect(address, hello)   asyncio: the same socket and rule, then
                                           send(msg) / await receive()

The reactor's ``open_connection`` (``rtml.rpc.reactor``) opens its connections with
``connect_socket`` and ``handshake`` too.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any, TypeVar

from rtml.exceptions import ProtocolError
from rtml.rpc import messages as m
from rtml.rpc.auth import HELLO_MAX_FRAME, check_reply
from rtml.rpc.framing import FrameDecoder, frame

R = TypeVar("R", bound=m.Msg)


def make_hello(token: str, role: str, client_id: bytes, job_id: bytes = b"",
               sys_paths: list[str] | None = None, node_id: bytes = b"") -> m.Hello:
    return m.Hello(token=token, version=m.PROTOCOL_VERSION, role=role, client_id=client_id,
                   pid=os.getpid(), job_id=job_id, sys_paths=sys_paths or [], node_id=node_id)


def _socket_for(address: str) -> tuple[socket.socket, Any]:
    """A stream socket for ``unix:/path`` or ``host:port`` (IPv4), and where to connect it."""
    if address.startswith("unix:"):
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), address[5:]
    host, _, port = address.rpartition(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, (host, int(port))


def connect_socket(address: str, timeout: float = 10.0) -> socket.socket:
    """A blocking socket connected to ``unix:/path`` or ``host:port``. Raises OSError."""
    sock, target = _socket_for(address)
    sock.settimeout(timeout)
    try:
        sock.connect(target)
    except BaseException:
        sock.close()
        raise
    return sock


def handshake(sock: socket.socket, hello: m.Hello) -> m.HelloReply:
    """Send ``hello`` and read the reply on a blocking socket. Raises ProtocolError."""
    sock.sendall(frame(m.encode(hello)))
    decoder = FrameDecoder(max_frame=HELLO_MAX_FRAME)
    while True:
        data = sock.recv(65536)
        if not data:
            raise ProtocolError("peer closed the connection during the handshake")
        frames = decoder.feed(data)
        if frames:
            return check_reply(m.decode(frames[0]))


def request(address: str, hello: m.Hello, msg: m.Msg, reply_type: type[R],
            timeout: float = 10.0) -> R:
    """Connect, authenticate, send ``msg`` and return the first ``reply_type`` answer.
    Raises OSError (unreachable, timed out, closed) or ProtocolError (refused)."""
    sock = connect_socket(address, timeout)
    try:
        handshake(sock, hello)
        sock.sendall(frame(m.encode(msg)))
        decoder = FrameDecoder()
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError(f"{address} closed the connection before answering")
            for payload in decoder.feed(data):
                reply = m.decode(payload)
                if isinstance(reply, reply_type):
                    return reply
    finally:
        sock.close()


class FramedClient:
    """An asyncio client connection with framing, used by daemons to reach each other."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self._frames: list[bytes | memoryview] = []

    @classmethod
    async def connect(cls, address: str, hello: m.Hello, timeout: float = 10.0) -> tuple[
            FramedClient, m.HelloReply]:
        """Connect and authenticate. Raises OSError, TimeoutError or ProtocolError."""
        sock, target = _socket_for(address)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, target),
                                   timeout)
            if sock.family == socket.AF_UNIX:
                reader, writer = await asyncio.open_unix_connection(sock=sock)
            else:
                reader, writer = await asyncio.open_connection(sock=sock)
        except BaseException:
            sock.close()
            raise
        client = cls(reader, writer)
        try:
            client.send(hello)
            reply = check_reply(await asyncio.wait_for(client.receive(), timeout))
        except BaseException:
            client.close()
            raise
        return client, reply

    def send(self, msg: m.Msg) -> None:
        self.writer.write(frame(m.encode(msg)))

    async def receive(self) -> Any:
        """The next message; raises ConnectionError at EOF."""
        while not self._frames:
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("connection closed")
            self._frames.extend(self.decoder.feed(data))
        return m.decode(self._frames.pop(0))

    def close(self) -> None:
        self.writer.close()
