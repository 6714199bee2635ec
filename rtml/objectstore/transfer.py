"""Node-to-node object transfer: a node manager pulls an object's file from another.

gRPC is the control plane of every pull; the bytes of a large object travel on a side stream
that the control plane opens. Data flow of one pull (node B needs an object node A holds)::

    node B: pull()                                     node A: TransferServer
    --------------                                     ----------------------
    open dest.<pid>-<random>.pull.tmp (O_EXCL)
    OpenStream(PullRequest) ---- gRPC, unary ------->  check rtml-token, rtml-version
      metadata: rtml-token, rtml-version                 (before any file is touched)
                                                       fd = open(locate(object_id))
                                                         (NOT_FOUND if gone)
                            <---- StreamTicket ------  size >= STREAM_MIN_BYTES: a random
                                  ticket, port,          32-byte ticket, single use, ~30 s,
                                  total_size             bound to fd; smaller: no ticket
    large object (a ticket came back):
      posix_fallocate(tmp, total_size)
      connect(host, port), send ticket --- TCP --->  side listener, a thread per connection:
                                                       no valid ticket within 5 s: close
      splice socket -> pipe -> tmp  <-- raw bytes --   sendfile(fd), total_size bytes
      wait for EOF                  <--- close -----   on_served(object_id, requester_node)
    small object (no ticket):
      Pull(PullRequest) ------ one HTTP/2 stream --->  authenticate, open, preadv(fd)
      for each Chunk:        <--- Chunk(total_size, -  into one buffer, encode_chunk, yield
        pwrite(tmp, data, offset)  offset, data)       on_served(object_id, requester_node)
    link(tmp, dest); unlink(tmp)

**Why a side stream.** grpcio's Python layer copies every received message about three
times: on the 2-core VM of ``benchmarks/transfer.py`` a 100 MiB ``Pull`` runs at ~0.75 GB/s
when the machine is quiet (grpcio alone, with no files, does 0.5-1.0 GB/s there), under the
1 GB/s budget, while raw loopback TCP moves the same bytes at ~2 GB/s. On the side stream no
byte enters Python: the holder ``sendfile``s, the puller ``splice``s socket -> pipe -> file,
one copy in all, in the kernel. Measured there while other work kept the load at 2-5, 15
pulls of each kind interleaved, in 11 runs: side stream 0.63-1.17 GB/s median (best 0.8-1.5),
against 0.33-0.57 for ``Pull`` in the same runs (1.5-2.1x). The puller is the bottleneck,
~0.9 ms of CPU per MiB: ~40% in ``posix_fallocate`` (fresh tmpfs pages are slow to allocate
on that VM), the rest in the kernel's TCP receive and the copy into the file. ``recv_into``
an ``mmap`` of the file, the obvious zero-copy receiver, measured ~0.5 GB/s: each 4 KiB page
of a fresh tmpfs mapping costs a 2-5 us fault there, more than the copy it saves. It remains
the receiver where ``os.splice`` is missing (``STREAM_RECEIVER``).

**Which objects.** A side stream costs one network round trip more than ``Pull`` on the
open channel (its TCP handshake) and saves grpcio's per-byte CPU. On loopback it wins at every
size measured, down to empty objects (a 200 KB pull: 1.4 ms, against 2.1 ms by ``OpenStream``
then ``Pull``). ``STREAM_MIN_BYTES`` (4 MiB, ~4 ms of transfer at 1 GB/s) is conservative: it
keeps the handshake off small pulls across links whose round trips take milliseconds; lower
``TransferServer.stream_min_bytes`` on a LAN. Smaller objects keep ``Pull``, one round trip
(the ``OpenStream`` that says they are small, ~0.7 ms on loopback) slower than before side
streams.

**Puller** (``pull``). The object lands in a private temporary file next to ``dest`` and is
hard-linked into place only once every byte has arrived, so a reader mapping ``dest`` with
``read_segment`` never sees a partial object (the rule ``write_segment`` follows). gRPC
status codes become rtml errors: NOT_FOUND -> ``ObjectLostError``; a refused token or
version, or an unreachable node -> ``RtmlSystemError``. One channel per address is cached.
A side stream that breaks, or whose ticket the holder refuses, is a ``RtmlSystemError``: the
holder keeps the file open from ``OpenStream`` on, so it cannot lose the object meanwhile.

**Holder** (``TransferServer``). A synchronous ``grpc.server`` on its own small thread pool,
so the node manager's asyncio loop is never involved, plus the side listener's threads.
Every call is authenticated from its metadata before ``locate`` runs. A side connection gets
nothing but the file of the ticket it presents; an unknown, reused or expired ticket gets the
connection closed with nothing sent (the holder logs which). Files are sent from an open
descriptor: one unlinked mid-pull (spilled or deleted) is still sent whole and intact, since
segments are immutable; one that shrinks aborts ``Pull`` with NOT_FOUND, and cuts a side
stream short.

**Wire format.** ``rtml/rpc/protos/transfer.proto`` is the contract. ``PullRequest`` and
``StreamTicket`` go through the generated protobuf classes; ``Chunk`` is encoded and decoded
here by hand, byte-identical to protobuf's encoding, because the generated class copies
``data`` when a message is built, serialized and read: dropping those copies took a 100 MiB
``Pull`` from about 0.33 to 0.75 GB/s. The generated gRPC stub stays usable by other clients
(see the tests), side stream included.
"""

