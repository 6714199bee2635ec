"""One process's links to its cluster: who it is, its connections, its requests.

    ClientLinks(config)       identity (client, job, role), the lock the runtime's parts
                              share, the I/O reactor
      .open(handlers)  --->   node manager (Unix socket) + head service (HeadLink): the
                              node's id and store directory come back in the replies
      .start()                the reactor reads from now on (the runtime's parts built)
      request / ask    --->   a message with a fresh req_id; its reply is routed back by
                              deliver_reply (the runtime's message handlers call it)
      send_ordered     --->   queued under the lock, written by flush_sends after it
      connect_worker / node_manager_at: authenticated connections made on demand
      block            --->   waits serving the reactor; a worker lends its CPU meanwhile

The parts of the client runtime (submitter, owner, reference counter, actor callers)
are each given these links and what else they use, never the runtime: the links know
nothing of tasks or objects.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rtml import objectstore
from rtml.config import default_head_timeout
from rtml.core.head_link import HeadLink
from rtml.exceptions import GetTimeoutError, RtmlSystemError
from rtml.ids import NO_NODE, UNKNOWN_JOB, ClientID, JobID, NodeID, ObjectID, new_client_id
from rtml.rpc import messages as m
from rtml.rpc.client import make_hello
from rtml.rpc.reactor import CloseHandler, Connection, Flag, Handler, Reactor, open_connection

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientConfig:
    """How a driver or worker reaches its cluster."""

    role: str  # "driver" | "worker"
    token: str
    nm_address: str
    head_address: str
    session_dir: str
    job_id: JobID = UNKNOWN_JOB
    client_id: ClientID = field(default_factory=new_client_id)
    namespace: str = ""
    sys_paths: tuple[str, ...] = ()
    log_to_driver: bool = True
    head_timeout: float = field(default_factory=default_head_timeout)


@dataclass(frozen=True)
class Handlers:
    """What the runtime does with what its daemons send unasked (reactor thread)."""

    nm_message: Callable[[Connection, Any, NodeID], None]  # (conn, msg, node id; NO_NODE: ours)
    nm_closed: Callable[[Connection, str], None]
    remote_nm_closed: Callable[[NodeID], None]  # another node's manager, by node id
    head_message: Handler
    head_back: Callable[[], list[m.Msg]]  # sent first to a head that took over
    head_gone: Callable[[RtmlSystemError, list[int]], None]


class ClientLinks:
    """Identity, connections and the request/reply table of one driver or worker."""

    nm: Connection
    head: HeadLink
    node_id: NodeID
    store_dir: str
    node_ip: str

    def __init__(self, config: ClientConfig) -> None:
        """Identity and the reactor; nothing is connected before :meth:`open`, nothing read
        before :meth:`start`."""
        self.config = config
        self.role = config.role
        self.token = config.token
        self.client_id = config.client_id
        self.job_id = config.job_id
        self.session_dir = config.session_dir
        self.sys_paths = list(config.sys_paths)
        self.lock = threading.RLock()
        """Taken by every part of the runtime around its own state: one order, no nesting
        of other locks inside it except leaf locks."""
        self.reactor = Reactor(f"rtml-{config.role}-io", cork=True)
        self.remote_nms: dict[NodeID, Connection] = {}
        self.dead_nodes: set[NodeID] = set()  # told by our node manager
        self.closed = False
        self._req_ids = itertools.count(1)
        self._replies: dict[int, Callable[[Any], None]] = {}
        self._unflushed: list[Connection] = []
        self._lends_cpu = config.role == "worker"
        self._blocked = 0  # a worker's tasks waiting in get/wait: its CPU is lent back
        self._blocked_lock = threading.Lock()
        self._handlers: Handlers | None = None

    def open(self, handlers: Handlers) -> None:
        """Connect to the node manager and the head service. Raises RtmlSystemError if
        either cannot be reached or refuses us (the reactor is stopped then)."""
        self._handlers = handlers
        config = self.config
        nm: Connection | None = None
        try:
            hello = make_hello(self.role, self.client_id, self.job_id, self.sys_paths)
            nm, reply = open_connection(
                self.reactor, config.nm_address, self.token, hello,
                lambda conn, msg: handlers.nm_message(conn, msg, NO_NODE), handlers.nm_closed)
            self.nm = nm
            self.node_id = reply.node_id
            self.store_dir = objectstore.check_store_dir(reply.info["store_dir"])
            self.node_ip = reply.info["node_ip"]
            hello.node_id = self.node_id
            self.head = HeadLink(self.reactor, config.head_address, self.token, hello,
                                 handlers.head_message, config.head_timeout,
                                 handlers.head_back, handlers.head_gone)
        except BaseException:
            if nm is not None:
                _drop(nm)
            self.reactor.stop()
            self.reactor.close()
            raise

    def abort(self) -> None:
        """Undo a successful :meth:`open` before :meth:`start`: its connections are
        closed (the reactor, not started, does not know them yet), the reactor stopped."""
        self.head.close()
        _drop(self.nm)
        self.reactor.stop()
        self.reactor.close()

    def start(self) -> None:
        """Start reading: what the daemons send is handled from now on (so the parts that
        handle it are built before)."""
        self.reactor.start()

    def close(self) -> None:
        """Drop every connection and stop the reactor."""
        self.closed = True
        for conn in self.remote_nms.values():
            conn.on_close = None
            conn.close("shutdown")
        self.head.close()
        self.reactor.stop()
        self.reactor.close()

    # -- sending -------------------------------------------------------------------------------

    def send_ordered(self, conn: Connection, msg: m.Msg) -> None:
        """Queue ``msg`` under ``self.lock`` (fixing its order); written by flush_sends().

        The syscall happens after the lock is released, so the I/O thread handling
        a fast reply never waits for a sender still inside ``send``.
        """
        if self.reactor.in_reactor():
            conn.send(msg)  # corked: written at the end of the reactor iteration
            return
        conn.enqueue(msg)
        unflushed = self._unflushed
        try:  # a batch of frames for one connection: one flush (still due: not popped yet)
            due = unflushed[-1] is conn
        except IndexError:  # empty (or emptied meanwhile by a flush_sends elsewhere)
            due = False
        if not due:
            unflushed.append(conn)

    def flush_sends(self) -> None:
        """Write what :meth:`send_ordered` queued; call without holding ``self.lock``."""
        unflushed = self._unflushed
        while unflushed:
            try:
                conn = unflushed.pop()
            except IndexError:
                return
            conn.flush_now()

    # -- connections made on demand ------------------------------------------------------------

    def connect_worker(self, address: str, handler: Handler,
                       on_close: CloseHandler) -> Connection:
        """An authenticated connection to a worker, as an owner of this job; ``handler``
        gets the results of each read as one list."""
        hello = make_hello("driver", self.client_id, self.job_id, self.sys_paths, self.node_id)
        conn, _ = open_connection(self.reactor, address, self.token, hello, handler, on_close,
                                  batched=True)
        return conn

    def node_manager_at(self, node_id: NodeID, address: str) -> Connection:
        """A connection to another node's manager (for spilled leases), made on first use."""
        conn = self.remote_nms.get(node_id)
        if conn is None or conn.closed:
            assert self._handlers is not None, "node_manager_at before open()"
            handlers = self._handlers
            hello = make_hello(self.role, self.client_id, self.job_id, self.sys_paths,
                               self.node_id)
            conn, _ = open_connection(
                self.reactor, address, self.token, hello,
                lambda c, msg: handlers.nm_message(c, msg, node_id),
                lambda c, reason: self._remote_nm_closed(node_id, c))
            self.remote_nms[node_id] = conn
        return conn

    def _remote_nm_closed(self, node_id: NodeID, conn: Connection) -> None:
        if not self.closed and self.remote_nms.get(node_id) is conn:
            del self.remote_nms[node_id]
            assert self._handlers is not None
            self._handlers.remote_nm_closed(node_id)  # its requests will never be answered

    def node_died(self, node_id: NodeID) -> None:
        """Our node manager says ``node_id`` died: its connection goes, and it is known
        dead (objects there are lost)."""
        conn = self.remote_nms.pop(node_id, None)
        if conn is not None:
            conn.on_close = None
            conn.close("its node died")
        self.dead_nodes.add(node_id)

    def nm_gone(self) -> RtmlSystemError:
        """The error of a call that needs this process's node manager, which is gone."""
        return RtmlSystemError(f"the node manager at {self.config.nm_address} is gone; "
                               f"call rtml.shutdown() and rtml.init() again")

    # -- requests and replies ------------------------------------------------------------------

    def next_request_id(self) -> int:
        return next(self._req_ids)

    def request(self, conn: Connection | HeadLink, make: Callable[[int], m.Msg],
                timeout: float | None = 30.0) -> Any:
        """Send a request built with a fresh req_id and block for its reply. Raises
        GetTimeoutError (RtmlSystemError from the head), or the error the request failed
        with (RtmlSystemError)."""
        if isinstance(conn, Connection) and conn.closed:
            raise self.nm_gone() if conn is self.nm else RtmlSystemError(
                f"the connection to {conn.name} is closed")
        answer = Answer()
        req_id = self.ask(conn, make, answer)
        if not self.reactor.wait_serving(answer.done, timeout):
            self._replies.pop(req_id, None)
            if isinstance(conn, HeadLink):
                conn.settled(req_id)
                raise RtmlSystemError(
                    f"the head service at {conn.name} did not answer within {timeout:g} s: "
                    f"it is hung or overloaded (one that died would have been started "
                    f"again); see logs/head.log in the head node's session directory")
            raise GetTimeoutError(f"no reply from {conn.name} within {timeout} s")
        if isinstance(answer.msg, RtmlSystemError):
            raise answer.msg
        return answer.msg

    def ask(self, conn: Connection | HeadLink, make: Callable[[int], m.Msg],
            on_reply: Callable[[Any], None]) -> int:
        """Send a request built with a fresh req_id without waiting: ``on_reply`` gets its
        answer on the I/O thread. Returns the req_id, for :meth:`forget_reply`."""
        req_id = self.next_request_id()
        self._replies[req_id] = on_reply
        conn.send(make(req_id))
        return req_id

    def forget_reply(self, req_id: int) -> None:
        self._replies.pop(req_id, None)

    def deliver_reply(self, req_id: int, msg: Any) -> None:
        callback = self._replies.pop(req_id, None)
        if callback is not None:
            callback(msg)

    def fail_replies(self, error: RtmlSystemError) -> None:
        """Nothing waited for will be answered now: every waiting request gets ``error``."""
        for req_id in list(self._replies):
            self.deliver_reply(req_id, error)

    # -- waiting -------------------------------------------------------------------------------

    def block(self, done: Flag, deadline: float | None, ids: list[ObjectID],
              spin: bool = False) -> None:
        """Wait for ``done`` (objects ``ids``, named in the timeout's error); ``spin``: one
        task's result, due soon (see Reactor.SPIN). Raises GetTimeoutError."""
        if done.is_set():
            return
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self.wait_lending(done, timeout, spin):
            raise GetTimeoutError(
                f"get timed out after waiting for {len(ids)} object(s), e.g. "
                f"{ids[0].hex()}; the task may still be running")

    def wait_lending(self, done: Flag, timeout: float | None, spin: bool = False) -> bool:
        """Wait for ``done`` up to ``timeout`` s, lending a worker's CPU meanwhile; False
        if it timed out."""
        lend = self._lends_cpu
        if lend:
            self.lend_cpu(True)
        try:
            return self.reactor.wait_serving(done, timeout, spin)
        finally:
            if lend:
                self.lend_cpu(False)

    def lend_cpu(self, blocked: bool) -> None:
        """A worker's task starts (or stops) waiting in get/wait: the node manager lends
        its CPU to other work meanwhile. Told once for any number of waits at a time."""
        with self._blocked_lock:
            self._blocked += 1 if blocked else -1
            if self._blocked == (1 if blocked else 0):
                self.nm.send(m.WorkerBlocked() if blocked else m.WorkerUnblocked())


class Answer:
    """The reply to one request (``ask``'s ``on_reply``): kept, and ``done`` set."""

    def __init__(self) -> None:
        self.done = Flag()
        self.msg: Any = None

    def __call__(self, msg: Any) -> None:
        self.msg = msg
        self.done.set()


def _drop(conn: Connection) -> None:
    conn.on_close = None
    conn.close("the runtime could not be built")
