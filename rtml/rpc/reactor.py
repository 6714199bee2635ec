"""A small selector reactor for the client runtime (drivers and workers).

    user thread ---- Connection.send() ----> socket      (direct write, no hop)
                                               |
    reactor thread <- epoll <- readable -------+ -> FrameDecoder -> handler(conn, msg)

The hot path must not pay for an event-loop hop per message, so any thread may
write a frame straight to the socket under the connection's lock; only the
bytes a full socket refuses are queued and flushed by the reactor when it
turns writable. Reading, timers and callbacks posted from other threads run
on the thread that leads the loop. Daemons use asyncio instead (see ``rpc.server``).

Leadership (leader/follower): a thread about to block on an answer
(:meth:`Reactor.wait_serving`, e.g. ``rtml.get``) leads the loop itself while it
waits, so the reply wakes the very thread that wants it: no second thread
wakes, no GIL hand-off. The background thread stands aside while a waiter
leads and for ``HANDBACK_GRACE`` after, so a loop of ``get`` calls never wakes
it; it takes the loop back at once when callbacks are posted, another thread
is left waiting, or replies are awaited to keep work flowing (``expecting``:
tasks queued for a worker, pushed as results come in, while the caller runs its
own code)::

    background: [lead: select/handle]--waiter arrives-->[aside]--grace, or work-->[lead]
    waiter:           wake bg, take the lead --> [select/handle until done] --> hand back

A waiter for one round trip (``get`` of one task's result) polls for ``SPIN`` before
its first sleep: the reply usually lands within it, and is read at once.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from rtml.exceptions import ProtocolError, RtmlSystemError
from rtml.rpc import messages as m
from rtml.rpc.client import connect_socket, handshake
from rtml.rpc.framing import FrameDecoder, frame

log = logging.getLogger(__name__)

Handler = Callable[["Connection", Any], None]
"""Called with each message; with a list of the messages of one read if ``batched``."""
CloseHandler = Callable[["Connection", str], None]
_RECV_SIZE = 1 << 18
_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
"""What a non-blocking send or recv raises when it would block (TLS: its own two)."""
_READ = select.EPOLLIN
_READ_WRITE = select.EPOLLIN | select.EPOLLOUT
HANDBACK_GRACE = 0.002
"""Seconds the background thread leaves the loop idle after a waiter hands it back,
so that the next ``get`` of a loop of them finds it free; posted callbacks and other
waiting threads end the grace at once."""
SPIN = 100e-6
"""Seconds a waiter that asks to spin polls the loop without blocking before it sleeps:
for a single result, due within tens of microseconds, waking from a sleep costs more
(the wake-up itself, and the caches the idle CPU lost) than polling until it lands."""


class Connection:
    """A framed, authenticated connection driven by a :class:`Reactor`."""

    def __init__(self, reactor: Reactor, sock: socket.socket, handler: Handler,
                 on_close: CloseHandler | None = None, name: str = "",
                 batched: bool = False) -> None:
        sock.setblocking(False)
        self.reactor = reactor
        self.sock = sock
        self.fd = sock.fileno()  # kept: unregistering must work after the socket is closed
        self.handler = handler
        self.on_close = on_close
        self.name = name
        self.batched = batched  # the handler takes the messages of a read as one list
        self.closed = False
        self.context: Any = None
        self._decoder = FrameDecoder()
        self._lock = threading.Lock()
        self._out = bytearray()

    def send(self, msg: m.Msg) -> None:
        """Encode and send ``msg`` from any thread; queues what the socket refuses."""
        self.send_raw(frame(m.encode(msg)))

    def enqueue(self, msg: m.Msg) -> None:
        """Queue ``msg`` without writing; the caller then calls :meth:`flush_now`.

        Lets a caller fix the order of frames under its own lock and do the
        syscall after releasing it.
        """
        data = frame(m.encode(msg))
        with self._lock:
            if not self.closed:
                self._out += data

    def flush_now(self) -> None:
        """Write queued frames from this thread; the reactor finishes what is refused."""
        if self.reactor.cork and self.reactor.in_reactor():
            self.reactor._dirty.add(self)
            return
        with self._lock:
            if self.closed or not self._out:
                return
            try:
                sent = self.sock.send(self._out)
            except _WOULD_BLOCK:
                sent = 0
            except OSError as exc:
                self.reactor.call_soon(self.close, f"send failed: {exc}")
                return
            del self._out[:sent]
            if self._out:
                self.reactor.call_soon(self.reactor._want_write, self)

    def drain_blocking(self, timeout: float) -> None:
        """Write what is queued, blocking up to ``timeout`` s: the process is about to
        exit, and the reactor will not finish it."""
        with self._lock:
            if self.closed or not self._out:
                return
            try:
                self.sock.settimeout(timeout)
                self.sock.sendall(self._out)
                self._out.clear()
            except OSError as exc:
                log.info("could not send the last %d bytes: %s", len(self._out), exc)

    def send_soon(self, msg: m.Msg) -> None:
        """Queue ``msg`` for the reactor to write with whatever else is queued.

        For bursts: many frames leave in one syscall instead of one each.
        """
        with self._lock:
            if self.closed:
                return
            pending = bool(self._out)
            self._out += frame(m.encode(msg))
        if not pending:
            self.reactor.flush_later(self)

    def send_raw(self, data: bytes) -> None:
        with self._lock:
            if self.closed:
                return
            if self._out:  # a flush is already arranged; keep frames in order
                self._out += data
                return
            if self.reactor.cork and self.reactor.in_reactor():
                self._out += data
                self.reactor._dirty.add(self)
                return
            try:
                sent = self.sock.send(data)
            except _WOULD_BLOCK:
                sent = 0
            except OSError as exc:
                self.reactor.call_soon(self.close, f"send failed: {exc}")
                return
            if sent < len(data):
                self._out += data[sent:]
                self.reactor.call_soon(self.reactor._want_write, self)

    def _flush(self) -> bool:
        """Write queued bytes; True when the queue is empty."""
        with self._lock:
            if not self._out:
                return True
            try:
                sent = self.sock.send(self._out)
            except _WOULD_BLOCK:
                return False
            except OSError:
                return True  # the read side sees the failure and closes
            del self._out[:sent]
            return not self._out

    def _on_readable(self) -> None:
        # Into the reactor's one reusable buffer: ``recv(256 KiB)`` would malloc (and,
        # above glibc's mmap threshold, mmap and unmap) a fresh 256 KiB per call,
        # which costs more than the rest of a small message's handling.
        view = self.reactor._recv_view
        try:
            size = self.sock.recv_into(view)
        except _WOULD_BLOCK:
            return
        except OSError as exc:
            self.close(f"recv failed: {exc}")
            return
        if not size:
            self.close("peer closed the connection")
            return
        try:
            frames = self._decoder.feed(view[:size])
        except ProtocolError as exc:
            self._refuse(exc)
            return
        if self.batched:  # the handler takes the read's messages at once
            msgs = []
            for payload in frames:
                try:
                    msgs.append(m.decode(payload))
                except (msgspec.DecodeError, ValueError) as exc:
                    self._handle(msgs)  # those before the bad frame
                    self._refuse(exc)
                    return
            self._handle(msgs)
            return
        for payload in frames:
            if self.closed:
                return
            try:
                msg = m.decode(payload)
            except (msgspec.DecodeError, ValueError) as exc:
                self._refuse(exc)
                return
            try:
                self.handler(self, msg)
            except Exception:  # a bug in one handler must not cost the connection
                log.exception("%s: handling %s failed", self.name, type(msg).__name__)

    def _handle(self, msgs: list[Any]) -> None:
        if msgs and not self.closed:
            try:
                self.handler(self, msgs)
            except Exception:  # a bug in the handler must not cost the connection
                log.exception("%s: handling %d messages failed", self.name, len(msgs))

    def _refuse(self, exc: Exception) -> None:
        log.warning("closing %s: bad frame: %s", self.name, exc)
        self.close(f"bad frame: {exc}")

    def detach(self) -> tuple[socket.socket, bytes]:
        """Stop using this connection; return its socket and any unread bytes.

        The socket stays open for another reactor to adopt.
        """
        with self._lock:
            self.closed = True
        self.reactor._forget(self)
        return self.sock, self._decoder.pending()

    def close(self, reason: str = "closed") -> None:
        """Close once, from the reactor thread, and tell ``on_close``."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self.reactor._forget(self)
        self.sock.close()
        if self.on_close is not None:
            self.on_close(self, reason)


