"""The owner side of a task's life: registered, waiting on arguments, finished.

    submit(record) --> tasks[task_id], status PENDING
        owned args pending -> a waiter per arg in the memory store (_dep_ready)
        all args ready     -> submitter.enqueue (task) | ActorCaller.call (actor method)
    TaskResults of one read (submitter / ActorCaller) --> complete_tasks
        returns -> memory store (inline) or IN_STORE (shared memory) -> wake getters
        -> done; in the I/O loop's next iteration, settle: status FINISHED / FAILED,
           free returns nobody references
    cancel / lease failed / worker or actor lost / node manager gone / failed argument
        --> fail_task: every return set to the error -> done, settled -> wake getters
    settled with a return in shared memory --> lineage[task_id], until its returns are freed
    every copy of such a return gone (its node died, a read found it lost) --> rebuild:
        the task runs again (attempt + 1, within max_retries), after its lost arguments
        are rebuilt the same way; a task whose argument was lost under it is pushed again

A task's getters are woken before any bookkeeping. Its PENDING record is written once
it is pushed, so its final status may be written first: reading lineage keeps a final
status over a PENDING one.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from rtml.control_plane import RAN, RAN_FAILED, SUBMITTED, BatchedWriter
from rtml.core.actor_caller import ActorCaller, ActorLives
from rtml.core.generators import DynamicObjectRefGenerator
from rtml.core.kept_calls import kept_call
from rtml.core.links import ClientLinks
from rtml.core.memory_store import IN_STORE, Entry, MemoryStore, StoredError
from rtml.core.object_ref import ObjectRef
from rtml.core.references import ReferenceCounter
from rtml.core.serialization import Serialized, from_payload, serialize
from rtml.core.shared_objects import SharedObjects
from rtml.core.submitter import TaskSubmitter
from rtml.core.tasks import TaskEvents, TaskRecord
from rtml.exceptions import ObjectLostError, TaskCancelledError
from rtml.ids import NO_NODE, ActorID, NodeID, ObjectID, TaskID, object_id_for, task_of
from rtml.rpc import messages as m
from rtml.rpc.reactor import Connection
from rtml.scheduler.strategy import parse_affinity

log = logging.getLogger(__name__)

_Outcome = tuple[TaskRecord, "m.TaskResult | dict[str, Any]"]
"""A done task, with its result or (if it failed here) its outcome record."""


class TaskOwner(TaskEvents):
    """Tasks and actor calls this process submitted, from submission to their results,
    and the objects it owns: their values, as they come, and their reference counts.

    It owns the task table, the lineage of settled tasks, and the parts that run its
    tasks and count its refs, which it builds with itself as their ``TaskEvents``:
    ``submitter`` (tasks on leased workers), one ``ActorCaller`` per actor called,
    ``refs`` (reference counts and holds) and ``lives`` (the actors it created).
    """

    def __init__(self, links: ClientLinks, store: MemoryStore, shared: SharedObjects,
                 writer: BatchedWriter, exported: dict[bytes, bytes]) -> None:
        self.links = links
        self.store = store
        self.shared = shared
        self.writer = writer
        self.tasks: dict[TaskID, TaskRecord] = {}  # by task id, from submit until settled
        self.lineage: dict[TaskID, TaskRecord] = {}  # settled, by task id: returns in shm
        self._callers: dict[ActorID, ActorCaller] = {}  # this process's, by actor id
        self._unsettled: deque[list[_Outcome]] = deque()  # done, bookkeeping not yet run
        self.submitter = TaskSubmitter(links, self, exported)
        self.lives = ActorLives(links, self)
        self.refs = ReferenceCounter(links, store, shared, self, self.lives)

    def submit(self, record: TaskRecord, pending: list[tuple[int, ObjectRef]],
               error: m.Payload | None = None) -> None:
        """Track a task; queue it once its ``pending`` owned arguments are ready.

        ``error``: an argument already failed, so the task fails with that error.
        Raises RtmlSystemError if the node manager is gone.
        """
        links = self.links
        spec = record.spec
        if links.nm.closed:
            raise links.nm_gone()
        # Reference changes queued meanwhile are applied when finished tasks are settled,
        # before unreferenced returns are freed, and by get/wait: not once per submission.
        direct: Connection | None = None  # an actor's: the call goes at once, on it
        with links.lock:
            self.tasks[spec.task_id] = record
            record.deps = len(pending)
            arrived: list[tuple[Callable[[ObjectID], None], ObjectID]] = []
            if error is None:
                for index, ref in pending:
                    ready = self._dep_ready(record, index, ref)
                    if ref.id in self.store.entries:  # finished since the args were built
                        arrived.append((ready, ref.id))
                    else:
                        self.store.add_waiter(ref.id, ready)
                if spec.actor_id:
                    direct = self.caller(spec.actor_id, record.max_retries).call(record)
                elif not record.deps:
                    self.submitter.enqueue(record)
        if direct is not None:
            direct.send(m.PushTask(spec))
        for ready, object_id in arrived:
            ready(object_id)
        links.flush_sends()
        # Recorded once the task is on its way (off the path to the worker). Its final
        # status may then be written first: reading merges keep a final status.
        self.writer.submit_task((SUBMITTED, spec.task_id, spec.name, spec.job_id, links.client_id,
                               spec.function_id, time.time()))
        if error is not None:
            self.fail_task(record, payload=error)

    def _dep_ready(self, record: TaskRecord, index: int,
                   ref: ObjectRef) -> Callable[[ObjectID], None]:
        links = self.links

        def ready(_: ObjectID) -> None:
            with links.lock:
                if record.done:
                    return
                entry = self.store.get(ref.id)
                if isinstance(entry, m.Payload) and entry.is_error:
                    error = entry
                else:
                    error = None
                    args = record.spec.args
                    record.spec.args = (*args[:index],
                                        resolved_arg(ref, entry, self.refs.location_of(ref.id)),
                                        *args[index + 1:])
                    record.deps -= 1
                    if record.spec.actor_id:
                        self.caller(record.spec.actor_id, record.max_retries).flush()
                    elif record.deps == 0 and not record.cancelled:
                        self.submitter.enqueue(record)
            links.flush_sends()
            if error is not None:
                self.fail_task(record, payload=error)
                if record.spec.actor_id:  # let the calls queued behind it go
                    with links.lock:
                        self.caller(record.spec.actor_id, record.max_retries).flush()
                    links.flush_sends()
        return ready

    def should_retry_exception(self, record: TaskRecord, msg: m.TaskResult) -> bool:
        """True if the exception ``msg`` carries is one ``record`` retries on."""
        if not record.retry_exceptions or msg.cancelled:
            return False
        if not msg.returns or not msg.returns[0].is_error:
            return False
        if record.max_retries >= 0 and record.spec.attempt >= record.max_retries:
            return False
        if record.retry_exceptions is True:
            return True
        error = _error_of(msg.returns[0])
        cause = getattr(error, "cause", error)
        return isinstance(cause, tuple(record.retry_exceptions))

    def complete_tasks(self, done: list[tuple[TaskRecord, m.TaskResult]]) -> None:
        """Store the returns of finished tasks and wake their getters (on the thread leading
        the I/O loop); the rest of their bookkeeping waits for the loop's next iteration."""
        here = self.links.node_id
        entries: list[tuple[ObjectID, Entry]] = []
        finished: list[_Outcome] = []
        streams: list[tuple[TaskRecord, m.TaskResult]] = []
        for record, msg in done:
            if record.cancelled and _cancel_wins(record, msg):
                self.fail_task(record, TaskCancelledError(
                    f"task {record.spec.name!r} was cancelled"))
                continue
            if msg.returns and msg.returns[0].is_error and self._argument_lost(record, msg):
                continue
            finished.append((record, msg))
            if record.stream is not None:
                streams.append((record, msg))
                if record.dynamic and not msg.returns[0].is_error:
                    continue  # its value, its items' refs, is set as its stream ends
            if msg.node_id != here:
                self._hold_remote_results(msg.returns, msg.node_id)
            for ret in msg.returns:  # (as _entries_of does, inlined: with the parent lookup,
                if ret.value is None:  # a call per task here cost ~5% of a task burst)
                    entries.append((ret.object_id, IN_STORE))
                    continue
                if ret.contained:  # the worker's node manager holds its refs for it
                    self._holds_at(ret.object_id, NO_NODE if msg.node_id == here else msg.node_id)
                entries.append((ret.object_id, ret.value))
        for callback, object_id in self.set_entries(entries):
            callback(object_id)  # wake getters first; bookkeeping can wait
        for record, msg in streams:
            self._end_stream(record, msg.returns[0].value if msg.returns[0].is_error else None)
        unsettled = self._mark_done(finished)
        if unsettled:
            self._unsettled.append(unsettled)
            self.links.reactor.call_idle(self.settle)

    def settle(self) -> None:
        """Finish the bookkeeping of the tasks completed so far: forget their records and
        argument refs, free returns nobody references, write their outcome (lineage).

        Run first in the I/O loop's next iteration (in a loop of ``get`` calls: while the
        next task runs, not between a result and its getter), and before lineage is
        read or the runtime closes.
        """
        pending = self._unsettled
        finished: list[_Outcome] = []
        while pending:
            try:
                finished += pending.popleft()
            except IndexError:  # another thread took the last batch
                break
        if finished:
            self._settle(finished)

    def _holds_at(self, object_id: ObjectID, node_id: NodeID) -> None:
        with self.links.lock:
            self.store.has_contained[object_id] = node_id

    def _entries_of(self, returns: Sequence[m.ReturnObject], node_id: NodeID,
                    entries: list[tuple[ObjectID, Entry]]) -> None:
        """Add the memory-store entries of ``returns``, made on ``node_id``, to
        ``entries``; those stored on another node are held there for us."""
        here = self.links.node_id
        if node_id != here:
            self._hold_remote_results(returns, node_id)
        for ret in returns:
            if ret.value is None:
                entries.append((ret.object_id, IN_STORE))
                continue
            if ret.contained:  # the worker's node manager holds its refs for it
                self._holds_at(ret.object_id, NO_NODE if node_id == here else node_id)
            entries.append((ret.object_id, ret.value))

    def _hold_remote_results(self, returns: Sequence[m.ReturnObject], node_id: NodeID) -> None:
        """Results stored on another node: our node manager holds them there for us."""
        remote = [ret.object_id for ret in returns if ret.value is None]
        if remote:
            for object_id in remote:
                self.refs.locations[object_id] = node_id
            self.links.nm.send(m.AddHolds(remote, self.links.client_id, node_id))

    # -- owned values --------------------------------------------------------------------------

    def set_entries(self, entries: list[tuple[ObjectID, Entry]]
                    ) -> list[tuple[Callable[[ObjectID], Any], ObjectID]]:
        """Store owned objects' values; returns their waiters (each with its object's id),
        to call without the lock. One pickled before its value existed is shared now."""
        escaped = self.refs.escaped_pending
        with self.links.lock:
            callbacks = self.store.put(entries)
            if escaped:
                for object_id, entry in entries:
                    if object_id in escaped:
                        escaped.discard(object_id)
                        if isinstance(entry, m.Payload):  # (else it is in shared memory)
                            self.refs.promote(object_id, entry)
        return callbacks

    def keep_inline(self, object_id: ObjectID, value: Any
                    ) -> list[tuple[Callable[[ObjectID], Any], ObjectID]]:
        """Keep ``value`` as owned object ``object_id`` in memory (its refs held for it),
        however large; returns its waiters, to call without the lock."""
        ser = serialize(value)
        self.hold_contained(object_id, ser)
        return self.set_entries([(object_id, ser.to_payload(False))])

    def hold_contained(self, container_id: ObjectID, ser: Serialized) -> None:
        """Hold the refs inside a value for the owned object ``container_id``."""
        if ser.contained:
            self.refs.send_holds(m.AddHolds, [r.id for r in ser.contained], container_id)
            with self.links.lock:
                self.store.has_contained[container_id] = NO_NODE

    # -- generator tasks: items as they are yielded -------------------------------------------

    def generated(self, items: list[m.GeneratorItem], node_id: NodeID) -> None:
        """Items generator tasks yielded (on ``node_id``), in order: stored, and their refs
        handed to the tasks' streams. An item a retried task yields again is skipped."""
        fresh: list[tuple[Any, m.GeneratorItem]] = []
        repeated: list[m.ReturnObject] = []
        with self.links.lock:
            for msg in items:
                record = self.tasks.get(msg.task_id)
                stream = record.stream if record is not None else None
                if stream is not None and stream.accept(msg.index):
                    fresh.append((stream, msg))
                else:
                    repeated.append(msg.item)
        if repeated:
            self._let_go_repeated(repeated, node_id)
        if not fresh:
            return
        entries: list[tuple[ObjectID, Entry]] = []
        self._entries_of([msg.item for _, msg in fresh], node_id, entries)
        for callback, object_id in self.set_entries(entries):
            callback(object_id)
        refs = [(stream, ObjectRef(msg.item.object_id, self.links.client_id))
                for stream, msg in fresh]
        with self.links.lock:
            for stream, ref in refs:
                stream.add(ref)

    def _let_go_repeated(self, items: list[m.ReturnObject], node_id: NodeID) -> None:
        """Items skipped (a retry's repeats, or a task no longer ours): what their worker
        holds for us on ``node_id`` is released, unless it is the copy we still hold."""
        links = self.links
        here = node_id in (b"", links.node_id)
        with links.lock:
            ours = {ret.object_id for ret in items if ret.value is None
                    and self.store.entries.get(ret.object_id) is IN_STORE
                    and self.refs.location_of(ret.object_id) == (links.node_id if here else node_id)}
        stored = [ret.object_id for ret in items if ret.value is None
                  and ret.object_id not in ours]
        if stored and here:
            links.nm.send(m.ReleaseHolds(stored, links.client_id))
        elif stored:  # held there by our node manager for us: through it, as a release is
            links.nm.send(m.AddHolds(stored, links.client_id, node_id))
            links.nm.send(m.ReleaseHolds(stored, links.client_id, node_id))
        for ret in items:
            if ret.contained and ret.object_id not in ours:
                links.nm.send(m.ReleaseHolder(ret.object_id, NO_NODE if here else node_id))

    def _end_stream(self, record: TaskRecord, error: m.Payload | None) -> None:
        """A generator task ended; a failure is its stream's last item, so the consumer
        meets it where the task stopped."""
        stream = record.stream
        with self.links.lock:
            if stream.ended:  # (a result and a failure may race)
                return
            index = stream.received
            if error is not None:
                stream.accept(index)
        if error is not None:
            object_id = object_id_for(record.spec.task_id, index + 2)
            for callback, oid in self.set_entries([(object_id, error)]):
                callback(oid)
            ref = ObjectRef(object_id, self.links.client_id)
            with self.links.lock:
                stream.add(ref)
        with self.links.lock:
            stream.end()
            refs = list(stream.refs) if record.dynamic and error is None else None
        if refs is not None:  # num_returns="dynamic": the task's return is its items' refs
            for callback, oid in self.keep_inline(record.return_ids[0],
                                                     DynamicObjectRefGenerator(refs)):
                callback(oid)

    def fail_task(self, record: TaskRecord, error: BaseException | None = None,
                  payload: m.Payload | None = None) -> None:
        """Set every return of ``record`` to ``error`` (or an already-stored error)."""
        if payload is None:
            assert error is not None, "fail_task needs an error or a stored error payload"
            payload = serialize(StoredError(error)).to_payload(is_error=True)
        callbacks = self.set_entries([(object_id, payload) for object_id in record.return_ids])
        if record.stream is not None:
            self._end_stream(record, payload)
        self._settle(self._mark_done([(record, {
            "task_id": record.spec.task_id, "attempt": record.spec.attempt, "status": "FAILED",
            "error": repr(error) if error else "dependency failed"})]))
        for callback, object_id in callbacks:
            callback(object_id)

    def _mark_done(self, finished: list[_Outcome]) -> list[_Outcome]:
        """Mark tasks done (once: a result and a failure may race); those newly done."""
        with self.links.lock:
            finished = [(record, outcome) for record, outcome in finished if not record.done]
            for record, _ in finished:
                record.done = True
        return finished

    def _settle(self, finished: list[_Outcome]) -> None:
        """Forget done tasks; each with its result, or its outcome record (lineage)."""
        links = self.links
        tasks = self.tasks
        lineage = self.lineage
        with links.lock:
            for record, outcome in finished:
                tasks.pop(record.spec.task_id, None)
                record.keep_alive = ()
                if not isinstance(outcome, dict) and _in_store(outcome):
                    lineage[record.spec.task_id] = record  # to rebuild those returns
        submit = self.writer.submit_task
        for record, outcome in finished:
            if record.has_contained:
                links.nm.send(m.ReleaseHolder(record.spec.task_id))  # releases remote holds too
            submit(outcome if isinstance(outcome, dict) else _lineage(record, outcome))
        refs = self.refs
        if refs.refops:
            refs.process_refops()
        refs.free_unreferenced([oid for record, _ in finished for oid in record.return_ids])

    # -- lineage: lost objects made again ------------------------------------------------------

    def rebuild(self, object_ids: Sequence[ObjectID], why: str) -> bool:
        """Owned objects in shared memory whose every copy is gone (``why``): run the tasks
        that made them again, or store the error saying why they cannot be. True if the
        first of them no longer waits on a copy that is gone (it is being made again, or
        failed)."""
        links = self.links
        self.settle()  # results just in: their lineage is kept first
        callbacks: list[tuple[Callable[[ObjectID], Any], ObjectID]] = []
        with links.lock:
            for object_id in object_ids:
                self._rebuild(object_id, why, callbacks)
            first = self.store.entries.get(object_ids[0])
        links.flush_sends()
        for callback, object_id in callbacks:
            callback(object_id)
        return first is not IN_STORE

    def _rebuild(self, object_id: ObjectID, why: str,
                 callbacks: list[tuple[Callable[[ObjectID], Any], ObjectID]]) -> None:
        """(Under the runtime lock.) Run the task that made ``object_id`` again, once the
        arguments it needs are back (lost ones rebuilt first); or fail the object, its
        getters' callbacks added to ``callbacks``."""
        links = self.links
        entries = self.store.entries
        if entries.get(object_id) is not IN_STORE:
            return  # being made again already, or failed
        task_id = task_of(object_id)
        record = self.lineage.get(task_id)
        problem = _unrebuildable(record, links.dead_nodes)
        pending: list[tuple[int, ObjectRef]] = []
        keep: list[ObjectRef] = []
        if record is not None and not problem:
            problem = self._arguments_back(record, why, pending, keep, callbacks)
        if record is None or problem:
            lost = ObjectLostError(f"object {object_id.hex()} is lost ({why}) and cannot be "
                                   f"rebuilt: {problem}", object_id)
            self.refs.locations.pop(object_id, None)
            callbacks += self.set_entries(
                [(object_id, serialize(StoredError(lost)).to_payload(is_error=True))])
            return
        del self.lineage[task_id]
        locations = self.refs.locations
        returns = [rid for rid in record.return_ids if entries.get(rid) is IN_STORE]
        alive = [rid for rid in returns
                 if rid != object_id and locations.get(rid) not in links.dead_nodes]
        if alive:  # the run makes them again elsewhere: these copies are let go
            self.refs.send_holds(m.ReleaseHolds, alive, links.client_id)
        for return_id in returns:
            self.store.pop(return_id)
            locations.pop(return_id, None)
        record.spec.attempt += 1
        record.keep_alive = keep
        record.done = False
        record.worker = None
        record.deps = len(pending)
        self.tasks[task_id] = record
        log.info("rebuilding object %s (%s): task %r runs again (attempt %d)",
                 object_id.hex(), why, record.spec.name, record.spec.attempt)
        for index, ref in pending:
            self.store.add_waiter(ref.id, self._dep_ready(record, index, ref))
        if not pending:
            self.submitter.enqueue(record)

    def _arguments_back(self, record: TaskRecord, why: str,
                        pending: list[tuple[int, ObjectRef]], keep: list[ObjectRef],
                        callbacks: list[tuple[Callable[[ObjectID], Any], ObjectID]]) -> str:
        """Point ``record``'s owned arguments at where they are now, rebuilding those lost
        with a dead node; those still being made go in ``pending``, refs keeping them all
        in ``keep``. Returns why the task cannot run again, or ``""``."""
        links = self.links
        entries, locations, dead = self.store.entries, self.refs.locations, links.dead_nodes
        args = list(record.spec.args)
        for index, arg in enumerate(args):
            arg_id = arg.object_id
            if not arg_id or arg.owner_id:
                continue  # inline, or borrowed: its owner answers for it
            if entries.get(arg_id) is IN_STORE and locations.get(arg_id) in dead:
                self._rebuild(arg_id, why, callbacks)
            entry = entries.get(arg_id)
            if entry is None and not self.making(arg_id):
                return (f"its argument {arg_id.hex()} was freed (an argument is kept for "
                        f"rebuilding only while something references it)")
            if isinstance(entry, m.Payload) and entry.is_error:
                return f"its argument {arg_id.hex()} is lost too, or failed"
            ref = ObjectRef(arg_id, links.client_id)
            keep.append(ref)
            if entry is None:
                pending.append((index, ref))
            else:
                args[index] = resolved_arg(ref, entry, self.refs.location_of(arg_id))
        record.spec.args = tuple(args)
        return ""

    def _argument_lost(self, record: TaskRecord, msg: m.TaskResult) -> bool:
        """A task failed because an argument we own was lost as its worker read it: it
        runs again (not charged: it never started) once that argument is rebuilt. False
        if the failure stands."""
        error = _error_of(msg.returns[0])
        if type(error) is not ObjectLostError or record.spec.actor_id:
            return False  # (an OwnerDiedError, or an error of the task's own code)
        lost = error.object_id
        index = next((i for i, arg in enumerate(record.spec.args)
                      if arg.object_id == lost and not arg.owner_id), -1)
        if index < 0:
            return False  # borrowed: its owner rebuilds it, not us
        links = self.links
        where = self.refs.location_of(lost)
        if record.spec.args[index].node_id in (where, NO_NODE) or where in links.dead_nodes:
            self.rebuild([lost], str(error))  # (else the task looked where it no longer is)
        with links.lock:
            entry = self.store.entries.get(lost)
            if entry is None and not self.making(lost):
                return False
            ref = ObjectRef(lost, links.client_id)
            record.keep_alive = (*record.keep_alive, ref)
            record.deps += 1
            ready = self._dep_ready(record, index, ref)
            if entry is None:
                self.store.add_waiter(lost, ready)
        if entry is not None:
            ready(lost)
        return True

    def forget_lineage(self, object_id: ObjectID) -> None:
        """(Under the runtime lock.) ``object_id`` was freed: its task's lineage goes with
        the last of its returns."""
        lineage = self.lineage
        if lineage:
            task_id = task_of(object_id)
            record = lineage.get(task_id)
            if record is not None:
                entries = self.store.entries
                if not any(return_id in entries for return_id in record.return_ids):
                    del lineage[task_id]

    def making(self, object_id: ObjectID) -> bool:
        """Whether ``object_id`` is a return of one of our tasks not yet settled (call it
        under the runtime lock)."""
        return task_of(object_id) in self.tasks

    def unfinished(self) -> list[TaskRecord]:
        """Our tasks not done yet (under the runtime lock)."""
        return [record for record in self.tasks.values() if not record.done]

    def caller(self, actor_id: ActorID, max_task_retries: int) -> ActorCaller:
        """This process's channel to ``actor_id`` (made on first use)."""
        caller = self._callers.get(actor_id)
        if caller is None:
            caller = self._callers[actor_id] = ActorCaller(self.links, self, actor_id,
                                                           max_task_retries)
        return caller

    def callers(self) -> list[ActorCaller]:
        """This process's actor callers (a copy: they may be added meanwhile)."""
        return list(self._callers.values())

    def actor_ended(self, actor_id: ActorID, why: str) -> None:
        """Actor ``actor_id`` is DEAD for good: our calls to it fail with ``why`` (under
        the runtime lock)."""
        caller = self._callers.get(actor_id)
        if caller is not None:
            caller.ended(why)

    def cancel(self, task_id: TaskID, force: bool, recursive: bool = False) -> None:
        """Cancel task ``task_id``; its getters then raise TaskCancelledError."""
        with self.links.lock:
            record = self.tasks.get(task_id)
            if record is None or record.done:
                return
        self._cancel(record, force, recursive)

    def cancel_children(self, parent: TaskID) -> None:
        """Cancel (recursively) the unfinished tasks that task ``parent`` submitted here."""
        with self.links.lock:
            children = [record for record in self.tasks.values()
                        if record.parent == parent and not record.done]
        for record in children:
            self._cancel(record, False, True)

    def _cancel(self, record: TaskRecord, force: bool, recursive: bool) -> None:
        with self.links.lock:
            if record.done:
                return
            if record.spec.actor_id:
                record.cancelled = True
                caller = self.caller(record.spec.actor_id, record.max_retries)
                failed_here = caller.cancel_queued(record)
            else:
                failed_here = self.submitter.cancel(record, force, recursive)
        self.links.flush_sends()
        if failed_here:
            self.fail_task(record, TaskCancelledError(f"task {record.spec.name!r} was cancelled"))