from __future__ import annotations

import collections
import fcntl
import hmac
import logging
import mmap
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Generator
from concurrent import futures
from typing import Any, NamedTuple, NoReturn

import grpc

from rtml.exceptions import ObjectLostError, ProtocolError, RtmlSystemError
from rtml.rpc.messages import PROTOCOL_VERSION
from rtml.rpc.protos import transfer_pb2

__all__ = ["CHUNK_BYTES", "STREAM_MIN_BYTES", "ChunkView", "TransferServer", "call_metadata",
           "close_channels", "decode_chunk", "encode_chunk", "pull"]

logger = logging.getLogger(__name__)

# 1-2 MiB measured best on loopback (benchmarks/transfer.py): 4 MiB messages cost more
# fresh-page faults in grpcio's buffers, 256 KiB ones more per-message thread hand-offs.
CHUNK_BYTES = 1024 * 1024
STREAM_MIN_BYTES = 4 * 1024 * 1024  # objects this large or larger travel on a side stream
TICKET_BYTES = 32
TOKEN_KEY = "rtml-token"
VERSION_KEY = "rtml-version"
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # any peer's chunk plus its header must fit
_SERVER_THREADS = 4  # concurrent gRPC calls served; more queue
_MAX_STREAMS = 64  # side connections served at once; more are closed at once
_MAX_TICKETS = 1024  # tickets open at once (each holds a descriptor); more are refused
_SEND_STALL_SECONDS = 60.0  # a puller that reads nothing for this long is dropped
_PIPE_BYTES = 1024 * 1024  # the puller's splice pipe (the unprivileged maximum)
_OPTIONS = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
]
_SERVICE = transfer_pb2.DESCRIPTOR.services_by_name["ObjectTransfer"].full_name

Locate = Callable[[bytes], str | None]
OnServed = Callable[[bytes, bytes], None]


# -- wire format of Chunk ----------------------------------------------------------------------


class ChunkView(NamedTuple):
    """A decoded ``Chunk``; ``data`` is a view into the received message (no copy)."""

    total_size: int
    offset: int
    data: memoryview


def encode_chunk(total_size: int, offset: int, data: bytes | bytearray | memoryview) -> bytes:
    """Serialize a ``Chunk``: the bytes ``transfer_pb2.Chunk(...).SerializeToString()`` gives."""
    header = bytearray()
    if total_size:
        header += b"\x08" + _varint(total_size)  # field 1, varint
    if offset:
        header += b"\x10" + _varint(offset)  # field 2, varint
    if len(data):
        header += b"\x1a" + _varint(len(data))  # field 3, length-delimited
    return b"".join((header, data))  # the one copy of the data on the sending side


