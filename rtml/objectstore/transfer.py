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

**Modules.** This one holds the gRPC service (``TransferServer``), the puller (``pull``, its
cached channels, its error translation) and the API other modules use. The side stream
(tickets, the side listener, the receivers) is ``transfer_stream``, whose docstring says why
it exists: grpcio's Python layer copies every received message about three times, while no
byte of a side stream enters Python. ``transfer_wire`` encodes and decodes ``Chunk`` by hand;
``rtml/rpc/protos/transfer.proto`` is the contract.

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

**Holder** (``TransferServer``). A synchronous ``grpc.server`` on its own small thread pool,
so the node manager's asyncio loop is never involved, plus the side listener's threads.
Every call is authenticated from its metadata before ``locate`` runs. Files are sent from an
open descriptor: one unlinked mid-pull (spilled or deleted) is still sent whole and intact,
since segments are immutable; one that shrinks aborts ``Pull`` with NOT_FOUND, and cuts a
side stream short.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Generator
from concurrent import futures
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import grpc

from rtml.exceptions import ObjectLostError, RtmlSystemError
from rtml.ids import NO_NODE, NodeID, ObjectID
from rtml.objectstore.private import open_private
from rtml.objectstore.segment import existing_size, pwrite_all, unlink_quietly
from rtml.objectstore.transfer_stream import (
    MAX_TICKETS,
    PullJob,
    SideStream,
    Ticket,
    Tickets,
    receive_stream,
)
from rtml.objectstore.transfer_wire import ChunkView, decode_chunk, encode_chunk
from rtml.rpc.messages import PROTOCOL_VERSION
from rtml.rpc.protos import transfer_pb2
from rtml.rpc.tls import cert_name

__all__ = ["CHUNK_BYTES", "STREAM_MIN_BYTES", "TransferServer", "call_metadata",
           "close_channels", "pull"]

logger = logging.getLogger(__name__)

# 1-2 MiB measured best on loopback (benchmarks/transfer.py): 4 MiB messages cost more
# fresh-page faults in grpcio's buffers, 256 KiB ones more per-message thread hand-offs.
CHUNK_BYTES = 1024 * 1024
STREAM_MIN_BYTES = 4 * 1024 * 1024  # objects this large or larger travel on a side stream
TOKEN_KEY = "rtml-token"
"""The call metadata that authenticates a pull: ``transfer_key(token)``, never the token,
so a call seen on the wire opens this port (to read objects) and no other."""
VERSION_KEY = "rtml-version"
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # any peer's chunk plus its header must fit
_SERVER_THREADS = 4  # concurrent gRPC calls served; more queue
_OPTIONS = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
]
_SERVICE = transfer_pb2.DESCRIPTOR.services_by_name["ObjectTransfer"].full_name

