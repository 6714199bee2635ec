"""Reference counts of one process's ObjectRefs, and its holds on shared objects.

    ObjectRef() / __del__ / unpickle --> incref / decref / borrowed --> refops deque
        (any thread; __del__ may run while its thread holds a lock, so only append)
    refops deque --> process_refops (API calls; the reactor after REFOPS_BATCH ops
                     or REFOPS_DELAY idle)
        first borrow of a foreign object ---------------> AddHolds     --> node manager
        count 0: owned value in shm, or a borrowed one -> ReleaseHolds --> node manager
        count 0: owned value holding refs inside it ----> ReleaseHolder --> node manager
        count 0: owned inline value --------------------> dropped from the memory store
    pickling an owned ref (escaped) --> its inline value is promoted to shared memory

Holds are grouped by the node holding each object's primary copy (``locations``);
the local node manager forwards those for other nodes.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rtml.core.actor_caller import ActorLives
from rtml.core.links import ClientLinks
from rtml.core.memory_store import IN_STORE, MemoryStore
from rtml.core.shared_objects import SharedObjects
from rtml.core.tasks import TaskEvents
from rtml.exceptions import GetTimeoutError
from rtml.ids import NO_ACTOR, NO_NODE, ClientID, NodeID, ObjectID
from rtml.rpc import messages as m

if TYPE_CHECKING:
    from rtml.core.object_ref import ObjectRef

log = logging.getLogger(__name__)

REFOPS_BATCH = 64
"""Reference-count changes queued before the I/O thread is woken to apply them."""
REFOPS_DELAY = 0.02
"""Seconds within which a dropped reference is applied even if the process goes idle."""


class ReferenceCounter:
    """The counter :func:`rtml.core.object_ref.set_counter` is given: counts, holds, frees."""

    def __init__(self, links: ClientLinks, store: MemoryStore, shared: SharedObjects,
                 events: TaskEvents, lives: ActorLives) -> None:
        """``events``: the owner of this process's tasks (which of their returns are
        still being made); ``lives``: the life objects of the actors it created."""
        self.links = links
        self.store = store
        self.shared = shared
        self.events = events
        self.lives = lives
        self.refops: deque[tuple[ObjectID, int]] = deque()
        """Queued (object id, delta) changes; delta 0 marks a borrow."""
        self.borrows = 0
        """Borrows queued so far: a reader that unpickled refs drains them before it lets
        go of their container (see :meth:`borrowed`)."""
        self._refops_scheduled = False
        self._refops_timer = False
        self._ref_lock = threading.Lock()
        self._counts: dict[ObjectID, int] = {}
        self._borrowed: set[ObjectID] = set()
        self.escaped_pending: set[ObjectID] = set()
        """Owned objects pickled before their value existed: promoted once it is set."""
        self.locations: dict[ObjectID, NodeID] = {}  # object -> its primary node, if not ours
        self._unfenced: set[NodeID] = set()  # other nodes our node manager forwarded holds to
        self._unfenced_lock = threading.Lock()  # a leaf lock: taken with nothing else after it
        self._fence_lock = threading.Lock()  # one fence at a time: it covers all sent before

    # -- ObjectRef hooks -----------------------------------------------------------------------

    def incref(self, object_id: ObjectID, owner: ClientID) -> None:
        self.refops.append((object_id, 1))

    def decref(self, object_id: ObjectID, owner: ClientID) -> None:
        # Runs inside __del__, possibly while this thread holds a lock: only append.
        self._queue(object_id, -1)

    def _queue(self, object_id: ObjectID, delta: int) -> None:
        """Queue a change; API calls drain the queue, the reactor only when it grows long
        or sits idle."""
        self.refops.append((object_id, delta))
        if len(self.refops) >= REFOPS_BATCH and not self._refops_scheduled:
            self._refops_scheduled = True
            self.links.reactor.call_soon(self.process_refops)
        elif not self._refops_timer:  # an idle process still frees within REFOPS_DELAY
            self._refops_timer = True
            self.links.reactor.call_later(REFOPS_DELAY, self._refops_tick)

    def _refops_tick(self) -> None:
        self._refops_timer = False
        self.process_refops()

    def borrowed(self, ref: ObjectRef, node_id: NodeID) -> None:
        """An ObjectRef was unpickled here: hold its object while we reference it.

        ``node_id``: where its primary copy lives (a hint carried with the ref).
        """
        links = self.links
        if node_id and node_id != links.node_id and ref.owner != links.client_id:
            self.locations.setdefault(ref.id, node_id)
        # Queued, not sent at once: whatever unpickled the ref (a get, a task's argument)
        # still holds its container, and drains the queue before letting go of it.
        self.borrows += 1
        self._queue(ref.id, 0)

    def location_of(self, object_id: ObjectID) -> NodeID:
        """The node holding the object's primary copy, as far as this process knows."""
        return self.locations.get(object_id, self.links.node_id)

    def escaped(self, ref: ObjectRef) -> None:
        """An owned ref is being pickled for another process: its value must be shared."""
        links, store = self.links, self.store
        if ref.owner != links.client_id:
            return
        with links.lock:
            entry = store.get(ref.id)
            if entry is None:
                self.escaped_pending.add(ref.id)
            elif isinstance(entry, m.Payload) and ref.id not in store.promoted:
                self.promote(ref.id, entry)

    def promote(self, object_id: ObjectID, payload: m.Payload) -> None:
        """(Under the lock.) Copy an owned inline value into shared memory, so other
        processes can read it; it is released as a shared object once freed."""
        if self.shared.promote(object_id, payload, self.lives.actors.get(object_id, NO_ACTOR),
                               self.store.has_contained.get(object_id, NO_NODE)):
            self.store.promoted.add(object_id)

    # -- holds and releases --------------------------------------------------------------------

    def send_holds(self, kind: type[m.AddHolds] | type[m.ReleaseHolds],
                   object_ids: Sequence[ObjectID], holder: bytes) -> None:
        """Add or release holds through the local node manager, grouped by primary node."""
        by_node: dict[NodeID, list[ObjectID]] = {}
        locations = self.locations
        for object_id in object_ids:
            by_node.setdefault(locations.get(object_id, NO_NODE), []).append(object_id)
        for node_id, ids in by_node.items():
            self.links.nm.send(kind(ids, holder, node_id))
            if kind is m.AddHolds and node_id and node_id != self.links.node_id:
                with self._unfenced_lock:  # after the send: a fence taking it follows it
                    self._unfenced.add(node_id)

    def settle(self) -> None:
        """Send the holds for every reference change made so far, and block until those
        on other nodes' objects are in place there.

        A worker calls it before sending a result: the owner then releases what the task
        held for its arguments, and that release (owner -> the object's node) must not
        overtake a hold the task's code added through this node's manager. Another
        thread may be applying changes, or fencing holds, that include this task's:
        both are waited for (under their locks), so the guarantee holds per task.
        """
        if self.refops or self._ref_lock.locked():  # (changes are sent under the lock)
            self.drain()
        if self.needs_fence():
            self.fence()

    def drain(self) -> None:
        """Apply every change queued so far, waiting for a drain under way elsewhere."""
        with self._ref_lock:  # a drain under way on another thread sends its holds first
            pass
        if self.refops:
            self.process_refops()

    def fence(self) -> None:
        """Block until the holds sent so far on other nodes' objects are in place there."""
        with self._fence_lock:  # (a fence under way may cover holds sent before ours)
            with self._unfenced_lock:
                nodes = list(self._unfenced)
                self._unfenced.clear()
            if not nodes:
                return  # a fence that finished meanwhile covered ours
            try:
                self.links.request(self.links.nm, lambda req_id: m.FenceHolds(req_id, nodes))
            except GetTimeoutError:
                log.warning("holds on objects of nodes %s not confirmed in time",
                            [node_id.hex()[:12] for node_id in nodes])

    def needs_fence(self) -> bool:
        """Whether :meth:`fence` would block: holds on other nodes' objects unconfirmed,
        or a fence under way (which may cover holds sent before ours)."""
        return bool(self._unfenced) or self._fence_lock.locked()

    def process_refops(self) -> None:
        """Apply queued reference-count changes; send holds and releases."""
        self._refops_scheduled = False
        if not self.refops:
            return
        releases: list[ObjectID] = []
        holders: list[tuple[ObjectID, NodeID]] = []
        # Borrowed objects whose hold changed in this batch -> held before it. Only the net
        # change is sent: a release and a re-borrow of one object in one batch (as sent,
        # add then release) would otherwise drop a hold still needed.
        touched: dict[ObjectID, bool] = {}
        borrowed = self._borrowed
        unreferenced: list[ObjectID] = []
        with self._ref_lock:
            ops = self.refops
            while ops:
                object_id, delta = ops.popleft()
                if delta == 0:
                    if object_id not in borrowed and not self._owns(object_id):
                        touched.setdefault(object_id, False)
                        borrowed.add(object_id)
                    continue
                count = self._counts.get(object_id, 0) + delta
                if count > 0:
                    self._counts[object_id] = count
                    continue
                self._counts.pop(object_id, None)
                if object_id in borrowed:
                    touched.setdefault(object_id, True)
                    borrowed.discard(object_id)
                else:
                    unreferenced.append(object_id)
            if unreferenced:
                self._free(unreferenced, releases, holders)
            adds = [oid for oid, held in touched.items() if not held and oid in borrowed]
            releases += [oid for oid, held in touched.items() if held and oid not in borrowed]
            # Sent under the lock: another thread's add and release of the same
            # object must reach the node manager in the order they were decided.
            if adds:
                self.send_holds(m.AddHolds, adds, self.links.client_id)
            self._send_releases(releases, holders)

    def free_unreferenced(self, object_ids: Sequence[ObjectID]) -> None:
        """Free results whose refs were all dropped before the task finished."""
        counts = self._counts
        for object_id in object_ids:
            if object_id not in counts:
                break
        else:
            return  # the usual case: the caller still holds them
        releases: list[ObjectID] = []
        holders: list[tuple[ObjectID, NodeID]] = []
        with self._ref_lock:
            self._free([oid for oid in object_ids if oid not in self._counts], releases, holders)
            self._send_releases(releases, holders)

    def _send_releases(self, releases: list[ObjectID],
                       holders: list[tuple[ObjectID, NodeID]]) -> None:
        if releases:
            self.send_holds(m.ReleaseHolds, releases, self.links.client_id)
            for object_id in releases:
                self.locations.pop(object_id, None)
        for holder, node_id in holders:
            self.links.nm.send(m.ReleaseHolder(holder, node_id))

    def _owns(self, object_id: ObjectID) -> bool:
        return object_id in self.store.entries or self.events.making(object_id)

    def _free(self, object_ids: list[ObjectID], releases: list[ObjectID],
              holders: list[tuple[ObjectID, NodeID]]) -> None:
        """Drop owned objects nobody references any more. One that escaped before its
        value existed is kept until the value arrives: promoted then (see
        :meth:`TaskOwner.set_entries`), it is freed when its task is settled."""
        store, events = self.store, self.events
        escaped = self.escaped_pending
        lives = self.lives
        with self.links.lock:
            for object_id in object_ids:
                if object_id in escaped and events.making(object_id):
                    continue
                promoted = object_id in store.promoted
                entry = store.pop(object_id)
                escaped.discard(object_id)
                if object_id in lives.actors:
                    lives.freed(object_id, promoted)
                holds_at = store.has_contained.pop(object_id, None)
                if entry is IN_STORE or promoted:
                    releases.append(object_id)  # its node manager releases what it holds
                    events.forget_lineage(object_id)
                elif holds_at is not None:
                    holders.append((object_id, holds_at))