def decode_chunk(message: bytes) -> ChunkView:
    """Parse a serialized ``Chunk`` (any field order; unknown fields skipped).

    Raises ``ProtocolError`` if ``message`` is not a well-formed ``Chunk``.
    """
    view = memoryview(message)
    values = {1: 0, 2: 0}
    data = view[0:0]
    pos = 0
    while pos < len(view):
        key, pos = _read_varint(view, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _read_varint(view, pos)
            values[number] = value
        elif wire_type == 2:
            length, pos = _read_varint(view, pos)
            if number == 3:
                data = view[pos : pos + length]
            pos += length
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
        else:
            raise ProtocolError(
                f"Chunk message has field {number} of unknown wire type {wire_type}")
    if pos != len(view):
        raise ProtocolError("Chunk message ends inside a field")
    return ChunkView(values[1], values[2], data)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; raises ProtocolError if cut short."""
    value = shift = 0
    for index in range(pos, min(pos + 10, len(view))):
        byte = view[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, index + 1
        shift += 7
    raise ProtocolError("Chunk message has a truncated or over-long varint")


# -- holder: side-stream tickets (no I/O but closing descriptors) ---------------------------------


class _Ticket(NamedTuple):
    """An open object file waiting for the side connection that presents its ticket."""

    fd: int
    size: int
    object_id: bytes
    requester_node: bytes
    expires: float  # time.monotonic()


class _Tickets:
    """Live tickets, each owning its descriptor until redeemed (then the redeemer owns it).

    Every method is thread-safe. A descriptor is closed under the lock, so once ``redeem``
    or ``expire`` has returned, no descriptor of a ticket it dropped is still open.
    """

    _RETIRED_KEPT = 4096  # used or expired tickets remembered, to log why one is refused

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[bytes, _Ticket] = {}
        self._retired: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._closed = False

    def issue(self, entry: _Ticket) -> bytes | None:
        """A new ticket owning ``entry.fd``; None (the caller keeps the fd) if closed or full."""
        ticket = secrets.token_bytes(TICKET_BYTES)
        with self._lock:
            if self._closed or len(self._live) >= _MAX_TICKETS:
                return None
            self._live[ticket] = entry
        return ticket

    def redeem(self, ticket: bytes, now: float) -> _Ticket | str:
        """The ticket's entry (its fd now the caller's), or why it is refused."""
        with self._lock:
            entry = self._live.pop(ticket, None)
            if entry is None:
                return self._retired.get(ticket, "unknown (forged, or not issued by this node)")
            if entry.expires <= now:
                self._retire(ticket, entry, "expired")
                return "expired"
            self._remember(ticket, "already used")
            return entry

    def expire(self, now: float) -> float | None:
        """Close the descriptors of expired tickets; seconds until the next expiry, or None."""
        with self._lock:
            for ticket, entry in list(self._live.items()):
                if entry.expires <= now:
                    del self._live[ticket]
                    self._retire(ticket, entry, "expired")
            soonest = min((entry.expires for entry in self._live.values()), default=None)
        return None if soonest is None else soonest - now

    def close(self) -> None:
        """Close every live ticket's descriptor; later ``issue`` calls return None."""
        with self._lock:
            self._closed = True
            for ticket, entry in list(self._live.items()):
                self._retire(ticket, entry, "withdrawn: the node stopped serving")
            self._live.clear()

    def _retire(self, ticket: bytes, entry: _Ticket, why: str) -> None:
        os.close(entry.fd)
        self._remember(ticket, why)

    def _remember(self, ticket: bytes, why: str) -> None:
        self._retired[ticket] = why
        while len(self._retired) > self._RETIRED_KEPT:
            self._retired.popitem(last=False)


# -- holder: the side listener ---------------------------------------------------------------------


class _SideStream:
    """The TCP listener of side streams: a ticket in, the ticket's file out, then close.

    ``on_sent(object_id, requester_node)`` runs once a whole file was handed to the kernel,
    before the connection closes (so a puller that saw EOF knows it ran).
    """

    def __init__(self, host: str, tickets: _Tickets, on_sent: OnServed,
                 ticket_wait: Callable[[], float]) -> None:
        self._host = host
        self._tickets = tickets
        self._on_sent = on_sent
        self._ticket_wait = ticket_wait
        self._lock = threading.Lock()
        self._active: dict[socket.socket, threading.Thread] = {}
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None

    def start(self) -> int:
        """Listen on a free port of the host; returns the port. Raises ``OSError``."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        self._listener = socket.create_server((self._host, 0), family=family, backlog=64)
        self._acceptor = threading.Thread(target=self._accept_loop, name="rtml-side-accept",
                                          daemon=True)
        self._acceptor.start()
        return int(self._listener.getsockname()[1])

    def stop(self, grace: float) -> None:
        """Refuse new connections and tickets; give streams in flight ``grace`` s, then cut them."""
        self._stopping.set()
        if self._listener is not None:
            _shutdown_quietly(self._listener)  # wakes the acceptor at once
            if self._acceptor is not None:
                self._acceptor.join()
            self._listener.close()
        self._tickets.close()
        deadline = time.monotonic() + grace
        with self._lock:
            threads = list(self._active.values())
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:  # under the lock: a thread closes its socket only after removing it
            for conn in self._active:
                _shutdown_quietly(conn)  # wakes its thread, blocked in sendfile or recv
            threads = list(self._active.values())
        for thread in threads:
            thread.join(5.0)
            if thread.is_alive():  # stuck in on_served: a daemon thread, left to finish
                logger.warning("a side-stream thread did not stop within 5s")

    def _accept_loop(self) -> None:
        """Accept connections until stopped, closing expired tickets at least once a second."""
        assert self._listener is not None
        while not self._stopping.is_set():
            wait = self._tickets.expire(time.monotonic())
            self._listener.settimeout(1.0 if wait is None else min(1.0, max(wait, 0.01)))
            try:
                conn, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # shut down by stop(), or out of descriptors for a moment
                if not self._stopping.wait(0.05):
                    logger.exception("the side-stream listener failed to accept")
                continue
            self._spawn(conn, peer)

    def _spawn(self, conn: socket.socket, peer: Any) -> None:
        with self._lock:
            if self._stopping.is_set() or len(self._active) >= _MAX_STREAMS:
                logger.warning("side connection from %s closed: %s", peer,
                               "stopping" if self._stopping.is_set() else
                               f"{len(self._active)} streams already in flight")
                conn.close()
                return
            thread = threading.Thread(target=self._serve, args=(conn, peer),
                                      name="rtml-side-stream", daemon=True)
            self._active[conn] = thread
        thread.start()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        """One connection: read its ticket, send the ticket's file, close."""
        try:
            entry = self._admit(conn, peer)
            if entry is not None:
                self._send(conn, entry, peer)
        except OSError as exc:  # the puller went away, stalled, or reset the connection
            logger.info("side stream to %s broken: %s", peer, exc)
        finally:
            with self._lock:
                del self._active[conn]
            conn.close()

    def _admit(self, conn: socket.socket, peer: Any) -> _Ticket | None:
        """The entry of the valid ticket ``conn`` presents in time, or None (logged)."""
        ticket = _recv_exactly(conn, TICKET_BYTES, self._ticket_wait())
        if len(ticket) < TICKET_BYTES:
            logger.warning("side connection from %s closed: no ticket within %.1fs (%d of %d "
                           "bytes)", peer, self._ticket_wait(), len(ticket), TICKET_BYTES)
            return None
        entry = self._tickets.redeem(ticket, time.monotonic())
        if isinstance(entry, str):
            logger.warning("side connection from %s closed: ticket %s", peer, entry)
            return None
        return entry

    def _send(self, conn: socket.socket, entry: _Ticket, peer: Any) -> None:
        try:
            sent = _sendfile_all(conn, entry.fd, entry.size)
        finally:
            os.close(entry.fd)  # before the connection closes: a puller at EOF sees no leak
        if sent < entry.size:
            logger.warning("object %s shrank while being sent to %s (%d of %d bytes); it "
                           "must be re-fetched from another copy or rebuilt",
                           entry.object_id.hex(), peer, sent, entry.size)
            return
        self._on_sent(entry.object_id, entry.requester_node)


