"""Framed, authenticated connections for the asyncio daemons.

    FramedProtocol --Challenge--> peer --Hello(proof)--> check_hello --> on_hello
        -> HelloReply(proof)   (rtml.rpc.auth: both sides prove they hold the token)
    peer --frames--------> FramedProtocol --decode------> on_message(conn, msg)

A TCP listener with TLS (``rtml.rpc.tls``) says so in its Challenge and upgrades the
connection (``loop.start_tls``) before the Hello, whose proof binds its certificate.

A bad first frame, a wrong token, an oversized or undecodable frame closes
that one connection with a logged reason; the daemon keeps serving. Before it proves the
token a connection gets HELLO_TIMEOUT seconds and HELLO_MAX_FRAME bytes, and a listener
holds at most MAX_PENDING such connections, MAX_PENDING_PER_PEER from one address
(``rtml.rpc.admission``: a new one displaces the oldest); refusals are logged at a
bounded rate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from rtml.exceptions import ProtocolError
from rtml.rpc import messages as m
from rtml.rpc.admission import HELLO_TIMEOUT, Admissions, RefusalLog
from rtml.rpc.auth import HELLO_MAX_FRAME, challenge, check_hello, sign
from rtml.rpc.framing import MAX_FRAME, FrameDecoder, frame
from rtml.rpc.tls import ServerTls

log = logging.getLogger(__name__)

MAX_PENDING = 512
MAX_PENDING_PER_PEER = 128  # (a node's workers start, and connect, at once)


class Peer:
    """The daemon's side of one connection; handlers receive it with each message."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.hello: m.Hello | None = None
        self.closed = False
        self.context: Any = None

    def send(self, msg: m.Msg) -> None:
        if not self.closed:
            self.transport.write(frame(m.encode(msg)))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()


class Service:
    """What a daemon implements to serve framed connections."""

    token: str

    def on_hello(self, peer: Peer, hello: m.Hello) -> m.HelloReply:
        return m.HelloReply(ok=True)

    def on_message(self, peer: Peer, msg: Any) -> None:
        raise NotImplementedError

    def on_disconnect(self, peer: Peer) -> None:
        pass


_RECV_BUFFER = memoryview(bytearray(1 << 18))
"""One receive buffer for every connection: the event loop reads one socket at a time,
and reusing it avoids a fresh 256 KiB allocation per read (see rpc.reactor)."""


class FramedProtocol(asyncio.BufferedProtocol):
    """asyncio protocol: authenticate the first frame, then dispatch messages."""

    def __init__(self, service: Service, pending: Admissions[FramedProtocol],
                 refusals: RefusalLog, tls: ServerTls | None = None) -> None:
        self.service = service
        self.pending = pending
        self.refusals = refusals
        self.tls = tls
        self.binding = tls.binding if tls is not None else b""
        self.decoder = FrameDecoder(max_frame=HELLO_MAX_FRAME)
        self.peer: Peer | None = None
        self.challenge = challenge(tls is not None)
        self.deadline: asyncio.TimerHandle | None = None
        self.upgrading: asyncio.Task[None] | None = None
        self.early: bytearray | None = bytearray() if tls is not None else None
        """What TLS delivered before ``start_tls`` returned the transport to answer on
        (the Hello can come with the handshake's last flight): read once it has."""

    def get_buffer(self, sizehint: int) -> memoryview:
        return _RECV_BUFFER

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(_RECV_BUFFER[:nbytes])

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.peer = Peer(transport)
        address = transport.get_extra_info("peername")
        host = address[0] if isinstance(address, tuple) else "local"
        displaced = self.pending.arrive(self, host)
        if displaced is not None and displaced.peer is not None:
            displaced.peer.close()
            self.refusals.refused(f"closed the oldest connection still proving the token, "
                                  f"for a new one from {host}")
        loop = asyncio.get_running_loop()
        self.deadline = loop.call_later(HELLO_TIMEOUT, self._too_slow)
        self.peer.send(self.challenge)
        if self.tls is not None:
            transport.pause_reading()  # nothing is read in plain text after the Challenge
            self.upgrading = loop.create_task(self._upgrade(transport, self.tls))

    async def _upgrade(self, transport: asyncio.Transport, tls: ServerTls) -> None:
        """TLS from here on (the connector starts it once it has read the Challenge)."""
        try:
            wrapped = await asyncio.get_running_loop().start_tls(
                transport, self, tls.context, server_side=True,
                ssl_handshake_timeout=HELLO_TIMEOUT)
        except (TimeoutError, OSError, ConnectionError) as exc:
            self.refusals.refused(f"TLS handshake failed: {exc}")
            transport.close()
            return
        peer = self.peer
        if peer is None or wrapped is None:
            return
        peer.transport = wrapped
        early, self.early = self.early, None
        if early:
            self.data_received(bytes(early))

    def _too_slow(self) -> None:
        peer = self.peer
        if peer is not None and peer.hello is None and not peer.closed:
            self.refusals.refused(f"no Hello within {HELLO_TIMEOUT:g} s")
            peer.close()

    def data_received(self, data: bytes | memoryview) -> None:
        peer = self.peer
        assert peer is not None
        if self.early is not None:  # TLS is on, its transport not ours yet: keep it
            self.early += data
            return
        try:
            for payload in self.decoder.feed(data):
                if peer.closed:
                    return
                msg = m.decode(payload)
                if peer.hello is None:
                    self._authenticate(peer, msg)
                else:
                    self._dispatch(peer, msg)
        except (ProtocolError, msgspec.DecodeError, ValueError) as exc:
            if peer.hello is None:
                self.refusals.refused(str(exc))
                peer.send(m.HelloReply(ok=False, error=str(exc)))
            else:
                log.warning("closing connection: %s", exc)
            peer.close()

    def _dispatch(self, peer: Peer, msg: object) -> None:
        try:
            self.service.on_message(peer, msg)
        except Exception:  # e.g. the control plane is down: log, keep the connection
            log.exception("handling %s failed", type(msg).__name__)

    def _authenticate(self, peer: Peer, msg: object) -> None:
        hello = check_hello(msg, self.service.token, self.challenge, self.binding)
        self._settled()
        reply = self.service.on_hello(peer, hello)
        peer.hello = hello
        self.decoder.max_frame = MAX_FRAME
        peer.send(sign(reply, self.service.token, hello, self.challenge, self.binding)
                  if reply.ok else reply)
        if not reply.ok:
            peer.close()

    def _settled(self) -> None:
        """No longer a pending connection (proven, or gone)."""
        self.pending.leave(self)
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        peer = self.peer
        assert peer is not None
        self._settled()
        peer.closed = True
        if peer.hello is not None:
            try:
                self.service.on_disconnect(peer)
            except Exception:
                log.exception("cleaning up after a disconnect failed")


def protocol_factory(service: Service, tls: ServerTls | None = None
                     ) -> Callable[[], FramedProtocol]:
    """The protocols of one listener of ``service`` (its own caps on pending connections);
    ``tls``: a TCP listener's TLS, if the cluster uses it."""
    pending: Admissions[FramedProtocol] = Admissions(MAX_PENDING, MAX_PENDING_PER_PEER)
    refusals = RefusalLog(log, type(service).__name__)
    return lambda: FramedProtocol(service, pending, refusals, tls)