Locate = Callable[[ObjectID], str | None]
OnServed = Callable[[ObjectID, NodeID], None]


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
                 on_served: OnServed | None = None, tls_files: tuple[str, str] = ("", "")
                 ) -> None:
        """``tls_files``: the node's certificate and key (PEM), to serve over TLS; then
        every object goes over gRPC, none on a side stream (whose bytes are not
        encrypted)."""
        self._host = host
        self._tls = tls_files if tls_files[0] else None
        if self._tls is not None:
            self.stream_min_bytes = sys.maxsize
        self._key = transfer_key(token).encode()
        self._locate = locate
        self._on_served = on_served
        self._server: Any = None
        self._tickets = Tickets()
        self._side = SideStream(host, self._tickets, self._served, lambda: self.ticket_wait)
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
            if self._tls is None:
                port = server.add_insecure_port(_join_host_port(self._host, 0))
            else:
                cert, key = (Path(path).read_bytes() for path in self._tls)
                port = server.add_secure_port(_join_host_port(self._host, 0),
                                              grpc.ssl_server_credentials([(key, cert)]))
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
        (this server is stopping, or ``MAX_TICKETS`` are pending).
        """
        self._authenticate(context)
        fd = self._open(ObjectID(request.object_id), context)
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
        ticket = self._tickets.issue(Ticket(fd, size, ObjectID(request.object_id),
                                             NodeID(request.requester_node),
                                             time.monotonic() + self.ticket_ttl))
        if ticket is None:
            _abort(context, grpc.StatusCode.UNAVAILABLE,
                   f"node {self.address} cannot open a side stream now (stopping, or "
                   f"{MAX_TICKETS} pending); retry the pull")
        return ticket

    def _authenticate(self, context: Any) -> None:
        metadata = dict(context.invocation_metadata())
        if not hmac.compare_digest(str(metadata.get(TOKEN_KEY, "")).encode(), self._key):
            _abort(context, grpc.StatusCode.UNAUTHENTICATED,
                   f"wrong cluster token for node {self.address}; start every node of the "
                   "cluster with the same --token (or RTML_TOKEN)")
        version = str(metadata.get(VERSION_KEY, "(none)"))
        if version != str(PROTOCOL_VERSION):
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                   f"protocol version {version}, this node ({self.address}) speaks "
                   f"{PROTOCOL_VERSION}; run the same rtml version on every node")

    def _open(self, object_id: ObjectID, context: Any) -> int:
        """Open the object's file; a second ``locate`` covers a spill racing the first."""
        for _attempt in range(2):
            path = self._locate(object_id)
            if path is None:
                break
            try:
                return open_private(path)
            except FileNotFoundError:
                continue
            except ObjectLostError as exc:
                _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        _abort(context, grpc.StatusCode.NOT_FOUND,
               f"object {object_id.hex()} is not on node {self.address}")

    def _stream(self, request: transfer_pb2.PullRequest,
                context: Any) -> Generator[bytes, None, None]:
        """Yield the object's encoded chunks, then run ``on_served``.

        The file is opened on the first ``next`` (inside the generator), so a call cancelled
        before that leaks no descriptor.
        """
        fd = self._open(ObjectID(request.object_id), context)
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
        self._served(ObjectID(request.object_id), NodeID(request.requester_node))

    def _served(self, object_id: ObjectID, requester_node: NodeID) -> None:
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


# -- puller: channels ------------------------------------------------------------------------------


class _Methods(NamedTuple):
    pull: Any
    open_stream: Any


_channels: dict[tuple[str, bytes], tuple[Any, _Methods]] = {}  # (address, root) -> ...
_channels_lock = threading.Lock()


def _methods(address: str, root_cert: bytes) -> _Methods:
    """The RPCs on the cached channel to ``address`` (the channel is opened on first use);
    over TLS if ``root_cert``, the holder's own certificate, is given (the head listed it:
    a TLS cluster's transfer servers show self-signed certificates, see rtml.rpc.tls)."""
    with _channels_lock:
        entry = _channels.get((address, root_cert))
        if entry is None:
            channel = (grpc.insecure_channel(address, options=_OPTIONS) if not root_cert else
                       grpc.secure_channel(address, grpc.ssl_channel_credentials(root_cert),
                                           options=(*_OPTIONS, ("grpc.ssl_target_name_override",
                                                                cert_name(root_cert)))))
            serialize = transfer_pb2.PullRequest.SerializeToString
            methods = _Methods(
                channel.unary_stream(f"/{_SERVICE}/Pull", request_serializer=serialize,
                                     response_deserializer=decode_chunk),
                channel.unary_unary(f"/{_SERVICE}/OpenStream", request_serializer=serialize,
                                    response_deserializer=transfer_pb2.StreamTicket.FromString))
            entry = _channels[(address, root_cert)] = (channel, methods)
        return entry[1]


def close_channels() -> None:
    """Close every cached channel, cancelling pulls in flight; a later ``pull`` reopens."""
    with _channels_lock:
        entries = list(_channels.values())
        _channels.clear()
    for channel, _methods_of_channel in entries:
        channel.close()