def _recv_exactly(conn: socket.socket, count: int, timeout: float) -> bytes:
    """Up to ``count`` bytes, fewer if the peer closes or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    data = b""
    while len(data) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        conn.settimeout(remaining)
        try:
            part = conn.recv(count - len(data))
        except TimeoutError:
            break
        if not part:
            break
        data += part
    return data


def _sendfile_all(conn: socket.socket, fd: int, size: int) -> int:
    """``sendfile`` bytes 0..size of ``fd``; returns the count sent (less: the file shrank).

    Raises ``TimeoutError`` if the peer reads nothing for ``_SEND_STALL_SECONDS``, and
    ``OSError`` (BrokenPipeError, ...) if the connection breaks.
    """
    conn.setblocking(False)
    poller = select.poll()
    poller.register(conn, select.POLLOUT)
    sent = 0
    while sent < size:
        try:
            count = os.sendfile(conn.fileno(), fd, sent, size - sent)
        except BlockingIOError:
            if not poller.poll(_SEND_STALL_SECONDS * 1000):
                raise TimeoutError(f"puller read nothing for {_SEND_STALL_SECONDS}s") from None
            continue
        if count == 0:
            break
        sent += count
    return sent


def _shutdown_quietly(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected (any more)
        pass


# -- holder: the gRPC service ----------------------------------------------------------------------


class TransferServer:
    """Serves this node's objects to other nodes' ``pull`` calls.

    ``locate(object_id)`` gives the path of the object's file on this node or None;
    ``on_served(object_id, requester_node)`` runs after an object was sent in full (so the
    node can record the new copy; an exception there is logged, not sent to the puller).
    Once started, ``address`` is the gRPC ``"host:port"`` and ``stream_port`` the side
    streams' port on the same host. ``stream_min_bytes`` (objects sent on a side stream),
    ``ticket_ttl`` and ``ticket_wait`` (seconds a ticket lives, and a side connection may take
    to present one) can be changed at any time; tests do.
    """

    stream_min_bytes = STREAM_MIN_BYTES
    ticket_ttl = 30.0
    ticket_wait = 5.0

    def __init__(self, host: str, token: str, locate: Locate,
                 on_served: OnServed | None = None) -> None:
        self._host = host
        self._token = token.encode()
        self._locate = locate
        self._on_served = on_served
        self._server: Any = None
        self._tickets = _Tickets()
        self._side = _SideStream(host, self._tickets, self._served, lambda: self.ticket_wait)
        self.address = ""
        self.stream_port = 0  # the side streams' port, once started

    def start(self) -> str:
        """Bind ``host`` on two free ports (gRPC, side streams) and serve; returns gRPC's
        ``"host:port"``.

        Raises ``RtmlSystemError`` if ``host`` cannot be bound.
        """
        try:
            self.stream_port = self._side.start()
        except OSError as exc:
            raise _unbindable(self._host, exc) from None
        server = grpc.server(futures.ThreadPoolExecutor(_SERVER_THREADS, "rtml-transfer"),
                             handlers=[self._handlers()], options=_OPTIONS)
        try:
            port = server.add_insecure_port(_join_host_port(self._host, 0))
        except RuntimeError as exc:
            self._side.stop(0)
            raise _unbindable(self._host, exc) from None
        server.start()
        self._server = server
        self.address = _join_host_port(self._host, port)
        return self.address

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving; pulls in flight get ``grace`` seconds, then are cancelled."""
        stopped = self._server.stop(grace) if self._server is not None else None
        self._side.stop(grace)
        if stopped is not None:
            stopped.wait()
            self._server = None

    def _handlers(self) -> Any:
        pull = grpc.unary_stream_rpc_method_handler(
            self.serve, request_deserializer=transfer_pb2.PullRequest.FromString)
        open_stream = grpc.unary_unary_rpc_method_handler(
            self.open_stream, request_deserializer=transfer_pb2.PullRequest.FromString,
            response_serializer=transfer_pb2.StreamTicket.SerializeToString)
        return grpc.method_handlers_generic_handler(
            _SERVICE, {"Pull": pull, "OpenStream": open_stream})

    def serve(self, request: transfer_pb2.PullRequest,
              context: Any) -> Generator[bytes, None, None]:
        """The ``Pull`` handler: authenticate, open the object's file, return its chunks.

        Aborts the call (``context.abort`` raises) with UNAUTHENTICATED or FAILED_PRECONDITION
        here, before ``locate`` runs, and with NOT_FOUND from the stream if the object is
        missing or shrinks while being sent.
        """
        self._authenticate(context)
        return self._stream(request, context)

    def open_stream(self, request: transfer_pb2.PullRequest,
                    context: Any) -> transfer_pb2.StreamTicket:
        """The ``OpenStream`` handler: a ticket for the object's file, or none if it is small.

        Aborts the call with UNAUTHENTICATED or FAILED_PRECONDITION before ``locate`` runs,
        NOT_FOUND if the object is not here, and UNAVAILABLE if no ticket can be issued
        (this server is stopping, or ``_MAX_TICKETS`` are pending).
        """
        self._authenticate(context)
        fd = self._open(request.object_id, context)
        try:
            size = os.fstat(fd).st_size
            ticket = b""
            if size >= self.stream_min_bytes:
                ticket = self._issue(fd, size, request, context)  # which owns fd from now on
        except BaseException:
            os.close(fd)
            raise
        if not ticket:  # a small object: to be pulled with Pull
            os.close(fd)
        return transfer_pb2.StreamTicket(ticket=ticket, port=self.stream_port if ticket else 0,
                                         total_size=size)

    def _issue(self, fd: int, size: int, request: transfer_pb2.PullRequest,
               context: Any) -> bytes:
        """A ticket that owns ``fd`` from now on; aborts with UNAVAILABLE (fd still the
        caller's) if none can be issued."""
        ticket = self._tickets.issue(_Ticket(fd, size, request.object_id,
                                             request.requester_node,
                                             time.monotonic() + self.ticket_ttl))
        if ticket is None:
            _abort(context, grpc.StatusCode.UNAVAILABLE,
                   f"node {self.address} cannot open a side stream now (stopping, or "
                   f"{_MAX_TICKETS} pending); retry the pull")
        return ticket

    def _authenticate(self, context: Any) -> None:
        metadata = dict(context.invocation_metadata())
        if not hmac.compare_digest(str(metadata.get(TOKEN_KEY, "")).encode(), self._token):
            _abort(context, grpc.StatusCode.UNAUTHENTICATED,
                   f"wrong cluster token for node {self.address}; start every node of the "
                   "cluster with the same --token (or RTML_TOKEN)")
        version = str(metadata.get(VERSION_KEY, "(none)"))
        if version != str(PROTOCOL_VERSION):
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                   f"protocol version {version}, this node ({self.address}) speaks "
                   f"{PROTOCOL_VERSION}; run the same rtml version on every node")

    def _open(self, object_id: bytes, context: Any) -> int:
        """Open the object's file; a second ``locate`` covers a spill racing the first."""
        for _attempt in range(2):
            path = self._locate(object_id)
            if path is None:
                break
            try:
                return os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
        _abort(context, grpc.StatusCode.NOT_FOUND,
               f"object {object_id.hex()} is not on node {self.address}")

    def _stream(self, request: transfer_pb2.PullRequest,
                context: Any) -> Generator[bytes, None, None]:
        """Yield the object's encoded chunks, then run ``on_served``.

        The file is opened on the first ``next`` (inside the generator), so a call cancelled
        before that leaks no descriptor.
        """
        fd = self._open(request.object_id, context)
        try:
            total = os.fstat(fd).st_size
            buffer = memoryview(bytearray(min(CHUNK_BYTES, total)))  # reused: no page faults
            offset = 0
            while True:
                want = min(len(buffer), total - offset)
                got = os.preadv(fd, [buffer[:want]], offset) if want else 0
                if want and not got:
                    _abort(context, grpc.StatusCode.NOT_FOUND,
                           f"object {request.object_id.hex()} shrank on node {self.address} "
                           f"while being sent ({offset} of {total} bytes); it must be "
                           "re-fetched from another copy or rebuilt")
                yield encode_chunk(total if offset == 0 else 0, offset, buffer[:got])
                offset += got
                if offset >= total:
                    break
        finally:
            os.close(fd)
        self._served(request.object_id, request.requester_node)

    def _served(self, object_id: bytes, requester_node: bytes) -> None:
        if self._on_served is None:
            return
        try:
            self._on_served(object_id, requester_node)
        except Exception:  # bookkeeping must not fail a pull whose bytes were all sent
            logger.exception("on_served failed for object %s", object_id.hex())