class TlsConnection(Connection):
    """A connection over TLS (``rtml.rpc.tls``). A read takes one TLS record at most, and
    the rest of what arrived waits decrypted in the SSL object, where epoll does not see
    it: read on until it is empty."""

    def _on_readable(self) -> None:
        super()._on_readable()
        sock = self.sock
        if not self.closed and isinstance(sock, ssl.SSLSocket) and sock.pending():
            self.reactor.call_soon(self._on_readable)


def connection_for(reactor: Reactor, sock: socket.socket, handler: Handler,
                   on_close: CloseHandler | None = None, name: str = "",
                   batched: bool = False) -> Connection:
    """A Connection over ``sock``: a TlsConnection if it is a TLS socket."""
    kind = TlsConnection if isinstance(sock, ssl.SSLSocket) else Connection
    return kind(reactor, sock, handler, on_close, name, batched)


class Flag:
    """A one-shot event for a single waiting thread: ``threading.Event`` without its
    Condition (whose construction alone costs more than the rest of a ``get``'s wait).

    Any thread may :meth:`set` it, any number of times; one thread waits.
    """

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self, _: object = None) -> None:
        """Set it (the argument is ignored: a callback's, e.g. an object id)."""
        if self._set:
            return
        self._set = True
        try:
            self._lock.release()
        except RuntimeError:  # a racing set() released it first
            pass

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        if not self._set:
            self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
        return self._set


