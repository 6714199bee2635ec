"""The caller side of actor calls: one ordered channel per actor, and actors' lives.

    handle.m.remote() -> ActorCaller.call --(address from the head, once)--> PushTask to
                         the actor's worker (connected, nothing ahead of it: sent at once,
                         past the queue; pipelined calls to a one-at-a-time actor: written
                         in batches)
    TaskResults of one read -> TaskEvents.complete_tasks (the owner)
    connection lost -> in-flight calls retried (max_task_retries) or ActorDiedError;
                       the next call asks the head again (it answers after a restart, or DEAD)
    last handle gone, anywhere, and the calls made through them answered (unnamed, not
    detached) -> its life object is freed -> KillActor (ActorLives)

Calls from one caller travel over one connection, so the actor sees them in order.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from rtml.core.links import ClientLinks
from rtml.core.object_ref import ObjectRef
from rtml.core.tasks import TaskEvents, TaskRecord
from rtml.exceptions import ActorDiedError, ActorUnavailableError, RtmlSystemError
from rtml.ids import NO_NODE, ActorID, NodeID, ObjectID, TaskID
from rtml.rpc import messages as m
from rtml.rpc.reactor import Connection

log = logging.getLogger(__name__)

HOLD_AFTER = 4
"""Our unfinished calls on a one-at-a-time actor from which new calls are held."""
HOLD_MAX = 8
"""Held calls written together (one write and one wake-up of the actor per batch)."""


class ActorCaller:
    """This process's ordered channel to one actor."""

    def __init__(self, links: ClientLinks, events: TaskEvents, actor_id: ActorID,
                 max_task_retries: int) -> None:
        self.links = links
        self.events = events
        self.actor_id = actor_id
        self.max_task_retries = max_task_retries
        self.conn: Connection | None = None
        self.resolving = False
        self.queue: deque[TaskRecord] = deque()
        self.inflight: dict[TaskID, TaskRecord] = {}
        self.dead_error = ""
        self.address = ""
        self.last_address = ""
        self.node_id = NO_NODE
        self.keep_alive: list[Any] = []
        self.created: m.ActorSpec | None = None  # this process created it: its spec
        self.sequential = False  # runs one call at a time: not threaded, not async
        self.restartable = False  # its spec allows restarts (as last resolved)
        self.lost: list[tuple[TaskRecord, str]] = []  # in flight when its process died, no
        # retries left: failed once we know whether it came back (ActorUnavailableError)
        self.held: list[m.PushTask] = []  # calls in flight but not yet written (see flush)

    def call(self, record: TaskRecord) -> Connection | None:
        """Take a call (under the runtime lock): queue it and push what can go, or, if
        nothing is ahead of it, return the connection to send it on at once, after the
        lock. (Unordered with another thread's call meanwhile, as concurrent calls are;
        after every call whose ``remote()`` returned before it, as each was sent by then
        or is ahead of it in the queue.)"""
        if self.dead_error:
            self.links.reactor.call_soon(self._fail, record)
            return None
        conn = self.conn
        if (conn is not None and not record.deps and not self.queue and not self.held
                and not (self.sequential and len(self.inflight) >= HOLD_AFTER)):
            self.inflight[record.spec.task_id] = record
            return conn
        self.queue.append(record)
        self.flush()
        return None

    def flush(self) -> None:
        """Send the ready calls at the head of the queue (under the runtime lock).

        A one-at-a-time actor with ``HOLD_AFTER`` of our calls unfinished cannot start a
        new one before those end, so new calls are held here and written together: with
        the call after the ``HOLD_MAX``-th held, or when the next results come in (some
        are due). Pipelined calls then cost a write (and an actor wake-up) per batch,
        not per call.
        """
        queue = self.queue
        if self.conn is None:
            if queue and not self.resolving:
                self._resolve()
            return
        while queue and (queue[0].done or queue[0].deps == 0):
            record = queue.popleft()
            if record.done:  # failed by a dependency or cancelled while queued
                continue
            inflight = self.inflight
            inflight[record.spec.task_id] = record
            msg = m.PushTask(record.spec)
            if (self.sequential and len(inflight) > HOLD_AFTER
                    and len(self.held) < HOLD_MAX):
                self.held.append(msg)
                continue
            if self.held:
                self._send_held()
            self.links.send_ordered(self.conn, msg)

    def _send_held(self) -> None:
        """Write the held calls, in order (under the runtime lock)."""
        if self.held and self.conn is not None:
            held, self.held = self.held, []
            for msg in held:
                self.links.send_ordered(self.conn, msg)

    def ended(self, why: str) -> None:
        """The actor is gone for good (under the runtime lock): later calls fail at once,
        and no restart will read its constructor's arguments."""
        self.dead_error = why
        self.keep_alive = []
        self.created = None

    def cancel_queued(self, record: TaskRecord) -> bool:
        """Drop a call not yet sent (under the runtime lock), letting the calls queued
        behind it go; True if it was still queued here. One already sent is cancelled at
        the actor: skipped if it has not started, interrupted if it is an async method
        running (as Ray)."""
        if record in self.queue:
            self.queue.remove(record)
            self.flush()
            return True
        if self.conn is not None:
            self.links.send_ordered(self.conn, m.CancelCall(record.spec.task_id))
        return False

    def _resolve(self) -> None:
        self.resolving = True
        actor_id, stale = self.actor_id, self.last_address
        try:
            self.links.ask(self.links.head, lambda req_id: m.GetActorInfo(
                req_id, actor_id, wait_ready=True, stale_address=stale), self._on_info)
        except RtmlSystemError as exc:  # the head is gone for good
            self.links.reactor.call_soon(self._on_info, exc)

    def _on_info(self, info: m.ActorInfo | RtmlSystemError) -> None:
        """Where the actor is (or that it is DEAD); an error if the head did not come back
        after a restart."""
        if isinstance(info, RtmlSystemError):
            self._unreachable(str(info))
            return
        if info.state == "ALIVE":
            local = info.node_id in (b"", self.links.node_id)
            address = info.address if local else info.tcp_address
            try:
                conn = self.links.connect_worker(address, self._on_results, self._on_closed)
            except Exception as exc:
                log.info("actor %s unreachable at %s: %s", self.actor_id.hex(), address, exc)
                self.last_address = info.address
                with self.links.lock:
                    self._resolve()
                return
            with self.links.lock:
                self.resolving = False
                self.conn, self.address, self.node_id = conn, info.address, info.node_id
                self.sequential = (info.spec is not None and info.spec.max_concurrency == 1
                                   and not info.spec.is_async
                                   and not info.spec.concurrency_groups)
                self.restartable = info.spec is not None and info.spec.max_restarts != 0
                lost, self.lost = self.lost, []
                self.flush()
            for record, reason in lost:  # it came back: those calls may or may not have run
                self.events.fail_task(record, ActorUnavailableError(
                    f"actor call {record.spec.name!r} was lost: the actor "
                    f"{self.actor_id.hex()[:12]}'s process died while it ran ({reason}) and "
                    f"the actor was restarted; the call may or may not have run. Give the "
                    f"method max_task_retries to retry it"))
            return
        self._unreachable(info.error or f"the actor is {info.state}")

    def _unreachable(self, why: str) -> None:
        """The actor cannot be reached, ever: the calls queued for it fail."""
        with self.links.lock:
            self.resolving = False
            self.ended(why)
            failed = list(self.queue)
            self.queue.clear()
            lost, self.lost = self.lost, []
        for record in failed:
            self._fail(record)
        for record, reason in lost:
            self._fail(record, f"the actor's process died while running this call ({reason}), "
                               f"and the actor did not come back: {why}")

    def _on_results(self, conn: Connection, msgs: list[Any]) -> None:
        """The results of one read from the actor's connection."""
        done: list[tuple[TaskRecord, m.TaskResult]] = []
        items: list[m.GeneratorItem] = []
        inflight = self.inflight
        retried = False
        with self.links.lock:
            for msg in msgs:
                if type(msg) is m.GeneratorItem:  # a generator method's, still running
                    items.append(msg)
                    continue
                record = inflight.pop(msg.task_id, None) if isinstance(msg, m.TaskResult) else None
                if record is None:
                    continue
                if record.retry_exceptions and self.events.should_retry_exception(record,
                                                                                    msg):
                    record.spec.attempt += 1  # (retry_exceptions: the method raised)
                    self.queue.append(record)
                    retried = True
                else:
                    done.append((record, msg))
            if self.held:  # calls ended: the held ones can start
                self._send_held()
            if retried:
                self.flush()
        if items:
            self.events.generated(items, self.node_id or self.links.node_id)
        if done:
            self.events.complete_tasks(done)

    def _on_closed(self, conn: Connection, reason: str) -> None:
        failed: list[TaskRecord] = []
        with self.links.lock:
            self.conn = None
            self.held.clear()  # in flight, so retried or failed below
            self.last_address = self.address
            retry = []
            for record in self.inflight.values():  # each call's own max_task_retries
                if record.spec.attempt < record.max_retries or record.max_retries < 0:
                    record.spec.attempt += 1
                    retry.append(record)
                else:
                    failed.append(record)
            self.inflight.clear()
            self.queue.extendleft(reversed(retry))
            if self.restartable and failed:
                self.lost += [(record, reason) for record in failed]
                failed = []
                if not self.queue and not self.resolving:
                    self._resolve()  # to learn whether it restarts
            self.flush()
        for record in failed:
            self._fail(record, f"the actor's process died while running this call ({reason})")

    def _fail(self, record: TaskRecord, why: str = "") -> None:
        name = record.spec.name
        text = why or self.dead_error
        self.events.fail_task(record, ActorDiedError(
            f"actor call {name!r} failed: the actor {self.actor_id.hex()[:12]} is dead: {text}"))

    def node_died(self, node_id: NodeID) -> None:
        """The actor's node is gone: drop the connection (its calls retry or fail)."""
        conn = self.conn
        if conn is not None and self.node_id == node_id:
            conn.close(f"its node {node_id.hex()} died")

    def shutdown(self) -> None:
        if self.conn is not None:
            self.conn.on_close = None
            self.conn.close("shutdown")