def _unbindable(host: str, exc: BaseException) -> RtmlSystemError:
    return RtmlSystemError(f"object transfer server cannot bind {host} ({exc}); pass an "
                           "address of this machine")


def _abort(context: Any, code: Any, details: str) -> NoReturn:
    context.abort(code, details)
    raise AssertionError("grpc's context.abort returned")  # it always raises


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _host_of(address: str) -> str:
    """The host part of ``"host:port"`` or ``"[v6 host]:port"``."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


# -- puller: channels ------------------------------------------------------------------------------


class _Methods(NamedTuple):
    pull: Any
    open_stream: Any


_channels: dict[str, tuple[Any, _Methods]] = {}  # address -> (channel, its methods)
_channels_lock = threading.Lock()


def _methods(address: str) -> _Methods:
    """The RPCs on the cached channel to ``address`` (the channel is opened on first use)."""
    with _channels_lock:
        entry = _channels.get(address)
        if entry is None:
            channel = grpc.insecure_channel(address, options=_OPTIONS)
            serialize = transfer_pb2.PullRequest.SerializeToString
            methods = _Methods(
                channel.unary_stream(f"/{_SERVICE}/Pull", request_serializer=serialize,
                                     response_deserializer=decode_chunk),
                channel.unary_unary(f"/{_SERVICE}/OpenStream", request_serializer=serialize,
                                    response_deserializer=transfer_pb2.StreamTicket.FromString))
            entry = _channels[address] = (channel, methods)
        return entry[1]


def close_channels() -> None:
    """Close every cached channel, cancelling pulls in flight; a later ``pull`` reopens."""
    with _channels_lock:
        entries = list(_channels.values())
        _channels.clear()
    for channel, _methods_of_channel in entries:
        channel.close()


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata that authenticates a call: cluster token and protocol version."""
    return ((TOKEN_KEY, token), (VERSION_KEY, str(PROTOCOL_VERSION)))


