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
shared-memory store, held there until no reference remains. Its parts, each
given what it uses and never the runtime (a part reports up through
``TaskEvents``, :mod:`rtml.core.tasks`):

- ``links`` (:mod:`rtml.core.links`): identity, connections, requests and replies;
- ``shared`` (:mod:`rtml.core.shared_objects`): the node's shared memory, as used here;
- ``owner`` (:mod:`rtml.core.owner`): a submitted task's life, from its arguments
  to its results or its error, and the values of owned objects; it builds
- ``submitter`` (:mod:`rtml.core.submitter`): leases workers and pushes tasks,
- one ``ActorCaller`` per actor called (:mod:`rtml.core.actor_caller`), and
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
from typing import Any

from rtml.config import INLINE_MAX
from rtml.control_plane import BatchedWriter, ControlPlane, RedisAddress, unreachable
from rtml.core import context, object_ref
from rtml.core.links import ClientConfig, ClientLinks, Handlers
from rtml.core.memory_store import IN_STORE, Entry, MemoryStore, StoredError
from rtml.core.object_ref import ObjectRef
from rtml.core.owner import TaskOwner
from rtml.core.progress import Bars, ProgressBar
from rtml.core.serialization import Serialized, from_payload, serialize
from rtml.core.shared_objects import SharedObjects, raise_unavailable
from rtml.exceptions import (
    GetTimeoutError,
    ObjectLostError,
    ObjectStoreFullError,
    OwnerDiedError,
    RtmlError,
    RtmlSystemError,
    TaskError,
)
from rtml.ids import NO_NODE, ClientID, JobID, NodeID, ObjectID, new_task_id, object_id_for
from rtml.rpc import messages as m
from rtml.rpc.reactor import Connection, Flag

log = logging.getLogger(__name__)


