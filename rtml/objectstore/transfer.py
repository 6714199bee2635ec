"""Node-to-node object transfer: a node manager pulls an object's file from another over gRPC.

Data flow of one pull (node B needs an object that node A holds)::

    node B: pull()                                      node A: TransferServer
    --------------                                      ----------------------
    open dest.<pid>-<random>.pull.tmp (O_EXCL)
    Pull(PullRequest) ------- one HTTP/2 stream ------>  check rtml-token, rtml-version
      metadata: rtml-token, rtml-version                   (before any file is touched)
                                                         path = locate(object_id)
                                                         fd = open(path)  (NOT_FOUND if gone)
    for each Chunk:        <---- Chunk(total_size,  ---  preadv(fd) into one buffer,
      pwrite(tmp, data, offset)   offset, data)            encode_chunk -> bytes, yield
                                                         on_served(object_id, requester_node)
    link(tmp, dest); unlink(tmp)

**Puller** (``pull``). The object lands in a private temporary file next to ``dest`` and is
hard-linked into place only once every byte has arrived, so a reader mapping ``dest`` with
``read_segment`` never sees a partial object (the rule ``write_segment`` follows). gRPC
status codes become rtml errors: NOT_FOUND -> ``ObjectLostError``; a refused token or
version, or an unreachable node -> ``RtmlSystemError``. One channel per address is cached.

**Holder** (``TransferServer``). A synchronous ``grpc.server`` on its own small thread pool,
so the node manager's asyncio loop is never involved. Every call is authenticated from its
metadata before ``locate`` runs. The file is streamed from an open descriptor: a file that is
unlinked mid-pull (spilled or deleted) is still sent whole and intact, since segments are
immutable; one that shrinks aborts the call with NOT_FOUND.

**Wire format.** ``rtml/rpc/protos/transfer.proto`` is the contract. ``PullRequest`` goes
through the generated protobuf class; ``Chunk`` is encoded and decoded here by hand,
byte-identical to protobuf's encoding, because the generated class copies ``data`` when a
message is built, serialized and read: dropping those copies took a 100 MiB pull from about
0.33 to 0.75 GB/s. The generated gRPC stub stays usable by other clients (see the tests).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Generator
from concurrent import futures
from typing import Any, NamedTuple, NoReturn

import grpc

from rtml.exceptions import ObjectLostError, ProtocolError, RtmlSystemError
from rtml.rpc.messages import PROTOCOL_VERSION
from rtml.rpc.protos import transfer_pb2

__all__ = ["CHUNK_BYTES", "ChunkView", "TransferServer", "call_metadata", "close_channels",
           "decode_chunk", "encode_chunk", "pull"]

logger = logging.getLogger(__name__)

# 1-2 MiB measured best on loopback (benchmarks/transfer.py): 4 MiB messages cost more
# fresh-page faults in grpcio's buffers, 256 KiB ones more per-message thread hand-offs.
CHUNK_BYTES = 1024 * 1024
TOKEN_KEY = "rtml-token"
VERSION_KEY = "rtml-version"
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # any peer's chunk plus its header must fit
_SERVER_THREADS = 4  # concurrent pulls served; more queue
_OPTIONS = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
]
_SERVICE = transfer_pb2.DESCRIPTOR.services_by_name["ObjectTransfer"].full_name
_PULL_METHOD = f"/{_SERVICE}/Pull"

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


# -- holder --------------------------------------------------------------------------------------


class TransferServer:
    """Serves this node's objects to other nodes' ``pull`` calls.

    ``locate(object_id)`` gives the path of the object's file on this node or None;
    ``on_served(object_id, requester_node)`` runs after a pull was streamed in full (so the
    node can record the new copy; an exception there is logged, not sent to the puller).
    """

    def __init__(self, host: str, token: str, locate: Locate,
                 on_served: OnServed | None = None) -> None:
        self._host = host
        self._token = token.encode()
        self._locate = locate
        self._on_served = on_served
        self._server: Any = None
        self.address = ""

    def start(self) -> str:
        """Bind ``host`` on a free port and start serving; returns ``"host:port"``.

        Raises ``RtmlSystemError`` if ``host`` cannot be bound.
        """
        handler = grpc.unary_stream_rpc_method_handler(
            self.serve, request_deserializer=transfer_pb2.PullRequest.FromString)
        server = grpc.server(futures.ThreadPoolExecutor(_SERVER_THREADS, "rtml-transfer"),
                             handlers=[grpc.method_handlers_generic_handler(
                                 _SERVICE, {"Pull": handler})],
                             options=_OPTIONS)
        try:
            port = server.add_insecure_port(_join_host_port(self._host, 0))
        except RuntimeError as exc:
            raise RtmlSystemError(
                f"object transfer server cannot bind {self._host} ({exc}); pass an address "
                "of this machine") from None
        server.start()
        self._server = server
        self.address = _join_host_port(self._host, port)
        return self.address

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving; pulls in flight get ``grace`` seconds, then are cancelled."""
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None

    def serve(self, request: transfer_pb2.PullRequest,
              context: Any) -> Generator[bytes, None, None]:
        """The ``Pull`` handler: authenticate, open the object's file, return its chunks.

        Aborts the call (``context.abort`` raises) with UNAUTHENTICATED or FAILED_PRECONDITION
        here, before ``locate`` runs, and with NOT_FOUND from the stream if the object is
        missing or shrinks while being sent.
        """
        self._authenticate(context)
        return self._stream(request, context)

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
        self._served(request)

    def _served(self, request: transfer_pb2.PullRequest) -> None:
        if self._on_served is None:
            return
        try:
            self._on_served(request.object_id, request.requester_node)
        except Exception:  # bookkeeping must not fail a pull whose bytes were all sent
            logger.exception("on_served failed for object %s", request.object_id.hex())