# -- puller ----------------------------------------------------------------------------------------


class _Pull(NamedTuple):
    """What every step of one pull needs to know."""

    address: str
    token: str
    request: transfer_pb2.PullRequest
    timeout: float
    deadline: float  # time.monotonic()

    def remaining(self) -> float:
        """Seconds left; raises ``TimeoutError`` when none are."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"pull took longer than {self.timeout}s")
        return left


def pull(address: str, token: str, object_id: bytes, dest_path: str,
         requester_node: bytes = b"", timeout: float = 60.0) -> int:
    """Copy object ``object_id`` from the node serving at ``address`` to ``dest_path``.

    Returns the object's size in bytes. ``dest_path`` appears complete or not at all; if it
    exists already, nothing is pulled and its size is returned. ``timeout`` bounds the whole
    pull. Raises ``ObjectLostError`` if that node does not have the object (or, pulling a
    small object in chunks, lost it mid-pull); ``RtmlSystemError`` if it refuses the token or
    protocol version, cannot be reached or does not finish within ``timeout``, breaks the
    protocol, or a large object's side stream fails or ends early; ``OSError`` if
    ``dest_path``'s filesystem is full. No temporary file is left behind on failure.
    """
    try:
        return os.stat(dest_path).st_size
    except FileNotFoundError:
        pass
    tmp = f"{dest_path}.{os.getpid()}-{secrets.token_hex(4)}.pull.tmp"
    started = time.perf_counter()
    request = transfer_pb2.PullRequest(object_id=object_id, requester_node=requester_node)
    job = _Pull(address, token, request, timeout, time.monotonic() + timeout)
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)  # RDWR: mmap needs it
    try:
        try:
            size = _receive(job, fd)
        finally:
            os.close(fd)
        _link_into_place(tmp, dest_path)
    finally:
        _unlink_quietly(tmp)
    logger.debug("pulled object %s (%d bytes) from %s in %.3fs", object_id.hex(), size,
                 address, time.perf_counter() - started)
    return size


def _receive(job: _Pull, fd: int) -> int:
    """Write the object into ``fd``, on a side stream if the holder offers one. As ``pull``."""
    try:
        ticket = _methods(job.address).open_stream(
            job.request, timeout=job.timeout, metadata=call_metadata(job.token))
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise _translate(exc, job) from None
        ticket = None  # a holder from before side streams
    if ticket is not None and ticket.ticket:
        return _receive_stream(job, ticket, fd)
    return _receive_chunks(job, fd)


# -- puller: the side stream -----------------------------------------------------------------------

Receiver = Callable[[socket.socket, int, int, _Pull], int]


def _receive_stream(job: _Pull, ticket: transfer_pb2.StreamTicket, fd: int) -> int:
    """Receive the ticket's object into ``fd`` over a side connection; returns its size.

    Raises ``RtmlSystemError`` if the connection fails, breaks, times out or ends early.
    """
    total = ticket.total_size
    if total:  # fail now, not after the transfer, if the store is full
        os.posix_fallocate(fd, 0, total)
    with _connect(job, ticket) as conn:
        try:
            conn.sendall(ticket.ticket)
            received = _RECEIVERS[STREAM_RECEIVER](conn, fd, total, job) if total else 0
            if received == total:
                _expect_eof(conn, job)
        except (ConnectionError, TimeoutError) as exc:  # not the file's errors (ENOSPC)
            raise _stream_failed(job, ticket, exc) from None
    if received < total:
        raise _stream_cut(job, received, total)
    return total


def _connect(job: _Pull, ticket: transfer_pb2.StreamTicket) -> socket.socket:
    """A connection to the holder's side port; raises ``RtmlSystemError`` if none can be made."""
    try:
        return socket.create_connection((_host_of(job.address), ticket.port),
                                        timeout=job.remaining())
    except OSError as exc:
        raise _stream_failed(job, ticket, exc) from None


