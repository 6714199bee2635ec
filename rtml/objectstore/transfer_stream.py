"""Side streams: a large object's bytes on a single-use TCP connection, beside gRPC.

``transfer.TransferServer.open_stream`` (the ``OpenStream`` RPC) opens the object's file and
hands it to a ``Tickets`` registry for a ticket; ``transfer.pull`` gets that ticket back and
calls ``receive_stream``, which presents it to the holder's ``SideStream`` listener and
receives the file. Data flow of one side stream (node B pulls an object node A holds)::

    node A: holder                                   node B: puller
    --------------                                   --------------
    OpenStream: fd = open(object's file)
    Tickets.issue(Ticket(fd, size, ...)):
      32 random bytes, single use, ~30 s  --- StreamTicket (gRPC) --->  receive_stream:
                                                                        fallocate the file
    SideStream: an accept thread, then    <-- connect, send ticket ---  _connect
      a thread per connection (<= 64 that
      have not shown a ticket: a new one
      closes the oldest); Tickets.redeem(ticket);
        none valid within 5 s: close, nothing sent
      _sendfile_all(fd), total_size bytes --- raw bytes ------------->  _RECEIVERS[STREAM_RECEIVER]:
                                                                        splice socket -> pipe ->
                                                                        file, or recv_into an
                                                                        mmap of the file
      close(fd), on_sent(object_id, ...)
      close                               --- EOF ------------------->  _expect_eof
    accept thread, at least once a second: Tickets.expire closes unredeemed tickets' files

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

**Tickets.** A side connection gets nothing but the file of the ticket it presents; an
unknown, reused or expired ticket gets the connection closed with nothing sent (the holder
logs which). A side stream that breaks, or whose ticket the holder refuses, is a
``RtmlSystemError`` for the puller: the holder keeps the file open from ``OpenStream`` on,
so it cannot lose the object meanwhile.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import mmap
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from rtml.exceptions import RtmlSystemError
from rtml.ids import NodeID, ObjectID
from rtml.rpc.admission import Admissions, RefusalLog
from rtml.rpc.protos import transfer_pb2

__all__ = ["MAX_TICKETS", "STREAM_RECEIVER", "TICKET_BYTES", "PullJob", "SideStream", "Ticket",
           "Tickets", "receive_stream"]

logger = logging.getLogger(__name__)

TICKET_BYTES = 32
MAX_TICKETS = 1024  # tickets open at once (each holds a descriptor); more are refused
_MAX_UNREDEEMED = 64
"""Side connections held before they show a ticket (``rtml.rpc.admission``: a new one
closes the oldest, so idle connections cannot keep a puller out)."""
_SEND_STALL_SECONDS = 60.0  # a puller that reads nothing for this long is dropped
_PIPE_BYTES = 1024 * 1024  # the puller's splice pipe (the unprivileged maximum)

OnSent = Callable[[ObjectID, NodeID], None]  # (object_id, requester_node)


# -- holder: side-stream tickets (no I/O but closing descriptors) ---------------------------------


class Ticket(NamedTuple):
    """An open object file waiting for the side connection that presents its ticket."""

    fd: int
    size: int
    object_id: ObjectID
    requester_node: NodeID
    expires: float  # time.monotonic()


class Tickets:
    """Live tickets, each owning its descriptor until redeemed (then the redeemer owns it).

    Every method is thread-safe. A descriptor is closed under the lock, so once ``redeem``
    or ``expire`` has returned, no descriptor of a ticket it dropped is still open.
    """

    _RETIRED_KEPT = 4096  # used or expired tickets remembered, to log why one is refused

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[bytes, Ticket] = {}
        self._retired: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._closed = False

    def issue(self, entry: Ticket) -> bytes | None:
        """A new ticket owning ``entry.fd``; None (the caller keeps the fd) if closed or full."""
        ticket = secrets.token_bytes(TICKET_BYTES)
        with self._lock:
            if self._closed or len(self._live) >= MAX_TICKETS:
                return None
            self._live[ticket] = entry
        return ticket

    def redeem(self, ticket: bytes, now: float) -> Ticket | str:
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

    def _retire(self, ticket: bytes, entry: Ticket, why: str) -> None:
        os.close(entry.fd)
        self._remember(ticket, why)

    def _remember(self, ticket: bytes, why: str) -> None:
        self._retired[ticket] = why
        while len(self._retired) > self._RETIRED_KEPT:
            self._retired.popitem(last=False)


# -- holder: the side listener ---------------------------------------------------------------------


class SideStream:
    """The TCP listener of side streams: a ticket in, the ticket's file out, then close.

    ``on_sent(object_id, requester_node)`` runs once a whole file was handed to the kernel,
    before the connection closes (so a puller that saw EOF knows it ran).
    """

    def __init__(self, host: str, tickets: Tickets, on_sent: OnSent,
                 ticket_wait: Callable[[], float]) -> None:
        self._host = host
        self._tickets = tickets
        self._on_sent = on_sent
        self._ticket_wait = ticket_wait
        self._lock = threading.Lock()
        self._active: dict[socket.socket, threading.Thread] = {}
        self._unredeemed: Admissions[socket.socket] = Admissions(_MAX_UNREDEEMED,
                                                                 _MAX_UNREDEEMED)
        self._refusals = RefusalLog(logger, "the side-stream listener")
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
            if self._stopping.is_set():
                conn.close()
                return
            thread = threading.Thread(target=self._serve, args=(conn, peer),
                                      name="rtml-side-stream", daemon=True)
            self._active[conn] = thread
        displaced = self._unredeemed.arrive(conn, "")
        if displaced is not None:  # its thread's recv ends at once: no ticket, closed
            _shutdown_quietly(displaced)
            self._refusals.refused(f"closed the oldest connection without a ticket, for "
                                   f"one from {peer}")
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had: drop this one, keep accepting
            self._unredeemed.leave(conn)
            with self._lock:
                del self._active[conn]
            conn.close()
            self._refusals.refused(f"no thread for a connection ({exc})")

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        """One connection: read its ticket, send the ticket's file, close."""
        try:
            entry = self._admit(conn, peer)
            self._unredeemed.leave(conn)
            if entry is not None:
                self._send(conn, entry, peer)
        except OSError as exc:  # the puller went away, stalled, or reset the connection
            logger.info("side stream to %s broken: %s", peer, exc)
        finally:
            self._unredeemed.leave(conn)
            with self._lock:
                del self._active[conn]
            conn.close()

    def _admit(self, conn: socket.socket, peer: Any) -> Ticket | None:
        """The entry of the valid ticket ``conn`` presents in time, or None (logged)."""
        ticket = _recv_exactly(conn, TICKET_BYTES, self._ticket_wait())
        if len(ticket) < TICKET_BYTES:
            self._refusals.refused(f"no ticket within {self._ticket_wait():.1f}s "
                                   f"({len(ticket)} of {TICKET_BYTES} bytes), from {peer}")
            return None
        entry = self._tickets.redeem(ticket, time.monotonic())
        if isinstance(entry, str):
            self._refusals.refused(f"ticket {entry}, from {peer}")
            return None
        return entry

    def _send(self, conn: socket.socket, entry: Ticket, peer: Any) -> None:
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