def _lineage(record: TaskRecord, msg: m.TaskResult) -> tuple[Any, ...]:
    """The outcome record of a task that ran (compact: see ``write_task_records``), with
    its phases and what replay needs of its call (``kept_calls``; an actor call's actor
    id, as it cannot be replayed)."""
    spec = record.spec
    return (RAN_FAILED if msg.returns and msg.returns[0].is_error else RAN, spec.task_id,
            spec.attempt, msg.start_ts, msg.worker_pid, msg.node_id, msg.end_us, msg.args_us,
            msg.ran_us, spec.actor_id or kept_call(spec))


def _in_store(msg: m.TaskResult) -> bool:
    """Whether a return of the task lives in shared memory (so it can be lost)."""
    for ret in msg.returns:
        if ret.value is None:
            return True
    return False


def _unrebuildable(record: TaskRecord | None, dead: set[NodeID]) -> str:
    """Why the object a lineage record (or none) made cannot be made again, or ``""``
    (``dead``: the nodes known dead)."""
    if record is None:
        return ("it was made by put() (objects made by put are not rebuilt, as in Ray: keep "
                "a copy elsewhere, or make it in a task)")
    if record.spec.actor_id:
        return "it was returned by an actor call (results of actor calls are not rebuilt)"
    if record.has_contained:
        return "its task's arguments hold refs nested in values, which are not kept"
    if 0 <= record.max_retries <= record.spec.attempt:
        return (f"its task {record.spec.name!r} has used its max_retries="
                f"{record.max_retries}")
    pinned = parse_affinity(record.key[-1]) if record.key else None
    if pinned is not None and not pinned[1] and pinned[0] in dead:
        return (f"its task {record.spec.name!r} must run on node {pinned[0].hex()} "
                f"(NodeAffinitySchedulingStrategy, soft=False), which is dead")
    return ""


def _cancel_wins(record: TaskRecord, msg: m.TaskResult) -> bool:
    """Whether a cancelled task's result gives way to TaskCancelledError: always, but for
    an actor call that ended in an error while cancelled (an async method's
    CancelledError, let out: a TaskError, as in Ray)."""
    if msg.cancelled or not record.spec.actor_id:
        return True
    return not msg.returns or not msg.returns[0].is_error


def _error_of(ret: m.ReturnObject) -> BaseException | None:
    """The error a failed task returned (errors always travel inline), if it unpickles."""
    try:
        value = from_payload(ret.value) if ret.value is not None else None
    except Exception:
        return None
    return value.error if isinstance(value, StoredError) else None


def resolved_arg(ref: ObjectRef, entry: Entry | None, node_id: NodeID) -> m.TaskArg:
    """An argument for a ready owned ref: its inline value, or its id (and node) to read."""
    if isinstance(entry, m.Payload):
        return m.TaskArg(value=entry)
    return m.TaskArg(object_id=ref.id, node_id=node_id)