def _splice_into(conn: socket.socket, fd: int, total: int, job: _Pull) -> int:
    """Move up to ``total`` bytes from ``conn`` into ``fd`` from offset 0, in the kernel
    (socket -> pipe -> file); returns the count moved (less: the peer closed early)."""
    read_end, write_end = os.pipe()
    try:
        try:
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        except OSError:  # above /proc/sys/fs/pipe-max-size here: keep the 64 KiB default
            pass
        conn.setblocking(False)  # waits go through poll, bounded by the pull's deadline
        received = 0
        while received < total:
            moved = _splice_from(conn, write_end, min(total - received, _PIPE_BYTES), job)
            if not moved:
                break
            _splice_out(read_end, fd, moved, received)
            received += moved
        return received
    finally:
        os.close(read_end)
        os.close(write_end)


def _splice_from(conn: socket.socket, pipe: int, count: int, job: _Pull) -> int:
    """Splice what ``conn`` has (up to ``count``) into the empty ``pipe``; 0 at EOF."""
    while True:
        try:
            return os.splice(conn.fileno(), pipe, count)
        except BlockingIOError:
            _wait_readable(conn, job)


def _splice_out(pipe: int, fd: int, count: int, offset: int) -> None:
    """Move all ``count`` bytes in ``pipe`` to ``fd`` at ``offset``."""
    while count:
        moved = os.splice(pipe, fd, count, offset_dst=offset)
        offset += moved
        count -= moved


def _wait_readable(conn: socket.socket, job: _Pull) -> None:
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    if not poller.poll(job.remaining() * 1000):
        raise TimeoutError(f"pull took longer than {job.timeout}s")


def _recv_into_mapping(conn: socket.socket, fd: int, total: int, job: _Pull) -> int:
    """Receive up to ``total`` bytes from ``conn`` into a shared mapping of ``fd``; returns
    the count received (less: the peer closed early)."""
    with mmap.mmap(fd, total) as mapping:
        view = memoryview(mapping)
        try:
            received = 0
            while received < total:
                conn.settimeout(job.remaining())
                got = conn.recv_into(view[received:])
                if not got:
                    break
                received += got
        finally:
            view.release()  # before the mapping closes, or close() fails
    return received


_RECEIVERS: dict[str, Receiver] = {"splice": _splice_into, "mmap": _recv_into_mapping}
STREAM_RECEIVER = "splice" if hasattr(os, "splice") else "mmap"  # see the module docstring