def transfer_key(token: str) -> str:
    """What a pull shows for the cluster token: an HMAC of it (TOKEN_KEY)."""
    return hmac.new(token.encode(), b"rtml: object transfer", hashlib.sha256).hexdigest()


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata that authenticates a call: the transfer key and protocol version."""
    return ((TOKEN_KEY, transfer_key(token)), (VERSION_KEY, str(PROTOCOL_VERSION)))


# -- puller ----------------------------------------------------------------------------------------


def pull(address: str, token: str, object_id: ObjectID, dest_path: str,
         requester_node: NodeID = NO_NODE, timeout: float = 60.0, root_cert: bytes = b""
         ) -> int:
    """Copy object ``object_id`` from the node serving at ``address`` to ``dest_path``.

    Returns the object's size in bytes. ``dest_path`` appears complete or not at all; if it
    exists already, nothing is pulled and its size is returned. ``timeout`` bounds the whole
    pull; ``root_cert``: the holder's TLS certificate (PEM) in a TLS cluster. Raises
    ``ObjectLostError`` if that node does not have the object (or, pulling a
    small object in chunks, lost it mid-pull); ``RtmlSystemError`` if it refuses the token or
    protocol version, cannot be reached or does not finish within ``timeout``, breaks the
    protocol, or a large object's side stream fails or ends early; ``OSError`` if
    ``dest_path``'s filesystem is full. No temporary file is left behind on failure.
    """
    try:
        return existing_size(dest_path)
    except FileNotFoundError:
        pass
    tmp = f"{dest_path}.{os.getpid()}-{secrets.token_hex(4)}.pull.tmp"
    started = time.perf_counter()
    request = transfer_pb2.PullRequest(object_id=object_id, requester_node=requester_node)
    job = PullJob(address, token, request, timeout, time.monotonic() + timeout, root_cert)
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)  # RDWR: mmap needs it
    try:
        try:
            size = _receive(job, fd)
        finally:
            os.close(fd)
        _link_into_place(tmp, dest_path)
    finally:
        unlink_quietly(tmp)
    logger.debug("pulled object %s (%d bytes) from %s in %.3fs", object_id.hex(), size,
                 address, time.perf_counter() - started)
    return size


def _receive(job: PullJob, fd: int) -> int:
    """Write the object into ``fd``, on a side stream if the holder offers one. As ``pull``."""
    try:
        ticket = _methods(job.address, job.root_cert).open_stream(
            job.request, timeout=job.timeout, metadata=call_metadata(job.token))
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise _translate(exc, job) from None
        ticket = None  # a holder from before side streams
    if ticket is not None and ticket.ticket:
        return receive_stream(job, ticket, fd)
    return _receive_chunks(job, fd)


# -- puller: chunks over gRPC ----------------------------------------------------------------------


def _receive_chunks(job: PullJob, fd: int) -> int:
    """Write the object's chunks, streamed by ``Pull``, into ``fd``; returns its size."""
    total, received = -1, 0  # -1 until the first chunk gives the size
    try:
        chunks = _methods(job.address, job.root_cert).pull(job.request, timeout=job.remaining(),
                                             metadata=call_metadata(job.token))
        for chunk in chunks:
            if total < 0:
                total = chunk.total_size
                if total:  # fail now, not after the transfer, if the store is full
                    os.posix_fallocate(fd, 0, total)
            _check_chunk(chunk, received, total, job.address)
            pwrite_all(fd, chunk.data, chunk.offset)
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


def _translate(exc: Any, job: PullJob) -> Exception:
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


def _timed_out(job: PullJob) -> RtmlSystemError:
    return RtmlSystemError(f"cannot reach the node at {job.address}: pulling object "
                           f"{job.request.object_id.hex()} took longer than {job.timeout}s; "
                           "check the node and the network, or pass a larger timeout")


def _link_into_place(tmp: str, dest_path: str) -> None:
    try:
        os.link(tmp, dest_path)
    except FileExistsError:  # a concurrent pull of the same object finished first
        pass
