"""Connecting to a daemon: one way to open the socket and one handshake rule, for the
blocking callers (the client runtime's reactor, the CLI) and the asyncio ones (daemons).

    make_hello(role, ...)                  who connects (answered to each Challenge)
    connect_socket(address)                a socket to ``unix:/path`` or ``host:port``
    handshake(sock, token, hello)          blocking: Challenge in, (TLS if it says so,)
                                           Hello out, HelloReply in (``rtml.rpc.auth``:
                                           both sides proven); the socket to use after
    request(address, token, hello, msg, Reply)    one blocking request and its answer
    FramedClient.connect(address, token, hello)   asyncio: the same socket and rule,
                                                  then send(msg) / await receive()

The reactor's ``open_connection`` (``rtml.rpc.reactor``) opens its connections with
``connect_socket`` and ``handshake`` too.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any, TypeVar

from rtml.exceptions import ProtocolError
from rtml.ids import NO_NODE, UNKNOWN_JOB, ClientID, JobID, NodeID
from rtml.rpc import messages as m
from rtml.rpc.auth import HELLO_MAX_FRAME, answer, challenge_of, check_reply
from rtml.rpc.framing import MAX_FRAME, FrameDecoder, frame
from rtml.rpc.tls import binding_of, client_context

R = TypeVar("R", bound=m.Msg)


def make_hello(role: str, client_id: ClientID, job_id: JobID = UNKNOWN_JOB,
               sys_paths: list[str] | None = None, node_id: NodeID = NO_NODE) -> m.Hello:
    """Who connects; ``handshake`` adds the nonce and proof for each connection."""
    return m.Hello(version=m.PROTOCOL_VERSION, role=role, client_id=client_id,
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
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                sock.connect(target)
                return sock
            except BlockingIOError:  # a Unix listener's backlog is full (it is flooded, or
                if time.monotonic() > deadline:  # busy): wait, as TCP's connect does
                    raise TimeoutError(f"{address} accepted no connection within "
                                       f"{timeout:g} s") from None
                time.sleep(0.005)
    except BaseException:
        sock.close()
        raise


def handshake(sock: socket.socket, token: str, hello: m.Hello
              ) -> tuple[socket.socket, m.HelloReply]:
    """Answer the listener's Challenge with ``hello`` and check its reply, on a blocking
    socket; returns the socket to go on with (wrapped in TLS if the listener said so)
    and the reply. Raises ProtocolError (refused, or the listener is not the cluster's),
    or OSError (ssl.SSLError: TLS failed)."""
    decoder = FrameDecoder(max_frame=HELLO_MAX_FRAME)
    frames: list[bytes | memoryview] = []
    received = challenge_of(m.decode(_next_frame(sock, decoder, frames)))
    if not received.tls:
        answered = answer(received, token, hello)
        sock.sendall(frame(m.encode(answered)))
        return sock, check_reply(m.decode(_next_frame(sock, decoder, frames)), token,
                                 answered, received)
    tls = client_context().wrap_socket(sock)
    try:
        binding = binding_of(tls.getpeercert(binary_form=True))
        answered = answer(received, token, hello, binding)
        tls.sendall(frame(m.encode(answered)))
        return tls, check_reply(m.decode(_next_frame(tls, decoder, frames)), token, answered,
                                received, binding)
    except BaseException:
        tls.close()
        raise


def _next_frame(sock: socket.socket, decoder: FrameDecoder,
                frames: list[bytes | memoryview]) -> bytes | memoryview:
    """The next frame of the handshake (the listener sends nothing more before its reply)."""
    while not frames:
        data = sock.recv(65536)
        if not data:
            raise ProtocolError("peer closed the connection during the handshake")
        frames.extend(decoder.feed(data))
    return frames.pop(0)


def request(address: str, token: str, hello: m.Hello, msg: m.Msg, reply_type: type[R],
            timeout: float = 10.0) -> R:
    """Connect, authenticate, send ``msg`` and return the first ``reply_type`` answer.
    Raises OSError (unreachable, timed out, closed) or ProtocolError (refused)."""
    sock = connect_socket(address, timeout)
    try:
        sock, _ = handshake(sock, token, hello)
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
        self.tls = False  # the listener asked for TLS, and it is on

    @classmethod
    async def connect(cls, address: str, token: str, hello: m.Hello, timeout: float = 10.0
                      ) -> tuple[FramedClient, m.HelloReply]:
        """Connect and authenticate (``handshake``). Raises OSError, TimeoutError or
        ProtocolError."""
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
        client.decoder.max_frame = HELLO_MAX_FRAME
        try:
            received = challenge_of(await asyncio.wait_for(client.receive(), timeout))
            binding = b""
            if received.tls:
                await writer.start_tls(client_context(), ssl_handshake_timeout=timeout)
                client.tls = True
                binding = binding_of(
                    writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
            answered = answer(received, token, hello, binding)
            client.send(answered)
            reply = check_reply(await asyncio.wait_for(client.receive(), timeout), token,
                                answered, received, binding)
            client.decoder.max_frame = MAX_FRAME
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