class _Listener:
    """A listening socket whose accepted connections must authenticate first."""

    def __init__(self, sock: socket.socket, accept: Callable[[socket.socket], None]) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.accept = accept


class Reactor:
    """Runs epoll I/O, timers and posted callbacks on one thread."""

    def __init__(self, name: str = "rtml-reactor", cork: bool = False) -> None:
        self.name = name
        self.cork = cork  # batch the reactor thread's own sends until the end of an iteration
        self._recv_view = memoryview(bytearray(_RECV_SIZE))  # only the reactor thread reads
        self._dirty: set[Connection] = set()
        # epoll itself, not ``selectors``: its Python wrapper costs ~2.5 us per wait
        self._epoll = select.epoll()
        self._watched: dict[int, Connection | _Listener | None] = {}  # fd -> what it is
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._watch(self._wake_r.fileno(), _READ, None)
        self._calls: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._idle: deque[Callable[[], Any]] = deque()  # run first in the next iteration
        self._timers: list[tuple[float, int, Callable[[], Any]]] = []
        self._seq = itertools.count()
        self._running = False
        self._bg_thread: threading.Thread | None = None
        self.thread_id: int | None = None  # the thread leading the loop now, if any
        self._lead = threading.Lock()  # held by whichever thread runs the loop
        # Entered as the bare lock (a C call) where no wait or notify follows the check.
        self._aside_lock = threading.RLock()  # re-entered by a __del__ that posts a call
        self._aside = threading.Condition(self._aside_lock)  # guards the four fields below
        self._borrower: int | None = None  # a waiting thread that leads, or is about to
        self._followers = 0  # threads blocked in wait_serving without the lead
        self._handed_back = 0.0
        self._aside_until_told = False  # the background thread waits for the hand-back
        self._resume = False  # the last hand-back skips the grace
        self._interrupt: BaseException | None = None  # raised in the leader after hand-back
        self.expecting: Callable[[], bool] = _never  # replies due: no grace after a hand-back

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Run the loop on a daemon thread."""
        self._bg_thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._bg_thread.start()

    def run(self) -> None:
        """Run the loop on the calling thread until :meth:`stop`, standing aside while
        a waiting thread leads it."""
        self._running = True
        me = threading.get_ident()
        try:
            while self._running:
                with self._lead:
                    self.thread_id = me
                    try:
                        while self._running and self._borrower is None:
                            self._run_guarded(None)
                    finally:
                        self.thread_id = None
                self._stand_aside()
        finally:
            self._running = False

    def _run_guarded(self, max_wait: float | None, spin_until: float = 0.0) -> None:
        try:
            self._run_once(max_wait, spin_until)
        except Exception:  # the loop must outlive any one bad event
            log.exception("%s: reactor iteration failed", self.name)

    def _stand_aside(self) -> None:
        """Wait while a waiter leads, then through the grace, unless work arrives."""
        with self._aside:
            while self._running:
                if self._borrower is not None:
                    self._aside_until_told = True
                    self._aside.wait()
                    self._aside_until_told = False
                    continue
                if self._resume or self._followers or self._calls:
                    self._resume = False
                    return
                left = self._handed_back + HANDBACK_GRACE - time.monotonic()
                if left <= 0:
                    return
                self._aside.wait(left)

    def wait_serving(self, done: threading.Event | Flag, timeout: float | None,
                     spin: bool = False) -> bool:
        """Block until ``done`` is set or ``timeout`` passes, leading the loop meanwhile
        if no other waiter does. True if ``done`` was set.

        ``spin``: the answer is due soon (one round trip): as leader, poll without
        sleeping for the first ``SPIN`` seconds of the wait (a pass that only runs posted
        callbacks does not use it up).

        An exception meant for this thread while it leads (a signal handler's: Ctrl-C,
        a task's cancellation) is handed to :meth:`interrupt_leader` instead of being
        raised inside a message handler, and raised here once the loop is handed back.
        """
        if done.is_set():
            return True
        if timeout is not None and timeout <= 0:
            return False  # a poll: never take the loop (it would renew the grace)
        me = threading.get_ident()
        with self._aside_lock:
            lead = (self._borrower is None and self._running and self._bg_thread is not None
                    and self.thread_id != me)
            if lead:
                self._borrower = me
            else:
                self._followers += 1
        if not lead:
            try:
                return done.wait(timeout)
            finally:
                with self._aside_lock:
                    self._followers -= 1
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            if self.thread_id is not None:
                self._wake()  # the background thread is in select: make it stand aside
            if not self._lead.acquire(timeout=-1 if timeout is None else timeout):
                return done.is_set()
            try:
                self.thread_id = me
                spin_until = time.perf_counter() + SPIN if spin else 0.0
                while not done.is_set() and self._running and self._interrupt is None:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._run_guarded(left, spin_until)
            finally:
                self.thread_id = None
                self._lead.release()
        finally:
            with self._aside_lock:
                self._borrower = None
                self._handed_back = time.monotonic()
                self._resume = (bool(self._followers or self._calls) or not self._running
                                or self._expected())
                if self._resume or self._aside_until_told:
                    self._aside.notify_all()
        interrupt, self._interrupt = self._interrupt, None
        if interrupt is not None:
            raise interrupt
        if done.is_set() or self._running:
            return done.is_set()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return done.wait(left)  # stopped under us: whoever stops it may still set done

    def _expected(self) -> bool:
        try:
            return self.expecting()
        except Exception:  # a broken hook must not keep the loop idle: take it back
            log.exception("%s: expecting() failed", self.name)
            return True

    def leads_here(self) -> bool:
        """This thread is inside :meth:`wait_serving` as the loop's leader (or about to
        be): an exception must not be raised into it (see :meth:`interrupt_leader`)."""
        return self._borrower == threading.get_ident()

    def interrupt_leader(self, exc: BaseException) -> None:
        """Have the leading waiter (this thread, in a signal handler) raise ``exc`` once it
        has handed the loop back, instead of inside whatever handler it is running."""
        self._interrupt = exc
        self._wake()

    def stop(self) -> None:
        self._running = False
        self._wake()
        with self._aside:
            self._aside.notify_all()
        if self._bg_thread is not None and self._bg_thread is not threading.current_thread():
            self._bg_thread.join(timeout=5)

    def close(self) -> None:
        """Close every connection and the epoll object; call after :meth:`stop`."""
        for watched in list(self._watched.values()):
            if isinstance(watched, Connection):
                watched.on_close = None
                watched.close("reactor closed")
        self._epoll.close()
        self._wake_r.close()
        self._wake_w.close()

    def in_reactor(self) -> bool:
        return threading.get_ident() == self.thread_id

    # -- scheduling --------------------------------------------------------------------------

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the thread leading the loop (thread-safe)."""
        self._calls.append((fn, args))
        leader = self.thread_id
        if leader is None:  # between leaders: end the background thread's grace
            with self._aside:
                self._aside.notify_all()
        elif leader != threading.get_ident():
            self._wake()

    def call_idle(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` at the start of the loop's next iteration, before it waits for I/O:
        for work that need not delay what this iteration wakes (a waiter woken by it has
        returned by then, so the work overlaps the peer's, e.g. a get's bookkeeping with
        the next task's run). From the leading thread only."""
        self._idle.append(fn)

    def call_later(self, delay: float, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` on the reactor thread after ``delay`` seconds."""
        self.call_soon(self._add_timer, time.monotonic() + delay, fn)

    def _add_timer(self, when: float, fn: Callable[[], Any]) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), fn))

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass

    # -- connections -------------------------------------------------------------------------

    def add(self, conn: Connection) -> Connection:
        """Start reading ``conn`` (thread-safe)."""
        self.call_soon(self._register, conn)
        return conn

    def listen(self, sock: socket.socket, accept: Callable[[socket.socket], None]) -> None:
        """Call ``accept(sock)`` on the reactor thread for each accepted socket."""
        sock.setblocking(False)
        listener = _Listener(sock, accept)
        self.call_soon(self._watch, listener.fd, _READ, listener)

    def _accept(self, listener: _Listener) -> None:
        try:
            sock, _ = listener.sock.accept()
        except (BlockingIOError, OSError):
            return
        listener.accept(sock)

    def flush_later(self, conn: Connection) -> None:
        """Write ``conn``'s queued bytes at the end of the reactor's current iteration."""
        if self.in_reactor():
            self._dirty.add(conn)
        else:
            self.call_soon(self._mark_dirty, conn)

    def _mark_dirty(self, conn: Connection) -> None:
        # Not ``call_soon(self._dirty.add, ...)``: that binds the set of the moment, and
        # the set is swapped at each flush; a late add to an old set loses the flush, and
        # the connection's later frames wait forever behind the unflushed ones.
        self._dirty.add(conn)

    def _flush_dirty(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for conn in dirty:
            if not conn.closed and not conn._flush():
                self._want_write(conn)

    def _watch(self, fd: int, events: int, what: Connection | _Listener | None) -> None:
        self._epoll.register(fd, events)
        self._watched[fd] = what

    def _register(self, conn: Connection) -> None:
        if not conn.closed and conn.fd not in self._watched:  # else registered by _interest
            self._watch(conn.fd, _READ, conn)

    def _want_write(self, conn: Connection) -> None:
        if not conn.closed:
            self._interest(conn, _READ_WRITE)

    def _interest(self, conn: Connection, events: int) -> None:
        """Set what epoll watches ``conn`` for (registering it if still pending)."""
        if self._watched.get(conn.fd) is conn:
            self._epoll.modify(conn.fd, events)
        else:
            self._watch(conn.fd, events, conn)

    def _forget(self, conn: Connection) -> None:
        if self._watched.get(conn.fd) is conn:
            del self._watched[conn.fd]
            try:
                self._epoll.unregister(conn.fd)
            except OSError:  # closed already: epoll dropped it itself
                pass

    # -- the loop ----------------------------------------------------------------------------

    def _run_once(self, max_wait: float | None = None, spin_until: float = 0.0) -> None:
        if self._idle:  # first thing in every iteration: a busy loop must not starve it
            self._run_idle()
        timeout = max_wait
        if self._calls:
            timeout = 0
        elif self._timers:
            due = max(0.0, self._timers[0][0] - time.monotonic())
            timeout = due if timeout is None else min(timeout, due)
        watched = self._watched
        ready = (self._poll(timeout, spin_until) if spin_until
                 else self._epoll.poll(timeout))
        for fd, events in ready:
            conn = watched.get(fd)
            if conn is None:
                if fd == self._wake_r.fileno():
                    self._drain_wake()
                continue  # forgotten by a handler earlier in this batch
            if isinstance(conn, _Listener):
                self._guard(self._accept, conn)
                continue
            # Hang-up and error count as both, so that the failing call reports them.
            if events & ~select.EPOLLIN and conn._flush() and not conn.closed:
                self._interest(conn, _READ)
            if events & ~select.EPOLLOUT and not conn.closed:
                self._guard(conn._on_readable)
        if self._calls:
            self._run_calls()
        timers = self._timers
        if timers and timers[0][0] <= time.monotonic():
            self._run_timers(time.monotonic())
        if self._dirty:
            self._flush_dirty()

    def _poll(self, timeout: float | None, spin_until: float) -> list[tuple[int, int]]:
        """epoll's events, waiting at most ``timeout``: polling, not sleeping, until
        ``spin_until`` (a ``perf_counter`` time), then asleep for what is left."""
        poll = self._epoll.poll
        clock = time.perf_counter
        start = clock()
        if timeout == 0 or start >= spin_until:
            return poll(timeout)
        ready = poll(0)
        while not ready and clock() < spin_until:
            ready = poll(0)
        if ready:
            return ready
        if timeout is not None:
            timeout = max(0.0, timeout - (clock() - start))
        return poll(timeout)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError) as exc:
            if getattr(exc, "errno", None) not in (None, errno.EAGAIN):
                raise

    def _run_calls(self) -> None:
        calls = self._calls
        for _ in range(len(calls)):
            fn, args = calls.popleft()
            self._guard(fn, *args)

    def _run_idle(self) -> None:
        idle = self._idle
        for _ in range(len(idle)):
            self._guard(idle.popleft())

    def _run_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, fn = heapq.heappop(self._timers)
            self._guard(fn)

    def _guard(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("%s: callback %r failed", self.name, fn)


def _never() -> bool:
    return False


def open_connection(reactor: Reactor, address: str, token: str, hello: m.Hello,
                    handler: Handler, on_close: CloseHandler | None = None,
                    timeout: float = 10.0, batched: bool = False
                    ) -> tuple[Connection, m.HelloReply]:
    """Connect, authenticate and register a connection. Raises RtmlSystemError."""
    try:
        sock = connect_socket(address, timeout)
    except OSError as exc:
        raise RtmlSystemError(f"cannot connect to {address}: {exc}") from exc
    try:
        sock, reply = handshake(sock, token, hello)
    except (OSError, ProtocolError) as exc:
        sock.close()
        raise RtmlSystemError(f"handshake with {address} failed: {exc}") from exc
    conn = connection_for(reactor, sock, handler, on_close, name=address, batched=batched)
    reactor.add(conn)
    return conn, reply