# -- puller: the side stream -----------------------------------------------------------------------


class PullJob(NamedTuple):
    """What every step of one pull needs to know."""

    address: str
    token: str
    request: transfer_pb2.PullRequest
    timeout: float
    deadline: float  # time.monotonic()
    root_cert: bytes = b""  # the holder's TLS certificate (PEM); b"": plain gRPC

    def remaining(self) -> float:
        """Seconds left; raises ``TimeoutError`` when none are."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"pull took longer than {self.timeout}s")
        return left


Receiver = Callable[[socket.socket, int, int, PullJob], int]


def receive_stream(job: PullJob, ticket: transfer_pb2.StreamTicket, fd: int) -> int:
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


def _connect(job: PullJob, ticket: transfer_pb2.StreamTicket) -> socket.socket:
    """A connection to the holder's side port; raises ``RtmlSystemError`` if none can be made."""
    try:
        return socket.create_connection((_host_of(job.address), ticket.port),
                                        timeout=job.remaining())
    except OSError as exc:
        raise _stream_failed(job, ticket, exc) from None


def _host_of(address: str) -> str:
    """The host part of ``"host:port"`` or ``"[v6 host]:port"``."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


def _splice_into(conn: socket.socket, fd: int, total: int, job: PullJob) -> int:
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


def _splice_from(conn: socket.socket, pipe: int, count: int, job: PullJob) -> int:
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


def _wait_readable(conn: socket.socket, job: PullJob) -> None:
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    if not poller.poll(job.remaining() * 1000):
        raise TimeoutError(f"pull took longer than {job.timeout}s")


def _recv_into_mapping(conn: socket.socket, fd: int, total: int, job: PullJob) -> int:
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


def _expect_eof(conn: socket.socket, job: PullJob) -> None:
    """Wait for the holder to close (after its ``on_served``); raises ``RtmlSystemError`` if
    it sends more than the object."""
    conn.settimeout(job.remaining())
    if conn.recv(1):
        raise RtmlSystemError(
            f"node at {job.address} sent more than the {job.request.object_id.hex()} object's "
            "bytes on its side stream (protocol error); run the same rtml version on every "
            "node")


def _stream_failed(job: PullJob, ticket: transfer_pb2.StreamTicket,
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


def _stream_cut(job: PullJob, received: int, total: int) -> RtmlSystemError:
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