def _abort(context: Any, code: Any, details: str) -> NoReturn:
    context.abort(code, details)
    raise AssertionError("grpc's context.abort returned")  # it always raises


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# -- puller --------------------------------------------------------------------------------------

_channels: dict[str, tuple[Any, Any]] = {}  # address -> (channel, its Pull method)
_channels_lock = threading.Lock()


def _pull_method(address: str) -> Any:
    """``Pull`` on the cached channel to ``address`` (the channel is opened on first use)."""
    with _channels_lock:
        entry = _channels.get(address)
        if entry is None:
            channel = grpc.insecure_channel(address, options=_OPTIONS)
            method = channel.unary_stream(
                _PULL_METHOD, request_serializer=transfer_pb2.PullRequest.SerializeToString,
                response_deserializer=decode_chunk)
            entry = _channels[address] = (channel, method)
        return entry[1]


def close_channels() -> None:
    """Close every cached channel, cancelling pulls in flight; a later ``pull`` reopens."""
    with _channels_lock:
        entries = list(_channels.values())
        _channels.clear()
    for channel, _method in entries:
        channel.close()


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata that authenticates a ``Pull`` call: cluster token and protocol version."""
    return ((TOKEN_KEY, token), (VERSION_KEY, str(PROTOCOL_VERSION)))


def pull(address: str, token: str, object_id: bytes, dest_path: str,
         requester_node: bytes = b"", timeout: float = 60.0) -> int:
    """Copy object ``object_id`` from the node serving at ``address`` to ``dest_path``.

    Returns the object's size in bytes. ``dest_path`` appears complete or not at all; if it
    exists already, nothing is pulled and its size is returned. ``timeout`` bounds the whole
    pull. Raises ``ObjectLostError`` if that node does not have the object (or lost it
    mid-pull); ``RtmlSystemError`` if it refuses the token or protocol version, cannot be
    reached or does not finish within ``timeout``, or breaks the protocol; ``OSError`` if
    ``dest_path``'s filesystem is full. No temporary file is left behind on failure.
    """
    try:
        return os.stat(dest_path).st_size
    except FileNotFoundError:
        pass
    tmp = f"{dest_path}.{os.getpid()}-{secrets.token_hex(4)}.pull.tmp"
    started = time.perf_counter()
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        try:
            size = _receive(address, token, object_id, requester_node, timeout, fd)
        finally:
            os.close(fd)
        _link_into_place(tmp, dest_path)
    finally:
        _unlink_quietly(tmp)
    logger.debug("pulled object %s (%d bytes) from %s in %.3fs", object_id.hex(), size,
                 address, time.perf_counter() - started)
    return size


def _receive(address: str, token: str, object_id: bytes, requester_node: bytes,
             timeout: float, fd: int) -> int:
    """Write the streamed object into ``fd``; returns its size. Raises as ``pull``."""
    request = transfer_pb2.PullRequest(object_id=object_id, requester_node=requester_node)
    metadata = call_metadata(token)
    total, received = -1, 0  # -1 until the first chunk gives the size
    try:
        for chunk in _pull_method(address)(request, timeout=timeout, metadata=metadata):
            if total < 0:
                total = chunk.total_size
                if total:  # fail now, not after the transfer, if the store is full
                    os.posix_fallocate(fd, 0, total)
            _check_chunk(chunk, received, total, address)
            _pwrite_all(fd, chunk.data, chunk.offset)
            received += len(chunk.data)
    except grpc.RpcError as exc:
        raise _translate(exc, address, object_id, timeout) from None
    if total < 0 or received != total:
        raise RtmlSystemError(
            f"node at {address} ended the stream of object {object_id.hex()} after "
            f"{received} of {max(total, 0)} bytes; retry the pull")
    return total


def _check_chunk(chunk: ChunkView, received: int, total: int, address: str) -> None:
    """Raises RtmlSystemError unless ``chunk`` continues the stream where it left off."""
    if chunk.offset != received or received + len(chunk.data) > total:
        raise RtmlSystemError(
            f"node at {address} sent bytes {chunk.offset}..{chunk.offset + len(chunk.data)} "
            f"of a {total}-byte object after {received} bytes (protocol error); run the same "
            "rtml version on every node")


def _translate(exc: Any, address: str, object_id: bytes, timeout: float) -> Exception:
    """The rtml error for a failed ``Pull`` call."""
    code, details = exc.code(), exc.details()
    if code == grpc.StatusCode.NOT_FOUND:
        return ObjectLostError(
            f"object {object_id.hex()} cannot be pulled from the node at {address}: {details}")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION):
        return RtmlSystemError(f"node at {address} refused to send object "
                               f"{object_id.hex()}: {details}")
    if code == grpc.StatusCode.UNAVAILABLE:
        return RtmlSystemError(f"cannot reach the node at {address} to pull object "
                               f"{object_id.hex()} ({details}); check that the node is alive "
                               "and its transfer port is reachable from here")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RtmlSystemError(f"cannot reach the node at {address}: pulling object "
                               f"{object_id.hex()} took longer than {timeout}s; check the "
                               "node and the network, or pass a larger timeout")
    return RtmlSystemError(f"pulling object {object_id.hex()} from the node at {address} "
                           f"failed ({code.name}: {details})")


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