class ActorLives:
    """The life objects of the actors this process created (unnamed, not detached).

    An actor's life is a tiny object its creator owns. Every handle to the actor, in any
    process, holds a ref to it, and so does each call in flight through a handle. Those
    refs are counted as any other (borrowers, refs inside arguments, results and put
    values), so the object is freed once the last handle anywhere is gone and the calls
    made through them are answered; the actor then ends, as in Ray::

        never pickled: freed by its owner, here ---------------------------> KillActor
        pickled: promoted to shared memory; its node manager frees it when
                 the last hold (owner, borrowers, containers) is released ---> KillActor

    A handle pickled outside a value (into a function's closure, say) is held by nothing
    that would let go of it: its actor is kept to the job's end (:meth:`pin`).
    """

    def __init__(self, links: ClientLinks, events: TaskEvents) -> None:
        self.links = links
        self.events = events
        self.actors: dict[ObjectID, ActorID] = {}  # life object -> its actor
        self._pinned: dict[ObjectID, ObjectRef] = {}

    def add(self, life: ObjectRef, actor_id: ActorID) -> None:
        """``life``, a new object owned here, is ``actor_id``'s life: its ref goes into
        the actor's handles."""
        with self.links.lock:
            self.actors[life.id] = actor_id

    def pin(self, life: ObjectRef) -> None:
        with self.links.lock:
            self._pinned[life.id] = life

    def freed(self, object_id: ObjectID, promoted: bool) -> None:
        """Its owner let go of life object ``object_id`` (under the runtime lock). Never
        promoted, it is gone: its actor ends now; else its node manager ends it."""
        actor_id = self.actors.pop(object_id, None)
        if actor_id is not None and not promoted:
            self.links.head.send(m.KillActor(actor_id, no_restart=True, reason=m.OUT_OF_SCOPE))
            self.events.actor_ended(actor_id, m.OUT_OF_SCOPE)
