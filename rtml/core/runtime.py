"""The client runtime inside every driver and worker process.

    user thread                         reactor thread
    -----------                         --------------
    f.remote() -> owner.submit -> submitter.enqueue --> PushTask straight to the leased worker
    get(ref) -> wait on an Event    <-- TaskResult -> owner.complete_tasks -> memory store
                                                      -> Event.set()
    put(big) -> shm segment + SealObject --> node manager
    ObjectRef.__del__ -> refops deque --> refs.process_refops -> Release* to node manager

It owns the objects this process creates: small ones in its memory store,
large ones (and any that escape into another process) in the node's
shared-memory store, held there until no reference remains. The runtime keeps
the connections and the objects; it owns three helpers that hold a
back-reference to it:

- ``submitter`` (:mod:`rtml.core.submitter`): leases workers and pushes tasks;
- ``owner`` (:mod:`rtml.core.owner`): a submitted task's life, from its
  arguments to its results or its error;
- ``refs`` (:mod:`rtml.core.references`): reference counts and holds, the
  counter every ``ObjectRef`` reports to.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import itertools
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rtml import objectstore
from rtml.config import INLINE_MAX, STORE_FULL_TIMEOUT, default_head_timeout
from rtml.control_plane import BatchedWriter, ControlPlane, RedisAddress, unreachable
from rtml.core import context, object_ref
from rtml.core.head_link import HeadLink
from rtml.core.memory_store import IN_STORE, Entry, MemoryStore, StoredError
from rtml.core.object_ref import ObjectRef
from rtml.core.owner import TaskOwner
from rtml.core.progress import Bars
from rtml.core.references import ReferenceCounter
from rtml.core.serialization import Serialized, deserialize, from_payload, serialize
from rtml.core.submitter import TaskSubmitter
from rtml.exceptions import (
    GetTimeoutError,
    ObjectLostError,
    ObjectStoreFullError,
    OutOfDiskError,
    OwnerDiedError,
    RtmlError,
    RtmlSystemError,
    TaskError,
)
from rtml.ids import new_task_id, object_id_for, random_id
from rtml.rpc import messages as m
from rtml.rpc.client import make_hello
from rtml.rpc.reactor import (
    CloseHandler,
    Connection,
    Flag,
    Handler,
    Reactor,
    open_connection,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientConfig:
    """How a driver or worker reaches its cluster."""

    role: str  # "driver" | "worker"
    token: str
    nm_address: str
    head_address: str
    session_dir: str
    job_id: bytes = b""
    client_id: bytes = field(default_factory=lambda: random_id())
    namespace: str = ""
    sys_paths: tuple[str, ...] = ()
    log_to_driver: bool = True
    head_timeout: float = field(default_factory=default_head_timeout)


class ClientRuntime:
    """Connections, owned objects, reference counts and task submission of one process."""

    def __init__(self, config: ClientConfig,
                 on_worker_message: Callable[[Any], None] | None = None) -> None:
        """Connect to the node manager and the head service: the runtime is whole once
        built. ``on_worker_message``: a worker's handler of what its node manager asks of
        it (cancel a running task, become an actor). Raises RtmlSystemError if either
        daemon cannot be reached or refuses us (nothing is left running then)."""
        self.config = config
        self.role = config.role
        self.token = config.token
        self.client_id = config.client_id
        self.job_id = config.job_id
        self.session_dir = config.session_dir
        self.sys_paths = list(config.sys_paths)
        self.runtime_env = ""  # the env its calls inherit: its job's, or a worker's own
        self.lock = threading.RLock()
        self.store = MemoryStore()
        self.submitter = TaskSubmitter(self)
        self.owner = TaskOwner(self)
        self.refs = ReferenceCounter(self)
        self.reactor = Reactor(f"rtml-{config.role}-io", cork=True)
        self.reactor.expecting = self.submitter.has_queued
        self._req_ids = itertools.count(1)
        self._replies: dict[int, Callable[[Any], None]] = {}
        self.exported: dict[bytes, bytes] = {}  # function id -> blob, for workers that ask
        self.functions: dict[bytes, Any] = {}
        self.on_worker_message = on_worker_message
        self._lends_cpu = config.role == "worker"
        self._blocked = 0  # a worker's tasks waiting in get/wait: its CPU is lent back
        self._blocked_lock = threading.Lock()
        self.current_task_name = "driver"
        self.closed = False
        self.remote_nms: dict[bytes, Connection] = {}
        self.dead_nodes: set[bytes] = set()  # told by our node manager
        self._store_room = 0  # the node's free store bytes, as its last CreateObject answer said
        self._warned_shapes: set[tuple[tuple[str, float], ...]] = set()
        self._unflushed: list[Connection] = []
        self.bars = Bars()  # remote tasks' progress bars (tqdm_ray), drawn here
        self.job_lifetimes: dict[bytes, str] = {}  # jobs' default actor lifetimes, as known
        self.reactor.start()
        try:
            hello = make_hello(self.role, self.client_id, self.job_id, self.sys_paths)
            self.nm, reply = open_connection(self.reactor, config.nm_address, self.token,
                                             hello, self._on_nm_message, self._on_nm_closed)
            self.node_id: bytes = reply.node_id
            self.store_dir = objectstore.check_store_dir(reply.info["store_dir"])
            self.node_ip: str = reply.info["node_ip"]
            hello.node_id = self.node_id
            self.head = HeadLink(self.reactor, config.head_address, self.token, hello,
                                 self._on_head_message, config.head_timeout,
                                 self._created_actors, self._head_gone)
            info = self.head.reply.info
            self.plane = ControlPlane.at(RedisAddress.from_info(info), self.token)
        except BaseException:
            self.reactor.stop()
            self.reactor.close()
            raise
        self.writer = BatchedWriter(self.plane)
        object_ref.set_counter(self.refs)

    # -- lifecycle ---------------------------------------------------------------------------

    def flush_output(self, timeout: float) -> None:
        """Wait (up to ``timeout`` s) until what workers printed so far for this job has
        been printed here: a driver's last step before it leaves. A head that does not
        answer in time is given up on (the prints still on their way are lost)."""
        try:
            self.request(self.head, lambda req_id: m.FlushOutput(req_id), timeout)
        except (GetTimeoutError, OSError, RtmlSystemError) as exc:
            log.info("workers' last prints may be lost: %s", exc)

    def close(self) -> None:
        """Drop connections; owned objects die with the connection to the node manager."""
        if self.closed:
            return
        self.closed = True
        self.owner.settle()  # the outcome records of the last results
        object_ref.set_counter(None)
        for caller in self.owner.callers():
            caller.shutdown()
        self.submitter.shutdown()
        for conn in self.remote_nms.values():
            conn.on_close = None
            conn.close("shutdown")
        self.head.close()
        self.writer.close()
        self.plane.close()
        self.reactor.stop()
        self.reactor.close()

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

    def connect_worker(self, address: str, handler: Handler,
                       on_close: CloseHandler) -> Connection:
        """An authenticated connection to a worker, as an owner of this job; ``handler``
        gets the results of each read as one list."""
        hello = make_hello("driver", self.client_id, self.job_id, self.sys_paths, self.node_id)
        conn, _ = open_connection(self.reactor, address, self.token, hello, handler, on_close,
                                  batched=True)
        return conn

    def node_manager_at(self, node_id: bytes, address: str) -> Connection:
        """A connection to another node's manager (for spilled leases), made on first use."""
        conn = self.remote_nms.get(node_id)
        if conn is None or conn.closed:
            hello = make_hello(self.role, self.client_id, self.job_id, self.sys_paths,
                               self.node_id)
            conn, _ = open_connection(
                self.reactor, address, self.token, hello,
                lambda c, msg: self._on_nm_message(c, msg, node_id),
                lambda c, reason: self._on_remote_nm_closed(node_id, c))
            self.remote_nms[node_id] = conn
        return conn

    def _on_remote_nm_closed(self, node_id: bytes, conn: Connection) -> None:
        if not self.closed and self.remote_nms.get(node_id) is conn:
            del self.remote_nms[node_id]
            self.submitter.node_died(node_id)  # requests sent on it will never be answered

    def nm_gone(self) -> RtmlSystemError:
        """The error of a call that needs this process's node manager, which is gone."""
        return RtmlSystemError(f"the node manager at {self.config.nm_address} is gone; "
                               f"call rtml.shutdown() and rtml.init() again")

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
        done = Flag()
        box: list[Any] = []
        req_id = self.next_request_id()

        def reply(msg: Any) -> None:
            box.append(msg)
            done.set()

        self._replies[req_id] = reply
        conn.send(make(req_id))
        if not self.reactor.wait_serving(done, timeout):
            self._replies.pop(req_id, None)
            if isinstance(conn, HeadLink):
                conn.settled(req_id)
                raise RtmlSystemError(
                    f"the head service at {conn.name} did not answer within {timeout:g} s: "
                    f"it is hung or overloaded (one that died would have been started "
                    f"again); see logs/head.log in the head node's session directory")
            raise GetTimeoutError(f"no reply from {conn.name} within {timeout} s")
        if isinstance(box[0], RtmlSystemError):
            raise box[0]
        return box[0]

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

    def _deliver_reply(self, req_id: int, msg: Any) -> None:
        callback = self._replies.pop(req_id, None)
        if callback is not None:
            callback(msg)

    # -- node manager and head messages (reactor thread) -------------------------------------

    def _on_nm_message(self, conn: Connection, msg: Any, node_id: bytes = b"") -> None:
        if isinstance(msg, m.LeaseGranted):
            self.submitter.on_lease_granted(msg, conn, node_id or self.node_id)
        elif isinstance(msg, m.LeaseSpillback):
            self.submitter.on_spillback(msg)
        elif isinstance(msg, m.NodeDied):
            if conn is self.nm:  # (other nodes' managers tell us too: only ours knows
                self._node_died(msg.node_id, msg.reason, msg.kept)  # which copies it kept)
        elif isinstance(msg, (m.ObjectAvailable, m.ObjectCreated, m.StoreStatsReply,
                              m.HoldsFenced)):
            self._deliver_reply(msg.req_id, msg)
        elif isinstance(msg, m.LeaseFailed):
            self.submitter.on_lease_failed(msg)
        elif isinstance(msg, m.LeaseInfeasible):
            self._warn_infeasible(msg.shape)
        elif self.on_worker_message is not None:
            self.on_worker_message(msg)

    def _node_died(self, node_id: bytes, reason: str, kept: Sequence[bytes] = ()) -> None:
        """Tasks and actor calls running there are retried or fail; objects whose primary
        was there live on where our node manager kept a copy (``kept``), else our own are
        rebuilt from their lineage."""
        conn = self.remote_nms.pop(node_id, None)
        if conn is not None:
            conn.on_close = None
            conn.close("its node died")
        self.dead_nodes.add(node_id)
        locations, entries = self.refs.locations, self.store.entries
        for object_id in kept:
            if locations.get(object_id) == node_id:
                del locations[object_id]  # its primary is the copy on our node now
        lost = [object_id for object_id, where in list(locations.items())
                if where == node_id and entries.get(object_id) is IN_STORE]
        self.submitter.node_died(node_id)
        for caller in self.owner.callers():
            caller.node_died(node_id)
        if lost:
            self.owner.rebuild(lost, f"its node {node_id.hex()} died ({reason})")

    def _warn_infeasible(self, shape: dict[str, float]) -> None:
        key = tuple(sorted(shape.items()))
        if key not in self._warned_shapes:
            self._warned_shapes.add(key)
            log.warning("a task or actor needs %s, which no node in the cluster has; it stays "
                        "pending until a node with those resources joins (see `rtml status`)",
                        shape)

    def _on_nm_closed(self, conn: Connection, reason: str) -> None:
        if self.closed:
            return
        log.error("lost the node manager (%s)", reason)
        if self.role == "worker":
            os._exit(1)
        error = RtmlSystemError(f"the node manager at {self.config.nm_address} is gone "
                                f"({reason}); this driver cannot run tasks any more: call "
                                f"rtml.shutdown() and rtml.init() again")
        with self.lock:
            pending = self.owner.unfinished()
        for record in pending:
            self.owner.fail_task(record, error)
        for req_id in list(self._replies):  # nothing waited for will be answered now
            self._deliver_reply(req_id, error)

    def _on_head_message(self, conn: Connection, msg: Any) -> None:
        if isinstance(msg, m.ActorInfo) and not msg.req_id:  # an actor we created is DEAD
            with self.lock:
                self.owner.actor_ended(msg.actor_id, msg.error or "the actor is DEAD")
        elif isinstance(msg, (m.ActorInfo, m.ClusterInfo, m.OutputFlushed, m.NamedActors,
                              m.PlacementGroupInfo, m.JobConfigInfo)):
            self.head.settled(msg.req_id)
            self._deliver_reply(msg.req_id, msg)
        elif isinstance(msg, m.WorkerOutput):
            if self.config.log_to_driver:
                text = self.bars.take(msg.text)  # tqdm_ray's bars drawn, not printed
                prefix = f"(pid={msg.pid}) "
                sys.stdout.write("".join(prefix + line for line in text.splitlines(True)))
                sys.stdout.flush()

    def _created_actors(self) -> list[m.Msg]:
        """For a head that took over: the actors this process created and that are not
        known DEAD, which it may never have heard of or recorded (creating one again is a
        no-op at the head)."""
        with self.lock:
            return [m.CreateActor(0, caller.created) for caller in self.owner.callers()
                    if caller.created is not None and not caller.dead_error]

    def _head_gone(self, error: RtmlSystemError, req_ids: list[int]) -> None:
        """The head did not come back in time: what waits for it fails."""
        for req_id in req_ids:
            self._deliver_reply(req_id, error)

    # -- objects -------------------------------------------------------------------------------

    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` and return its ref. Raises TypeError if it cannot be pickled."""
        if isinstance(value, ObjectRef):
            raise TypeError("put() of an ObjectRef is not allowed; pass the ref itself")
        return self.put_serialized(serialize(value))

    def put_serialized(self, ser: Serialized) -> ObjectRef:
        """Store an already-serialized value as a new owned object."""
        if self.refs.refops:
            self.refs.process_refops()
        object_id = object_id_for(new_task_id(self.job_id or context.current_job()), 0)
        self._store_value(object_id, ser, is_error=False)
        return ObjectRef(object_id, self.client_id)

    def _store_value(self, object_id: bytes, ser: Serialized, is_error: bool) -> None:
        """Keep a value this process owns: inline if small, else in shared memory."""
        self._hold_contained(object_id, ser)
        if ser.size <= INLINE_MAX:
            entry: Entry = ser.to_payload(is_error)
        else:
            try:
                self.write_shared(object_id, ser, holder=self.client_id)
            except ObjectStoreFullError:
                if ser.contained:  # the refs inside it are not held for it after all
                    with self.lock:
                        self.store.has_contained.pop(object_id, None)
                    self.nm.send(m.ReleaseHolder(object_id))
                raise
            entry = IN_STORE
        for callback, _ in self.set_entries([(object_id, entry)]):
            callback(object_id)

    def keep_inline(self, object_id: bytes, value: Any
                    ) -> list[tuple[Callable[[bytes], Any], bytes]]:
        """Keep ``value`` as owned object ``object_id`` in memory (its refs held for it),
        however large; returns its waiters, to call without the lock."""
        ser = serialize(value)
        self._hold_contained(object_id, ser)
        return self.set_entries([(object_id, ser.to_payload(False))])

    def _hold_contained(self, container_id: bytes, ser: Serialized) -> None:
        if ser.contained:
            self.refs.send_holds(m.AddHolds, [r.id for r in ser.contained], container_id)
            with self.lock:
                self.store.has_contained[container_id] = b""

    def write_shared(self, object_id: bytes, ser: Serialized, holder: bytes) -> int:
        """Write a value into this node's shared-memory store on behalf of ``holder``, and
        seal it once the node manager has made room for it. Asked first; written while
        the answer comes when the last answer left room for it twice over (so a store
        near full is never overrun), else once it is granted. Raises
        ObjectStoreFullError (OutOfDiskError if spilling failed) when it cannot, and
        leaves nothing behind then."""
        if self.nm.closed:
            raise self.nm_gone()
        done = Flag()
        box: list[m.ObjectCreated | RtmlSystemError] = []

        def answered(msg: m.ObjectCreated | RtmlSystemError) -> None:
            box.append(msg)
            done.set()

        req_id = self.ask(self.nm, lambda rid: m.CreateObject(rid, object_id, ser.size),
                          answered)
        path = objectstore.segment_path(self.store_dir, object_id)
        written = False
        if 2 * ser.size > self._store_room:
            self._room_granted(req_id, done, box, path, written)
        try:
            size = objectstore.write_segment(path, ser.inband, ser.buffers)
            written = True
        except FileExistsError:  # an earlier attempt of the same task wrote it
            size = objectstore.existing_size(path)
        if not box:
            self._room_granted(req_id, done, box, path, written)
        self.nm.send(m.SealObject(object_id, size, holder))
        return size

    def _room_granted(self, req_id: int, done: Flag,
                      box: list[m.ObjectCreated | RtmlSystemError], path: str,
                      written: bool) -> None:
        """Wait for the answer to a CreateObject; raise its error (removing what was
        written) if the room was not granted."""
        if not self.reactor.wait_serving(done, STORE_FULL_TIMEOUT + 30, spin=True):
            self.forget_reply(req_id)
            box.append(RtmlSystemError(f"the node manager at {self.config.nm_address} did "
                                       f"not answer a request for room in its object store"))
        answer = box[0]
        if isinstance(answer, m.ObjectCreated) and not answer.error:
            self._store_room = answer.free
            return
        if written:
            os.unlink(path)
        if isinstance(answer, RtmlSystemError):
            raise answer
        raise (OutOfDiskError if answer.out_of_disk else ObjectStoreFullError)(answer.error)

    def set_entries(self, entries: list[tuple[bytes, Entry]]
                    ) -> list[tuple[Callable[[bytes], Any], bytes]]:
        """Store owned objects' values; returns their waiters (each with its object's id),
        to call without the lock."""
        escaped = self.refs.escaped_pending
        with self.lock:
            callbacks = self.store.put(entries)
            if escaped:
                for object_id, entry in entries:
                    if object_id in escaped:
                        escaped.discard(object_id)
                        if entry is not IN_STORE:
                            self.promote(object_id, entry)
        return callbacks

    def promote(self, object_id: bytes, payload: Any) -> None:
        """Copy an inline value into shared memory so other processes can read it."""
        path = objectstore.segment_path(self.store_dir, object_id)
        try:
            size = objectstore.write_segment(path, payload.data, payload.buffers)
        except FileExistsError:
            return
        self.store.promoted.add(object_id)
        self.nm.send(m.SealObject(object_id, size, self.client_id,
                                  self.owner.lives.actors.get(object_id, b""),
                                  self.store.has_contained.get(object_id, b"")))

    def get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        """Values of ``refs`` in order. Raises the stored error, or GetTimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        failed = self._wait_owned(refs, deadline)
        if failed is not None:  # fail fast, as Ray: one failed while others still run
            self._value(failed, deadline)  # raises its error
        borrows = self.refs.borrows
        early = self._read_borrowed(refs, deadline) if len(refs) > 1 else None
        if early:
            values = [early[r.id] if r.id in early else self._value(r, deadline) for r in refs]
        else:
            values = [self._value(r, deadline) for r in refs]
        if self.refs.borrows != borrows:  # refs found inside the values: hold them now, in
            self.refs.process_refops()  # one batch (other changes wait for the next drain)
        return values

    def _read_borrowed(self, refs: list[ObjectRef], deadline: float | None
                       ) -> dict[bytes, Any] | None:
        """Fail fast among borrowed refs too: when several of ``refs`` are owned elsewhere
        and not on this node yet, wait for all of them at once and read each as it comes,
        raising the first failure then (not behind an earlier ref still being made).
        Returns the values read, by id; None when there is nothing to wait for."""
        me, entries, ns = self.client_id, self.store.entries, self.store_dir
        missing = [r for r in refs if r.owner != me and r.id not in entries
                   and not os.path.exists(objectstore.segment_path(ns, r.id))]
        if len(missing) < 2:
            return None
        arrived: list[tuple[ObjectRef, m.ObjectAvailable | RtmlSystemError]] = []
        wake = [Flag()]

        def on_reply(ref: ObjectRef) -> Callable[[m.ObjectAvailable], None]:
            def reply(msg: m.ObjectAvailable | RtmlSystemError) -> None:
                arrived.append((ref, msg))
                wake[0].set()
            return reply

        locations = self.refs.locations
        req_ids = [self.ask(self.nm, _wait_request(r, locations.get(r.id, b"")), on_reply(r))
                   for r in missing]
        values: dict[bytes, Any] = {}
        try:
            while len(values) < len(missing):
                flag = wake[0]
                self.block(flag, deadline, [r.id for r in missing if r.id not in values])
                wake[0] = Flag()
                while arrived:
                    ref, answer = arrived.pop(0)
                    _raise_unavailable(ref.id, answer)
                    values[ref.id] = self._value(ref, deadline)  # raises a stored error
        finally:
            for req_id in req_ids:
                self.forget_reply(req_id)
        return values

    def _wait_owned(self, refs: list[ObjectRef], deadline: float | None) -> ObjectRef | None:
        """Block until the refs among ``refs`` that we own and are still being made have
        their values, or until one of them failed: the failed one is returned (also one
        that had failed already), for ``get`` to raise its error at once, as Ray does."""
        me, entries, owner = self.client_id, self.store.entries, self.owner
        with self.lock:  # owner.making on a typed local: a native call, no bound method
            missing = [r.id for r in refs if r.owner == me and r.id not in entries
                       and owner.making(r.id)]
            if not missing:
                return None  # a failure among them raises from its value, in order
            for ref in refs:  # about to wait: one that failed already is raised at once
                entry = entries.get(ref.id)
                if isinstance(entry, m.Payload) and entry.is_error:
                    return ref
            done = Flag()
            failures: list[bytes] = []
            arrived = done.set if len(missing) == 1 else _countdown(
                len(missing), done, entries, failures)
            for object_id in missing:
                self.store.add_waiter(object_id, arrived)
        try:
            # A get of one task's result: the round trip's answer is due soon.
            self.block(done, deadline, missing, spin=len(refs) == 1)
        except BaseException:  # timed out or interrupted: a polling loop must not pile up
            with self.lock:
                for object_id in missing:
                    self.store.remove_waiter(object_id, arrived)
            raise
        if not failures:  # all arrived (a lone one that failed raises from its value)
            return None
        with self.lock:
            for object_id in missing:
                self.store.remove_waiter(object_id, arrived)
        return next(ref for ref in refs if ref.id == failures[0])

    def block(self, done: Flag, deadline: float | None, ids: list[bytes],
               spin: bool = False) -> None:
        """Wait for ``done``; ``spin``: one task's result, due soon (see Reactor.SPIN)."""
        if done.is_set():
            return
        lend = self._lends_cpu
        if lend:
            self.lend_cpu(True)
        try:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.reactor.wait_serving(done, timeout, spin):
                raise GetTimeoutError(
                    f"get timed out after waiting for {len(ids)} object(s), e.g. "
                    f"{ids[0].hex()}; the task may still be running")
        finally:
            if lend:
                self.lend_cpu(False)

    def _value(self, ref: ObjectRef, deadline: float | None) -> Any:
        entry = self.store.entries.get(ref.id)
        if isinstance(entry, m.Payload):
            value = _load(entry) if entry.is_error else from_payload(entry)
        else:
            try:
                value = self.read_shared(ref.id, ref.owner, deadline,
                                         self.refs.locations.get(ref.id, b""))
            except OwnerDiedError:
                raise
            except ObjectLostError as exc:
                if ref.owner != self.client_id or not self.owner.rebuild([ref.id], str(exc)):
                    raise
                self._wait_owned([ref], deadline)
                return self._value(ref, deadline)  # rebuilt, or the error saying why not
        if isinstance(value, StoredError):
            raise value.error
        return value

    def read_shared(self, object_id: bytes, owner: bytes, deadline: float | None,
                    node_id: bytes = b"") -> Any:
        """Map an object from shared memory (zero-copy), restoring, pulling or awaiting it.

        ``node_id``: where its primary copy lives, if not on this node.
        """
        path = objectstore.segment_path(self.store_dir, object_id)
        try:
            inband, buffers = objectstore.read_segment(path)
        except FileNotFoundError:
            self.await_shared(object_id, owner, deadline, node_id)
            inband, buffers = objectstore.read_segment(path)
        return deserialize(inband, buffers)

    def await_shared(self, object_id: bytes, owner: bytes, deadline: float | None,
                     node_id: bytes = b"") -> None:
        """Ask the node manager to make an object present here; block until it is."""
        if self.nm.closed:
            raise self.nm_gone()
        done = Flag()
        box: list[m.ObjectAvailable | RtmlSystemError] = []
        req_id = self.next_request_id()

        def reply(msg: m.ObjectAvailable | RtmlSystemError) -> None:
            box.append(msg)
            done.set()

        self._replies[req_id] = reply
        self.nm.send(m.WaitObject(req_id, object_id, owner, node_id))
        try:
            self.block(done, deadline, [object_id])
        except GetTimeoutError:
            self._replies.pop(req_id, None)
            raise
        _raise_unavailable(object_id, box[0])

    def _state(self, ref: ObjectRef) -> int:
        """``_READY`` (in the memory store, or in this node's shared memory), ``_MAKING``
        (a result of a task of ours that has not finished) or ``_ABSENT``."""
        object_id = ref.id
        if object_id in self.store.entries:
            return _READY
        if ref.owner == self.client_id and self.owner.making(object_id):
            return _MAKING
        if os.path.exists(objectstore.segment_path(self.store_dir, object_id)):
            return _READY
        return _ABSENT

    def readiness(self, refs: list[ObjectRef], fetch_local: bool
                  ) -> tuple[list[ObjectRef], list[ObjectRef], list[ObjectRef]]:
        """Split ``refs`` (under the lock) into those ready here now (with
        ``fetch_local``: a copy on this node), results of our tasks still being made, and
        the rest (owned elsewhere, or to be pulled here): each ref looked at once."""
        ready: list[ObjectRef] = []
        making: list[ObjectRef] = []
        rest: list[ObjectRef] = []
        for ref in refs:
            state = self._state(ref)
            if state == _MAKING:
                making.append(ref)
            elif state == _READY and not (fetch_local and self._elsewhere(ref.id)):
                ready.append(ref)
            else:
                rest.append(ref)
        return ready, making, rest

    def on_ready(self, refs: list[ObjectRef], callback: Callable[[bytes], Any],
                 fetch_local: bool = False,
                 making: Sequence[ObjectRef] = ()) -> Callable[[], None]:
        """Call ``callback(id)`` as each of ``refs`` and ``making`` becomes ready (with
        ``fetch_local``: once a copy is on this node, pulling it here); returns a
        canceller. ``making``: results of our tasks not finished when the caller looked,
        under the lock it still holds (as :meth:`readiness` splits them): not looked at
        again.

        One closure for all of them, so waiting on n refs costs n dict operations.
        """
        # The closures hold ids, never ObjectRefs: a ref kept alive by a closure (they
        # form a cycle through ``pulls``) would keep its object alive.
        owners = {ref.id: ref.owner for ref in refs}
        owners.update((ref.id, ref.owner) for ref in making)
        owned = [ref.id for ref in making]
        pulls: list[Callable[[], None]] = []

        def arrived(object_id: bytes) -> None:
            if fetch_local and self._elsewhere(object_id):
                pulls.append(self._await_here(object_id, owners[object_id], callback))
            else:
                callback(object_id)

        def cancel() -> None:
            for object_id in owned:
                self.store.remove_waiter(object_id, arrived)
            for forget in pulls:
                forget()

        with self.lock:
            add_waiter = self.store.add_waiter
            for object_id in owned:
                add_waiter(object_id, arrived)
            for ref in refs:
                state = self._state(ref)
                if state == _READY:
                    arrived(ref.id)
                elif state == _MAKING:
                    self.store.add_waiter(ref.id, arrived)
                    owned.append(ref.id)
                else:
                    pulls.append(self._await_here(ref.id, ref.owner, callback))
        return cancel

    def wait(self, refs: list[ObjectRef], ids: set[bytes], num_returns: int,
             timeout: float | None, fetch_local: bool) -> set[bytes]:
        """The ids of ``refs`` (whose ids are ``ids``) ready once ``num_returns`` of them
        are, or when ``timeout`` s have passed (``rtml.wait``; inside a task, the CPU is
        lent back meanwhile)."""
        with self.lock:
            # Set operations first: a value in the memory store that is not known to live on
            # another node is ready. Only the others are looked at one by one, each once.
            ready = self.store.entries.keys() & ids
            if fetch_local:
                ready -= self.refs.locations.keys()
            making: list[ObjectRef] = []
            rest: list[ObjectRef] = []
            if len(ready) < len(ids):
                now, making, rest = self.readiness([r for r in refs if r.id not in ready],
                                                   fetch_local)
                ready.update(r.id for r in now)
            if len(ready) >= num_returns:
                return ready  # no callbacks to register and cancel: O(refs) cheap checks
            lock = threading.Lock()
            enough = Flag()

            def arrived(object_id: bytes) -> None:
                with lock:
                    ready.add(object_id)
                    if len(ready) >= num_returns:
                        enough.set()

            # Only callbacks can make a ref ready; with timeout 0 an owned task's result
            # cannot arrive in time, but an object elsewhere still starts its pull. Still
            # under the lock, so what readiness() found making is still being made.
            cancel_waits = self.on_ready(rest, arrived, fetch_local,
                                         making=() if timeout == 0 else making)
        blocked = not enough.is_set() and timeout != 0
        lend = blocked and self._lends_cpu
        if lend:
            self.lend_cpu(True)  # inside a task: lend the CPU back while waiting
        try:
            if blocked:
                self.reactor.wait_serving(enough, timeout)
        finally:
            if lend:
                self.lend_cpu(False)
            cancel_waits()  # also when interrupted: no callback may outlive the call
        with lock:
            return set(ready)

    def lend_cpu(self, blocked: bool) -> None:
        """A worker's task starts (or stops) waiting in get/wait: the node manager lends
        its CPU to other work meanwhile. Told once for any number of waits at a time."""
        with self._blocked_lock:
            self._blocked += 1 if blocked else -1
            if self._blocked == (1 if blocked else 0):
                self.nm.send(m.WorkerBlocked() if blocked else m.WorkerUnblocked())

    def _elsewhere(self, object_id: bytes) -> bool:
        """An owned result that lives only on another node so far."""
        location = self.refs.locations.get(object_id)
        return bool(location) and location != self.node_id and not os.path.exists(
            objectstore.segment_path(self.store_dir, object_id))

    def _await_here(self, object_id: bytes, owner: bytes,
                    callback: Callable[[bytes], Any]) -> Callable[[], None]:
        """Ask the node manager to make the object present here (pulling it if need be)."""
        node_id = self.refs.locations.get(object_id, b"")
        req_id = self.ask(self.nm, lambda rid: m.WaitObject(rid, object_id, owner, node_id),
                          lambda msg: callback(object_id))
        return lambda: self.forget_reply(req_id)

    def future(self, ref: ObjectRef) -> concurrent.futures.Future[Any]:
        """A future of ``ref``'s value. No closures: compiled, a closure's environment and
        its functions form a cycle, which would keep the future (and what its callbacks
        hold, an actor handle say) until the collector runs."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.on_ready([ref], functools.partial(self._start_resolving, fut, ref))
        return fut

    def _start_resolving(self, fut: concurrent.futures.Future[Any], ref: ObjectRef,
                         _: bytes) -> None:
        threading.Thread(target=self._resolve, args=(fut, ref), daemon=True).start()

    def _resolve(self, fut: concurrent.futures.Future[Any], ref: ObjectRef) -> None:
        try:
            fut.set_result(self.get([ref], None)[0])
        except BaseException as exc:
            fut.set_exception(exc)

    # -- tasks -------------------------------------------------------------------------------

    def export_function(self, function_id: bytes, blob: bytes) -> None:
        """Store a function for the workers to load; while Redis is away it waits in the
        writer, and the owner sends it to a worker that asks (FunctionWanted)."""
        if function_id not in self.exported:
            try:
                self.plane.export_function(function_id, blob)
            except RtmlSystemError as exc:
                if not unreachable(exc):
                    raise
                self.writer.submit_function(function_id, blob)
            self.exported[function_id] = blob

    def stored_function(self, function_id: bytes) -> bytes | None:
        """A function exported by some owner, if the control plane has it now (None: not
        yet, or Redis is away). A body that is not its id's (the id is its hash) is taken
        as none: whoever can write to Redis cannot plant code under an id."""
        try:
            blob = self.plane.fetch_function(function_id)
        except RtmlSystemError as exc:
            if not unreachable(exc):
                raise
            return None
        if blob is not None and hashlib.sha1(blob).digest() != function_id:
            log.warning("the control plane holds a body for function %s that is not that "
                        "function's (its hash differs): not loaded", function_id.hex())
            return None
        return blob

    def fetch_function(self, function_id: bytes) -> bytes:
        """A function exported by some owner, waiting up to the head timeout for it while
        Redis is away (or while the owner's export waits for Redis to be back). Raises
        RtmlError if it never comes."""
        deadline = time.monotonic() + self.config.head_timeout
        delay = 0.05
        while True:
            blob = self.stored_function(function_id)
            if blob is not None:
                return blob
            if time.monotonic() + delay > deadline:
                raise RtmlError(f"function {function_id.hex()} could not be loaded within "
                                f"{self.config.head_timeout:g} s: the control plane does not "
                                f"have it (or not a body of that id), or its Redis is away")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def task_error(self, name: str, exc: BaseException) -> TaskError:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return TaskError(name, text, exc, os.getpid(), self.node_id.hex()).as_instanceof_cause()


_READY, _MAKING, _ABSENT = range(3)  # what ClientRuntime._state says of a ref


def _countdown(count: int, done: Flag, entries: dict[bytes, Entry],
               failures: list[bytes]) -> Callable[[bytes], None]:
    """A waiter callback that sets ``done`` on its ``count``-th call, or at once on a call
    for an object whose value in ``entries`` is an error (added to ``failures``), from any
    thread (``next`` on a counter is one C call: no arrival is lost between a read and a
    write; the value is stored before its waiters are called)."""
    arrivals = itertools.count(1)

    def arrived(object_id: bytes) -> None:
        entry = entries.get(object_id)  # inline, not a method: one per result of a burst
        if isinstance(entry, m.Payload) and entry.is_error:
            failures.append(object_id)
            done.set()
        elif next(arrivals) == count:
            done.set()
    return arrived


def _wait_request(ref: ObjectRef, node_id: bytes) -> Callable[[int], m.Msg]:
    return lambda req_id: m.WaitObject(req_id, ref.id, ref.owner, node_id)


def _raise_unavailable(object_id: bytes, answer: m.ObjectAvailable | RtmlSystemError) -> None:
    """Raise the error a node manager's answer to WaitObject carries, if any (or the error
    of a node manager that went away)."""
    if isinstance(answer, RtmlSystemError):
        raise answer
    if answer.owner_died:
        raise OwnerDiedError(f"object {object_id.hex()} cannot be made: {answer.error}")
    if answer.error:
        raise ObjectLostError(f"object {object_id.hex()} is lost: {answer.error}")


def _load(payload: m.Payload) -> Any:
    """Deserialize an inline value; an error that cannot be rebuilt here becomes a TaskError."""
    try:
        return from_payload(payload)
    except Exception as exc:
        if not payload.is_error:
            raise
        return StoredError(TaskError("<unknown>", f"the task failed, and its exception could "
                                     f"not be unpickled in this process: {exc!r}", None))