class ClientRuntime:
    """Connections, owned objects, reference counts and task submission of one process.

    Its parts, each the one owner of its state: ``links`` (identity, connections,
    requests), ``store`` (owned values), ``shared`` (the node's shared memory, as this
    process uses it) and ``owner`` (the task table and lineage; it builds ``submitter``,
    ``refs`` and the actor callers). The runtime routes what the daemons send to them,
    and reads objects (``get``, ``wait``, ``put``).
    """

    def __init__(self, config: ClientConfig,
                 on_worker_message: Callable[[Any], None] | None = None) -> None:
        """Connect to the node manager and the head service: the runtime is whole once
        built. ``on_worker_message``: a worker's handler of what its node manager asks of
        it (cancel a running task, become an actor). Raises RtmlSystemError if either
        daemon cannot be reached or refuses us (nothing is left running then)."""
        self.config = config
        links = self.links = ClientLinks(config)
        links.open(Handlers(self._on_nm_message, self._on_nm_closed,
                            self._on_remote_nm_closed, self._on_head_message,
                            self._created_actors, self._head_gone))
        try:
            self.plane = ControlPlane.at(RedisAddress.from_info(links.head.reply.info),
                                         links.token)
        except BaseException:
            links.abort()
            raise
        # The links' identity and connections, read-only here: named for the runtime's users.
        self.role, self.token, self.lock = links.role, links.token, links.lock
        self.client_id, self.job_id, self.sys_paths = links.client_id, links.job_id, links.sys_paths
        self.session_dir, self.reactor = links.session_dir, links.reactor
        self.nm, self.head, self.node_id = links.nm, links.head, links.node_id
        self.store_dir, self.node_ip = links.store_dir, links.node_ip
        self.runtime_env = ""  # the env its calls inherit: its job's, or a worker's own
        self.exported: dict[bytes, bytes] = {}  # function id -> blob, for workers that ask
        self.functions: dict[bytes, Any] = {}
        self.on_worker_message = on_worker_message
        self.current_task_name = "driver"
        self.closed = False
        self._warned_shapes: set[tuple[tuple[str, float], ...]] = set()
        self.bars = Bars()  # remote tasks' progress bars (tqdm_ray), drawn here
        self.job_lifetimes: dict[JobID, str] = {}  # jobs' default actor lifetimes, as known
        self.writer = BatchedWriter(self.plane)
        self.store = MemoryStore()
        self.shared = SharedObjects(links)
        self.owner = TaskOwner(links, self.store, self.shared, self.writer, self.exported)
        self.submitter = self.owner.submitter
        self.refs = self.owner.refs
        self.reactor.expecting = self.submitter.has_queued
        object_ref.set_counter(self.refs, self.future)
        links.start()

    # -- lifecycle ---------------------------------------------------------------------------

    def flush_output(self, timeout: float) -> None:
        """Wait (up to ``timeout`` s) until what workers printed so far for this job has
        been printed here: a driver's last step before it leaves. A head that does not
        answer in time is given up on (the prints still on their way are lost)."""
        try:
            self.links.request(self.head, lambda req_id: m.FlushOutput(req_id), timeout)
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
        self.links.close()
        self.writer.close()
        self.plane.close()

    # -- node manager and head messages (reactor thread) -------------------------------------

    def _on_nm_message(self, conn: Connection, msg: Any, node_id: NodeID = NO_NODE) -> None:
        if isinstance(msg, m.LeaseGranted):
            self.submitter.on_lease_granted(msg, conn, node_id or self.node_id)
        elif isinstance(msg, m.LeaseSpillback):
            self.submitter.on_spillback(msg)
        elif isinstance(msg, m.NodeDied):
            if conn is self.nm:  # (other nodes' managers tell us too: only ours knows
                self._node_died(msg.node_id, msg.reason, msg.kept)  # which copies it kept)
        elif isinstance(msg, (m.ObjectAvailable, m.ObjectCreated, m.StoreStatsReply,
                              m.HoldsFenced)):
            self.links.deliver_reply(msg.req_id, msg)
        elif isinstance(msg, m.LeaseFailed):
            self.submitter.on_lease_failed(msg)
        elif isinstance(msg, m.LeaseInfeasible):
            self._warn_infeasible(msg.shape)
        elif self.on_worker_message is not None:
            self.on_worker_message(msg)

    def _node_died(self, node_id: NodeID, reason: str, kept: Sequence[ObjectID] = ()) -> None:
        """Tasks and actor calls running there are retried or fail; objects whose primary
        was there live on where our node manager kept a copy (``kept``), else our own are
        rebuilt from their lineage."""
        self.links.node_died(node_id)
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
        self.links.fail_replies(error)

    def _on_remote_nm_closed(self, node_id: NodeID) -> None:
        self.submitter.node_died(node_id)  # its lease requests will never be answered

    def _on_head_message(self, conn: Connection, msg: Any) -> None:
        if isinstance(msg, m.ActorInfo) and not msg.req_id:  # an actor we created is DEAD
            with self.lock:
                self.owner.actor_ended(msg.actor_id, msg.error or "the actor is DEAD")
        elif isinstance(msg, (m.ActorInfo, m.ClusterInfo, m.OutputFlushed, m.NamedActors,
                              m.PlacementGroupInfo, m.JobConfigInfo)):
            self.head.settled(msg.req_id)
            self.links.deliver_reply(msg.req_id, msg)
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
            self.links.deliver_reply(req_id, error)

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

    def _store_value(self, object_id: ObjectID, ser: Serialized, is_error: bool) -> None:
        """Keep a value this process owns: inline if small, else in shared memory."""
        self.owner.hold_contained(object_id, ser)
        if ser.size <= INLINE_MAX:
            entry: Entry = ser.to_payload(is_error)
        else:
            try:
                self.shared.write(object_id, ser, holder=self.client_id)
            except ObjectStoreFullError:
                if ser.contained:  # the refs inside it are not held for it after all
                    with self.lock:
                        self.store.has_contained.pop(object_id, None)
                    self.nm.send(m.ReleaseHolder(object_id))
                raise
            entry = IN_STORE
        for callback, _ in self.owner.set_entries([(object_id, entry)]):
            callback(object_id)

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
                       ) -> dict[ObjectID, Any] | None:
        """Fail fast among borrowed refs too: when several of ``refs`` are owned elsewhere
        and not on this node yet, wait for all of them at once and read each as it comes,
        raising the first failure then (not behind an earlier ref still being made).
        Returns the values read, by id; None when there is nothing to wait for."""
        me, entries, shared = self.client_id, self.store.entries, self.shared
        missing = [r for r in refs if r.owner != me and r.id not in entries
                   and not shared.exists(r.id)]
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
        req_ids = [self.links.ask(self.nm, _wait_request(r, locations.get(r.id, NO_NODE)),
                                  on_reply(r))
                   for r in missing]
        values: dict[ObjectID, Any] = {}
        try:
            while len(values) < len(missing):
                flag = wake[0]
                self.links.block(flag, deadline, [r.id for r in missing if r.id not in values])
                wake[0] = Flag()
                while arrived:
                    ref, answer = arrived.pop(0)
                    raise_unavailable(ref.id, answer)
                    values[ref.id] = self._value(ref, deadline)  # raises a stored error
        finally:
            for req_id in req_ids:
                self.links.forget_reply(req_id)
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
            failures: list[ObjectID] = []
            arrived = done.set if len(missing) == 1 else _countdown(
                len(missing), done, entries, failures)
            for object_id in missing:
                self.store.add_waiter(object_id, arrived)
        try:
            # A get of one task's result: the round trip's answer is due soon.
            self.links.block(done, deadline, missing, spin=len(refs) == 1)
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

    def _value(self, ref: ObjectRef, deadline: float | None) -> Any:
        entry = self.store.entries.get(ref.id)
        if isinstance(entry, m.Payload):
            value = _load(entry) if entry.is_error else from_payload(entry)
        else:
            try:
                value = self.shared.read(ref.id, ref.owner, deadline,
                                         self.refs.locations.get(ref.id, NO_NODE))
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

    def _state(self, ref: ObjectRef) -> int:
        """``_READY`` (in the memory store, or in this node's shared memory), ``_MAKING``
        (a result of a task of ours that has not finished) or ``_ABSENT``."""
        object_id = ref.id
        if object_id in self.store.entries:
            return _READY
        if ref.owner == self.client_id and self.owner.making(object_id):
            return _MAKING
        if self.shared.exists(object_id):
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

    def on_ready(self, refs: list[ObjectRef], callback: Callable[[ObjectID], Any],
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

        def arrived(object_id: ObjectID) -> None:
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

    def wait(self, refs: list[ObjectRef], ids: set[ObjectID], num_returns: int,
             timeout: float | None, fetch_local: bool) -> set[ObjectID]:
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

            def arrived(object_id: ObjectID) -> None:
                with lock:
                    ready.add(object_id)
                    if len(ready) >= num_returns:
                        enough.set()

            # Only callbacks can make a ref ready; with timeout 0 an owned task's result
            # cannot arrive in time, but an object elsewhere still starts its pull. Still
            # under the lock, so what readiness() found making is still being made.
            cancel_waits = self.on_ready(rest, arrived, fetch_local,
                                         making=() if timeout == 0 else making)
        try:
            if not enough.is_set() and timeout != 0:  # inside a task: the CPU is lent back
                self.links.wait_lending(enough, timeout)
        finally:
            cancel_waits()  # also when interrupted: no callback may outlive the call
        with lock:
            return set(ready)

    def _elsewhere(self, object_id: ObjectID) -> bool:
        """An owned result that lives only on another node so far."""
        location = self.refs.locations.get(object_id)
        return bool(location) and location != self.node_id and not self.shared.exists(
            object_id)

    def _await_here(self, object_id: ObjectID, owner: ClientID,
                    callback: Callable[[ObjectID], Any]) -> Callable[[], None]:
        """Ask the node manager to make the object present here (pulling it if need be)."""
        node_id = self.refs.locations.get(object_id, NO_NODE)
        req_id = self.links.ask(self.nm, lambda rid: m.WaitObject(rid, object_id, owner, node_id),
                          lambda msg: callback(object_id))
        return lambda: self.links.forget_reply(req_id)

    def show_progress(self, refs: list[ObjectRef], label: str) -> Callable[[], None]:
        """Show a bar labelled ``label`` that advances as each of ``refs`` is ready (a
        ``get`` or ``wait`` with ``progress=``); returns what ends it."""
        unique = list({ref.id: ref for ref in refs}.values())
        bar = ProgressBar(len(unique), label)
        cancel = self.on_ready(unique, bar.arrived)

        def end() -> None:
            cancel()
            bar.close()
        return end

    def future(self, ref: ObjectRef) -> concurrent.futures.Future[Any]:
        """A future of ``ref``'s value. No closures: compiled, a closure's environment and
        its functions form a cycle, which would keep the future (and what its callbacks
        hold, an actor handle say) until the collector runs."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.on_ready([ref], functools.partial(self._start_resolving, fut, ref))
        return fut

    def _start_resolving(self, fut: concurrent.futures.Future[Any], ref: ObjectRef,
                         _: ObjectID) -> None:
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


def _countdown(count: int, done: Flag, entries: dict[ObjectID, Entry],
               failures: list[ObjectID]) -> Callable[[ObjectID], None]:
    """A waiter callback that sets ``done`` on its ``count``-th call, or at once on a call
    for an object whose value in ``entries`` is an error (added to ``failures``), from any
    thread (``next`` on a counter is one C call: no arrival is lost between a read and a
    write; the value is stored before its waiters are called)."""
    arrivals = itertools.count(1)

    def arrived(object_id: ObjectID) -> None:
        entry = entries.get(object_id)  # inline, not a method: one per result of a burst
        if isinstance(entry, m.Payload) and entry.is_error:
            failures.append(object_id)
            done.set()
        elif next(arrivals) == count:
            done.set()
    return arrived


def _wait_request(ref: ObjectRef, node_id: NodeID) -> Callable[[int], m.Msg]:
    return lambda req_id: m.WaitObject(req_id, ref.id, ref.owner, node_id)


def _load(payload: m.Payload) -> Any:
    """Deserialize an inline value; an error that cannot be rebuilt here becomes a TaskError."""
    try:
        return from_payload(payload)
    except Exception as exc:
        if not payload.is_error:
            raise
        return StoredError(TaskError("<unknown>", f"the task failed, and its exception could "
                                     f"not be unpickled in this process: {exc!r}", None))