def _expect_eof(conn: socket.socket, job: _Pull) -> None:
    """Wait for the holder to close (after its ``on_served``); raises ``RtmlSystemError`` if
    it sends more than the object."""
    conn.settimeout(job.remaining())
    if conn.recv(1):
        raise RtmlSystemError(
            f"node at {job.address} sent more than the {job.request.object_id.hex()} object's "
            "bytes on its side stream (protocol error); run the same rtml version on every "
            "node")


def _stream_failed(job: _Pull, ticket: transfer_pb2.StreamTicket,
                   exc: BaseException) -> RtmlSystemError:
    """The rtml error for a side stream that could not connect, broke or ran out of time."""
    object_hex = job.request.object_id.hex()
    if isinstance(exc, TimeoutError):
        return RtmlSystemError(
            f"cannot reach the node at {job.address}: pulling object {object_hex} took longer "
            f"than {job.timeout}s on its side stream (port {ticket.port}); check the node and "
            "the network, or pass a larger timeout")
    return RtmlSystemError(
        f"cannot pull object {object_hex} from the node at {job.address}: its side stream "
        f"(port {ticket.port}) failed ({exc}); check that the node is alive and its transfer "
        "ports are reachable from here, then retry the pull")


def _stream_cut(job: _Pull, received: int, total: int) -> RtmlSystemError:
    object_hex = job.request.object_id.hex()
    if not received:
        return RtmlSystemError(
            f"node at {job.address} closed the side stream of object {object_hex} without "
            "sending anything: it refused the ticket (expired or already used) or stopped; "
            "its log says which. Retry the pull")
    return RtmlSystemError(
        f"node at {job.address} closed the side stream of object {object_hex} after "
        f"{received} of {total} bytes (it stopped, or the object shrank there; its log says "
        "which); retry the pull")


# -- puller: chunks over gRPC ----------------------------------------------------------------------


def _receive_chunks(job: _Pull, fd: int) -> int:
    """Write the object's chunks, streamed by ``Pull``, into ``fd``; returns its size."""
    total, received = -1, 0  # -1 until the first chunk gives the size
    try:
        chunks = _methods(job.address).pull(job.request, timeout=job.remaining(),
                                             metadata=call_metadata(job.token))
        for chunk in chunks:
            if total < 0:
                total = chunk.total_size
                if total:  # fail now, not after the transfer, if the store is full
                    os.posix_fallocate(fd, 0, total)
            _check_chunk(chunk, received, total, job.address)
            _pwrite_all(fd, chunk.data, chunk.offset)
            received += len(chunk.data)
    except grpc.RpcError as exc:
        raise _translate(exc, job) from None
    except TimeoutError:  # no time left after OpenStream
        raise _timed_out(job) from None
    if total < 0 or received != total:
        raise RtmlSystemError(
            f"node at {job.address} ended the stream of object {job.request.object_id.hex()} "
            f"after {received} of {max(total, 0)} bytes; retry the pull")
    return total


def _check_chunk(chunk: ChunkView, received: int, total: int, address: str) -> None:
    """Raises RtmlSystemError unless ``chunk`` continues the stream where it left off."""
    if chunk.offset != received or received + len(chunk.data) > total:
        raise RtmlSystemError(
            f"node at {address} sent bytes {chunk.offset}..{chunk.offset + len(chunk.data)} "
            f"of a {total}-byte object after {received} bytes (protocol error); run the same "
            "rtml version on every node")


def _translate(exc: Any, job: _Pull) -> Exception:
    """The rtml error for a failed ``Pull`` or ``OpenStream`` call."""
    code, details = exc.code(), exc.details()
    address, object_hex = job.address, job.request.object_id.hex()
    if code == grpc.StatusCode.NOT_FOUND:
        return ObjectLostError(
            f"object {object_hex} cannot be pulled from the node at {address}: {details}")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION):
        return RtmlSystemError(f"node at {address} refused to send object "
                               f"{object_hex}: {details}")
    if code == grpc.StatusCode.UNAVAILABLE:
        return RtmlSystemError(f"cannot reach the node at {address} to pull object "
                               f"{object_hex} ({details}); check that the node is alive "
                               "and its transfer port is reachable from here")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return _timed_out(job)
    return RtmlSystemError(f"pulling object {object_hex} from the node at {address} "
                           f"failed ({code.name}: {details})")


def _timed_out(job: _Pull) -> RtmlSystemError:
    return RtmlSystemError(f"cannot reach the node at {job.address}: pulling object "
                           f"{job.request.object_id.hex()} took longer than {job.timeout}s; "
                           "check the node and the network, or pass a larger timeout")


def _link_into_place(tmp: str, dest_path: str) -> None:
    try:
        os.link(tmp, dest_path)
    except FileExistsError:  # a concurrent pull of the same object finished first
        pass


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
