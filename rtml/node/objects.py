"""The object manager of one node: the store core's asyncio shell, and objects of other nodes.

    clients --CreateObject--> room reserved (others spilled first), or a wait for it, or
              ObjectCreated(error): the store is full, or spilling failed (out of disk)
    clients --SealObject/AddHolds/ReleaseHolds/WaitObject--> ObjectManager
        objects whose primary copy is here -> StoreCore -> Spill/Restore/Delete, Notify*
        objects whose primary is on node A -> RemoteHolds -> AddHolds/ReleaseHolds
                                              (holder = this node) --TCP--> A's manager
    WaitObject for an object on node A --> one pull per object (gRPC, in a thread)
        --> segment in this node's store directory --> sealed here as a copy, held by COPY
        --> waiters woken; readers map it zero-copy
    TransferServer (gRPC threads) <-- other nodes pull our objects; each is remembered
    primary deleted here --> ObjectsFreed --> the nodes with copies drop them
    seal/spill/restore/copy/delete --> ObjectTableBatch --each heartbeat--> control plane

The transfer server starts in a thread once a second node exists (importing
gRPC takes ~0.1 s of CPU, which a single-node ``rtml.init()`` should not pay);
its address reaches the other nodes through the head's node table.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rtml.config import STORE_FULL_TIMEOUT
from rtml.control_plane import ControlPlane, location_field
from rtml.exceptions import ObjectLostError, RtmlSystemError
from rtml.ids import NO_CLIENT, NO_NODE, NO_OBJECT, ActorID, ClientID, NodeID, ObjectID
from rtml.node.links import NodeLinks
from rtml.node.metrics import NodeMetrics
from rtml.objectstore import private, segment
from rtml.objectstore.remote import RemoteHolds
from rtml.objectstore.store import Delete, NotifyLost, NotifyReady, Restore, Spill, StoreCore
from rtml.rpc import messages as m

log = logging.getLogger(__name__)

COPY = b"copy"
"""The holder of a copy pulled from another node, until that node frees the object."""

MAX_ASKS = 3
"""Times one wait asks where an object is after pulls found nothing (a ref names its owner's
node; that node may name another, which has it)."""

LOST_KEPT = 65_536
"""Objects remembered as lost with their node (oldest forgotten first)."""

GONE_CLIENTS_KEPT = 10_000
"""Disconnected client ids remembered, so late seals on their behalf hold nothing."""


@dataclass(eq=False)
class _Creation:
    """A client waiting for room to create an object (see :meth:`ObjectManager.create`)."""

    peer: Any
    req_id: int
    object_id: ObjectID
    size: int
    creator: ClientID
    timer: asyncio.TimerHandle | None = None


class ObjectTableBatch:
    """Object-table changes waiting for the next flush to the control plane.

    Sans-I/O: the manager notes seals, copies, state changes and deletes as they
    happen (a dict update each) and drains a batch once per heartbeat tick.
    ``recorded`` is every id written or about to be written, so a state change
    of an object that was deleted meanwhile cannot resurrect a partial record.
    """

    def __init__(self, node_id: NodeID) -> None:
        self.node_id = node_id
        self.here = location_field(node_id)
        self.puts: dict[ObjectID, dict[str, Any]] = {}
        self.removes: set[ObjectID] = set()
        self.dropped: set[ObjectID] = set()  # copies dropped here (the record may live on)
        self.recorded: set[ObjectID] = set()

    def sealed(self, object_id: ObjectID, size: int, owner: bytes) -> None:
        """A new object was sealed here; ``owner`` is its first holder (a hint)."""
        self.removes.discard(object_id)
        self.recorded.add(object_id)
        self.puts[object_id] = {"node_id": self.node_id, self.here: "SEALED", "size": size,
                                "state": "SEALED", "owner": owner}

    def copied(self, object_id: ObjectID) -> None:
        """A copy of another node's object now lives here too."""
        self.dropped.discard(object_id)
        self.recorded.add(object_id)
        self.puts[object_id] = {self.here: "SEALED"}

    def adopted(self, object_id: ObjectID) -> None:
        """The copy here is the object's primary now: its primary node died."""
        self.dropped.discard(object_id)
        self.recorded.add(object_id)
        info = self.puts.setdefault(object_id, {})
        info.update({"node_id": self.node_id, self.here: "SEALED", "state": "SEALED"})

    def state_changed(self, object_id: ObjectID, state: str, primary: bool) -> None:
        """The object moved between shared memory (SEALED) and disk (SPILLED)."""
        if object_id in self.recorded:
            info = self.puts.setdefault(object_id, {})
            info[self.here] = state
            if primary:
                info["state"] = state

    def deleted(self, object_id: ObjectID, primary: bool) -> None:
        if object_id in self.recorded:
            self.recorded.discard(object_id)
            self.puts.pop(object_id, None)
            (self.removes if primary else self.dropped).add(object_id)

    def drain(self) -> tuple[dict[ObjectID, dict[str, Any]], list[ObjectID],
                             dict[ObjectID, list[str]]]:
        """The pending (puts, removes, dropped location fields), now owned by the caller."""
        puts, removes = self.puts, list(self.removes)
        drops = {object_id: [self.here] for object_id in self.dropped}
        self.puts, self.removes, self.dropped = {}, set(), set()
        return puts, removes, drops

    def requeue(self, puts: dict[ObjectID, dict[str, Any]], removes: list[ObjectID],
                drops: dict[ObjectID, list[str]]) -> None:
        """Put back a batch whose write failed, under any newer change."""
        for object_id, info in puts.items():
            if object_id in self.recorded:
                self.puts[object_id] = {**info, **self.puts.get(object_id, {})}
        for object_id in removes:
            if object_id not in self.recorded:
                self.removes.add(object_id)
        self.dropped.update(oid for oid in drops if oid not in self.recorded)


class ObjectManager:
    """This node's objects: the store core, remote holds, pulls, copies and the table."""

    def __init__(self, node_id: NodeID, store_dir: str, spill_dir: str, capacity: int,
                 token: str, links: NodeLinks, end_actor: Callable[[ActorID], None],
                 metrics: NodeMetrics | None = None, tls_cert: str = "",
                 tls_key: str = "") -> None:
        """``tls_cert``/``tls_key``: the node's TLS files (its transfer server shows the
        certificate, and pulls trust each holder's own, as the head lists it)."""
        self.node_id = node_id
        self.metrics = metrics or NodeMetrics(enabled=False)
        self.tls_files = (tls_cert, tls_key)
        self.end_actor = end_actor  # an actor's life object was freed here: it ends
        self.lives: dict[ObjectID, ActorID] = {}  # life object -> its actor
        self.holds_at: dict[ObjectID, NodeID] = {}  # our object -> the node holding its refs
        self.store_dir = store_dir
        self.spill_dir = spill_dir
        self.token = token
        self.links = links
        self.store = StoreCore(capacity)
        self.remote = RemoteHolds()
        self.table = ObjectTableBatch(node_id)
        self.waiters: dict[int, tuple[Any, int]] = {}
        self._waiter_ids = 0
        self._collect_scheduled = False
        self.gone_clients: dict[ClientID, None] = {}  # insertion-ordered, bounded
        self.transfer_addresses: dict[NodeID, str] = {}
        self.transfer_certs: dict[NodeID, bytes] = {}  # a TLS cluster's nodes' certificates
        self.dead_nodes: set[NodeID] = set()
        self.pulls: dict[ObjectID, NodeID] = {}  # object id -> node pulled from
        self.unlocated: set[ObjectID] = set()  # awaited here, location unknown: ask the table
        self.pulls_started = 0
        self.awaiting_address: dict[NodeID, set[ObjectID]] = {}  # node -> objects to pull
        self.copies: dict[ObjectID, set[NodeID]] = {}  # our object -> nodes holding a copy
        self.copy_of: dict[ObjectID, NodeID] = {}  # our copy -> its primary node
        self.local_clients: set[ClientID] = set()  # drivers and workers of this node
        self.awaited: dict[ObjectID, ClientID] = {}  # awaited here before it exists -> its owner
        self.locating: dict[ObjectID, list[tuple[Any, int]]] = {}  # object -> nodes asking where
        self.owners: dict[ObjectID, tuple[ClientID, int]] = {}  # pulled -> (owner, asks so far)
        # object -> (node asked, owner, asks so far)
        self.asked: dict[ObjectID, tuple[NodeID, ClientID, int]] = {}
        self._locate_ids = 0
        self.lost: OrderedDict[ObjectID, str] = OrderedDict()  # gone (its node died, a restore
        #                                                  failed), asked for later: why
        self.creating: list[_Creation] = []  # waiting for room, oldest first
        self.spill_error = ""  # why the last spill failed, while making room
        self.background: set[asyncio.Future[Any]] = set()
        self.transfer: Any = None
        self.loop = asyncio.get_running_loop()

    # -- client events -------------------------------------------------------------------------

    def create(self, peer: Any, creator: ClientID, msg: m.CreateObject) -> None:
        """Room for an object ``creator`` is about to write here: made by spilling others
        if need be, else waited for (objects freed meanwhile) up to STORE_FULL_TIMEOUT s.
        Answered either way; a spill that fails answers at once, out of disk."""
        capacity = self.store.capacity
        if msg.size > capacity:
            peer.send(m.ObjectCreated(msg.req_id, (
                f"an object of {msg.size} bytes does not fit in the object store of node "
                f"{self.node_id.hex()} ({capacity} bytes); give the node a larger "
                f"object_store_memory")))
            return
        creation = _Creation(peer, msg.req_id, msg.object_id, msg.size, creator)
        if not self._try_create(creation):
            self.creating.append(creation)
            creation.timer = self.loop.call_later(STORE_FULL_TIMEOUT, self._expired, creation)

    def _try_create(self, creation: _Creation) -> bool:
        """Reserve room, making it if need be; True once the creator has been answered.
        Short of room, the objects released this loop turn are collected first (at its
        end: a hold arriving in the same turn still wins), and their room counts before
        anything is spilled."""
        store = self.store
        if not store.reserve(creation.object_id, creation.size, creation.creator):
            if store.has_candidates():
                self.schedule_collect()
                return False
            self.spill_error = ""
            self.execute(store.make_room(creation.size))
            if not store.reserve(creation.object_id, creation.size, creation.creator):
                if not self.spill_error:
                    return False
                creation.peer.send(m.ObjectCreated(
                    creation.req_id, f"{self._full(creation.size)}, and {self.spill_error}; "
                    f"the objects that could not be spilled stay in memory", out_of_disk=True))
                return True
        creation.peer.send(m.ObjectCreated(creation.req_id, free=store.free_bytes))
        return True

    def _retry_creations(self) -> None:
        """Room may have been freed: answer the creations waiting for it, in order."""
        waiting, self.creating = self.creating, []
        for creation in waiting:
            if self._try_create(creation):
                if creation.timer is not None:
                    creation.timer.cancel()
            else:
                self.creating.append(creation)

    def _expired(self, creation: _Creation) -> None:
        if creation in self.creating:
            self.creating.remove(creation)
            creation.peer.send(m.ObjectCreated(creation.req_id, (
                f"{self._full(creation.size)} for {STORE_FULL_TIMEOUT:g} s (nothing more "
                f"could be spilled); drop refs to objects no longer needed, or give the "
                f"node a larger object_store_memory")))

    def _full(self, size: int) -> str:
        stats = self.store.stats()
        return (f"the object store of node {self.node_id.hex()} has no room for {size} "
                f"bytes: {stats['used_bytes']} of {stats['capacity']} used by live objects")

    def seal(self, msg: m.SealObject) -> None:
        new = not self.store.contains(msg.object_id)
        # A result sealed for an owner that already left is held by nobody: freed at once.
        holder = b"" if msg.holder in self.gone_clients else msg.holder
        if msg.actor_id:
            self.lives[msg.object_id] = msg.actor_id
        if msg.holds_at and msg.holds_at != self.node_id:
            self.holds_at[msg.object_id] = msg.holds_at
        commands = self.store.seal(msg.object_id, msg.size, holder)
        if new:
            self.lost.pop(msg.object_id, None)  # rebuilt by its owner
            self.table.sealed(msg.object_id, msg.size, msg.holder)
            self._located(msg.object_id, self.node_id)
        self.execute(commands)
        if self.creating:  # its room was reserved: it can be spilled now, to make more
            self._retry_creations()

    def add_holds(self, msg: m.AddHolds) -> None:
        """Hold objects for ``msg.holder``: here, or through the node holding their primary
        copy. Learning that an object's primary is elsewhere moves the holds already made
        here for it there (a ref pickled before its value existed names its owner's node),
        pulls it for those waiting here, and answers the nodes asking where it is."""
        primary = msg.node_id if msg.node_id != self.node_id else NO_NODE
        if not primary:
            here: list[ObjectID] = []
            for object_id in msg.object_ids:
                elsewhere = self._primary_elsewhere(object_id)
                if elsewhere:
                    self._hold_remote([object_id], msg.holder, elsewhere)
                else:
                    here.append(object_id)
            self.execute(self.store.add_holds(here, msg.holder))
            return
        self._hold_remote(msg.object_ids, msg.holder, primary)
        for object_id in msg.object_ids:
            self.lost.pop(object_id, None)  # (rebuilt there by its owner)
            if not self.store.contains(object_id):
                for holder in self.store.take_holds(object_id):
                    self._hold_remote([object_id], holder, primary)
                self._located(object_id, primary)
                if self.store.waiting_on(object_id):
                    self._pull(object_id, primary)

    def _primary_elsewhere(self, object_id: ObjectID) -> NodeID:
        """The node holds on the object go to, if not this one (it is not sealed here, or
        only as a copy, and its primary is known to be there); else ``NO_NODE``."""
        primary = self.remote.primary_of(object_id)
        if primary is None or (self.store.contains(object_id) and object_id not in self.copy_of):
            return NO_NODE
        return primary

    def _hold_remote(self, object_ids: list[ObjectID], holder: bytes, node_id: NodeID) -> None:
        for primary, first in self.remote.add(object_ids, holder, node_id).items():
            self.links.send(primary, m.AddHolds(first, self.node_id))

    def release_holds(self, msg: m.ReleaseHolds) -> None:
        """Drop ``msg.holder``'s holds, wherever they were made (see :meth:`add_holds`)."""
        remote, here = self.remote, msg.object_ids
        held = {oid for oid in here if remote.holds(oid, msg.holder)} if len(remote) else None
        if held:
            self._forward_releases(remote.release(held, msg.holder))
            here = [oid for oid in here if oid not in held]
        self.execute(self.store.release_holds(here, msg.holder))
        self.schedule_collect()

    def release_holder(self, holder: bytes, node_id: NodeID = NO_NODE) -> None:
        """Drop every hold of ``holder``: here, or on ``node_id`` (whose manager holds for
        it: a task's return value, freed by its owner on another node)."""
        if node_id and node_id != self.node_id:
            if node_id not in self.dead_nodes:
                self.links.send(node_id, m.ReleaseHolder(holder))
            return
        self._forward_releases(self.remote.release_holder(holder))
        self.execute(self.store.release_holder(holder))
        self.schedule_collect()

    def fence_holds(self, peer: Any, msg: m.FenceHolds) -> None:
        """Answer ``peer`` once the holds forwarded to ``msg.node_ids`` are in place there:
        sent before this on each node's link, so one fence round trip per node covers them."""
        nodes = [node_id for node_id in msg.node_ids
                 if node_id != self.node_id and node_id not in self.dead_nodes]

        async def answer() -> None:
            await asyncio.gather(*(self.links.fence(node_id) for node_id in nodes))
            peer.send(m.HoldsFenced(msg.req_id))

        self._own(asyncio.ensure_future(answer()))

    def _forward_releases(self, last: dict[NodeID, list[ObjectID]]) -> None:
        for node_id, object_ids in last.items():
            if node_id not in self.dead_nodes:
                self.links.send(node_id, m.ReleaseHolds(object_ids, self.node_id))

    def wait(self, peer: Any, waiters: set[int], msg: m.WaitObject) -> None:
        """Tell ``peer`` when the object can be mapped here, pulling it if it lives elsewhere."""
        self._waiter_ids += 1
        waiter_id = self._waiter_ids
        self.waiters[waiter_id] = (peer, msg.req_id)
        waiters.add(waiter_id)
        object_id = msg.object_id
        self.execute(self.store.wait(object_id, waiter_id))
        if waiter_id not in self.waiters or self.store.contains(object_id):
            return
        primary = self.remote.primary_of(object_id) or msg.node_id
        if primary and primary != self.node_id:
            self._pull(object_id, primary, msg.owner_id)
        elif object_id in self.lost:
            self.execute(self.store.fail_waiters(object_id, self.lost[object_id]))
        elif msg.owner_id in self.local_clients:  # sealed here, or placed elsewhere: told
            self.awaited[object_id] = msg.owner_id
        elif msg.owner_id in self.gone_clients:
            self.execute(self.store.fail_waiters(object_id, _owner_died(msg.owner_id)), True)
        else:
            self.unlocated.add(object_id)

    def client_joined(self, client_id: ClientID) -> None:
        """A driver or worker of this node connected: it may own objects awaited here."""
        self.local_clients.add(client_id)

    def client_gone(self, client_id: ClientID, waiters: set[int]) -> None:
        for waiter_id in waiters:
            self.waiters.pop(waiter_id, None)
            self.store.cancel_waiter(waiter_id)
        unsealed = self.store.unreserve(client_id)
        for creation in [c for c in self.creating if c.creator == client_id]:
            self.creating.remove(creation)
            unsealed.append(creation.object_id)
            if creation.timer is not None:
                creation.timer.cancel()
        for object_id in unsealed:  # written (maybe in part) before its room was granted
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._segment(object_id))
        if self.creating:  # the room it had reserved may be theirs
            self._retry_creations()
        self.gone_clients[client_id] = None
        if len(self.gone_clients) > GONE_CLIENTS_KEPT:
            del self.gone_clients[next(iter(self.gone_clients))]
        self.release_holder(client_id)
        if client_id in self.local_clients:
            self.local_clients.discard(client_id)
            self._owner_gone(client_id)

    def _owner_gone(self, owner: ClientID) -> None:
        """Objects awaited here whose owner just died and that exist nowhere: they never
        will (their waiters, and the nodes asking where they are, get OwnerDiedError)."""
        why = _owner_died(owner)
        for object_id in [oid for oid, o in self.awaited.items() if o == owner]:
            where = self._where(object_id)
            if where:
                self._located(object_id, where)
                continue
            del self.awaited[object_id]
            for peer, req_id in self.locating.pop(object_id, ()):
                peer.send(m.ObjectLocated(req_id, object_id, NO_NODE, why, owner_died=True))
            self.execute(self.store.fail_waiters(object_id, why), True)

    # -- where objects are -------------------------------------------------------------------

    def answer_locate(self, peer: Any, msg: m.LocateObject) -> None:
        """Another node's pull found nothing here: say where the object is, now or once
        its owner (a client of ours) has it made."""
        object_id = msg.object_id
        where = self._where(object_id)
        if where:
            peer.send(m.ObjectLocated(msg.req_id, object_id, where))
        elif object_id in self.lost:
            peer.send(m.ObjectLocated(msg.req_id, object_id, NO_NODE, self.lost[object_id]))
        elif msg.owner_id in self.local_clients:
            self.locating.setdefault(object_id, []).append((peer, msg.req_id))
            self.awaited[object_id] = msg.owner_id
        elif msg.owner_id in self.gone_clients:
            peer.send(m.ObjectLocated(msg.req_id, object_id, NO_NODE, _owner_died(msg.owner_id),
                                      owner_died=True))
        else:
            peer.send(m.ObjectLocated(msg.req_id, object_id, NO_NODE,
                                      f"node {self.node_id.hex()} has no copy"))

    def _where(self, object_id: ObjectID) -> NodeID:
        if self.store.contains(object_id):
            return self.node_id
        return self.remote.primary_of(object_id) or NO_NODE

    def _located(self, object_id: ObjectID, node_id: NodeID) -> None:
        self.awaited.pop(object_id, None)
        for peer, req_id in self.locating.pop(object_id, ()):
            peer.send(m.ObjectLocated(req_id, object_id, node_id))

    def located(self, msg: m.ObjectLocated) -> None:
        """The answer to our question (:meth:`_ask_where`): pull from there, or fail."""
        object_id = msg.object_id
        asked = self.asked.pop(object_id, None)
        if asked is None:
            return
        if msg.error:
            self.execute(self.store.fail_waiters(object_id, msg.error), msg.owner_died)
        elif self.store.waiting_on(object_id) and not self.store.contains(object_id):
            _, owner, asks = asked
            self._pull(object_id, msg.node_id, owner, asks)

    def _ask_where(self, object_id: ObjectID, node_id: NodeID, owner: ClientID, asks: int) -> None:
        self._locate_ids += 1
        self.asked[object_id] = (node_id, owner, asks + 1)
        self.links.send(node_id, m.LocateObject(self._locate_ids, object_id, owner))

    # -- other nodes ---------------------------------------------------------------------------

    def node_table(self, nodes: list[m.NodeEntry]) -> None:
        for entry in nodes:
            self.links.address_known(entry.node_id, entry.address)
            if entry.tls_cert:
                self.transfer_certs[entry.node_id] = entry.tls_cert
            if entry.transfer_address:
                self.transfer_addresses[entry.node_id] = entry.transfer_address
                for object_id in self.awaiting_address.pop(entry.node_id, ()):
                    self._start_pull(object_id, entry.node_id, entry.transfer_address)

    def node_died(self, node_id: NodeID, reason: str) -> list[ObjectID]:
        """Objects whose primary was there are lost, unless a copy of them is here: that copy
        becomes the primary, held by those who held the lost one (their ids are returned);
        its holds on ours are dropped."""
        self.dead_nodes.add(node_id)
        self.links.forget(node_id)
        why = f"its node {node_id.hex()} died ({reason})"
        held = self.remote.node_died(node_id)
        kept = [oid for oid in held if self.copy_of.get(oid) == node_id
                and self.store.contains(oid)]
        for object_id in kept:
            for holder in held.pop(object_id):
                self.execute(self.store.add_holds([object_id], holder))
            self.table.adopted(object_id)
        lost = set(held) | self.awaiting_address.pop(node_id, set())
        lost |= {oid for oid, source in self.pulls.items() if source == node_id}
        lost |= {oid for oid, (asked, _, _) in self.asked.items() if asked == node_id}
        for object_id in lost:
            self.pulls.pop(object_id, None)
            self.asked.pop(object_id, None)
            self.execute(self.store.fail_waiters(object_id, why))
            self.awaited.pop(object_id, None)
            for peer, req_id in self.locating.pop(object_id, ()):
                peer.send(m.ObjectLocated(req_id, object_id, NO_NODE, why))
            self._remember_lost(object_id, why)  # its owner lives on: asked later, we say why
        for holders in self.copies.values():
            holders.discard(node_id)
        orphaned = [oid for oid, primary in self.copy_of.items() if primary == node_id]
        for object_id in orphaned:  # no ObjectsFreed will come: ours live while held here
            del self.copy_of[object_id]
        self.execute(self.store.release_holds(orphaned, COPY))
        self.release_holder(node_id)
        return kept

    def _remember_lost(self, object_id: ObjectID, why: str) -> None:
        self.lost[object_id] = why
        if len(self.lost) > LOST_KEPT:
            self.lost.popitem(last=False)

    def objects_freed(self, object_ids: list[ObjectID]) -> None:
        """The primary node deleted these objects: drop our copies."""
        for object_id in object_ids:
            self.copy_of.pop(object_id, None)
        self.execute(self.store.release_holds(object_ids, COPY))
        self.schedule_collect()

    # -- pulls -----------------------------------------------------------------------------------

    def _pull(self, object_id: ObjectID, node_id: NodeID, owner: ClientID = NO_CLIENT,
              asks: int = 0) -> None:
        """Pull the object from ``node_id``; one not there is asked for there (see
        :meth:`answer_locate`), at most ``MAX_ASKS`` times for one wait."""
        if object_id in self.pulls or object_id in self.asked:
            return  # one transfer (or question) per object, however many wait for it
        if node_id in self.dead_nodes:
            self.execute(self.store.fail_waiters(
                object_id, f"its node {node_id.hex()} is dead"))
            return
        if owner:
            self.owners[object_id] = (owner, asks)
        address = self.transfer_addresses.get(node_id)
        self.pulls[object_id] = node_id
        if address is None:
            self.awaiting_address.setdefault(node_id, set()).add(object_id)
        else:
            self._start_pull(object_id, node_id, address)

    def _start_pull(self, object_id: ObjectID, node_id: NodeID, address: str) -> None:
        from rtml.objectstore import transfer  # imports gRPC: only nodes that pull pay

        self.pulls_started += 1
        path = segment.segment_path(self.store_dir, object_id)
        future = self.loop.run_in_executor(None, functools.partial(
            transfer.pull, address, self.token, object_id, path, self.node_id,
            root_cert=self.transfer_certs.get(node_id, b"")))
        self._own(future)
        started = time.time()
        future.add_done_callback(lambda f: self._pulled(object_id, node_id, f, started))

    def _pulled(self, object_id: ObjectID, node_id: NodeID, future: asyncio.Future[int],
                started: float) -> None:
        if self.pulls.get(object_id) != node_id:
            if not future.cancelled():
                future.exception()  # (retrieved: its failure was expected)
            return  # the source died meanwhile; the waiters were told
        del self.pulls[object_id]
        owner, asks = self.owners.pop(object_id, (NO_CLIENT, 0))
        try:
            size = future.result()
        except ObjectLostError as exc:  # not there (yet): its owner's node knows where
            if owner and asks < MAX_ASKS and self.store.waiting_on(object_id):
                self._ask_where(object_id, node_id, owner, asks)
                return
            log.warning("pulling %s from %s failed: %s", object_id.hex(), node_id.hex(), exc)
            self.metrics.pull_failures += 1
            self.execute(self.store.fail_waiters(object_id, str(exc)))
            return
        except RtmlSystemError as exc:
            log.warning("pulling %s from %s failed: %s", object_id.hex(), node_id.hex(), exc)
            self.metrics.pull_failures += 1
            self.execute(self.store.fail_waiters(object_id, str(exc)))
            return
        self.metrics.pulled(object_id, size, started, self.node_id, node_id)
        self.copy_of[object_id] = node_id
        self.table.copied(object_id)
        self.execute(self.store.seal(object_id, size, COPY))
        self._located(object_id, self.node_id)  # a copy here serves those asking too

    # -- serving pulls (called on gRPC threads) ------------------------------------------------

    def locate(self, object_id: ObjectID) -> str | None:
        """The file holding our copy of ``object_id`` (shm or spilled), or None."""
        for path in (segment.segment_path(self.store_dir, object_id),
                     segment.spill_path(self.spill_dir, object_id)):
            if os.path.exists(path):
                return path
        return None

    def _served(self, object_id: ObjectID, requester: NodeID) -> None:
        self.loop.call_soon_threadsafe(self._note_copy, object_id, requester)

    def _note_copy(self, object_id: ObjectID, requester: NodeID) -> None:
        if not requester or requester in self.dead_nodes:
            return
        if self.store.contains(object_id):
            self.copies.setdefault(object_id, set()).add(requester)
        else:  # deleted while it was being sent: the copy must go too
            self.links.send(requester, m.ObjectsFreed([object_id]))

    def start_transfer_server(self, host: str, ready: Callable[[str], None]) -> None:
        """Serve pulls from a thread; ``ready(address)`` is called on the loop when up."""
        def run() -> None:
            try:
                from rtml.objectstore.transfer import TransferServer

                self.transfer = TransferServer(host, self.token, self.locate, self._served,
                                               self.tls_files)
                address = self.transfer.start()
            except Exception:
                log.exception("the object transfer server did not start")
                return
            self.loop.call_soon_threadsafe(ready, address)

        threading.Thread(target=run, name="rtml-transfer-start", daemon=True).start()

    # -- store commands ------------------------------------------------------------------------

    def schedule_collect(self) -> None:
        if not self._collect_scheduled:
            self._collect_scheduled = True
            self.loop.call_soon(self._collect)

    def _collect(self) -> None:
        self._collect_scheduled = False
        self.execute(self.store.collect())
        if self.creating:
            self._retry_creations()

    def execute(self, commands: list[Any], owner_died: bool = False) -> None:
        """Carry out the store core's commands; ``owner_died``: the losses they report are
        of objects whose owner died before making them."""
        for command in commands:
            if isinstance(command, NotifyReady):
                self._notify(command.waiter_ids, "")
            elif isinstance(command, NotifyLost):
                self._notify(command.waiter_ids, command.reason, owner_died)
            elif isinstance(command, Spill):
                self._spill(command.object_id)
            elif isinstance(command, Restore):
                self._restore(command.object_id)
            elif isinstance(command, Delete):
                self._delete(command.object_id)

    def _notify(self, waiter_ids: tuple[int, ...], error: str, owner_died: bool = False) -> None:
        for waiter_id in waiter_ids:
            entry = self.waiters.pop(waiter_id, None)
            if entry is not None:
                peer, req_id = entry
                peer.send(m.ObjectAvailable(req_id, NO_OBJECT, error, owner_died))

    def _segment(self, object_id: ObjectID) -> str:
        return segment.segment_path(self.store_dir, object_id)

    def _spill_file(self, object_id: ObjectID) -> str:
        return segment.spill_path(self.spill_dir, object_id)

    def _spill(self, object_id: ObjectID) -> None:
        spill_file = self._spill_file(object_id)
        try:
            segment.copy_file(self._segment(object_id), spill_file)
        except OSError as exc:  # (a full disk): the object stays in shared memory
            log.error("spilling %s to %s failed: %s", object_id.hex(), self.spill_dir, exc)
            with contextlib.suppress(OSError):
                os.unlink(spill_file)
            self.store.spill_failed(object_id)
            self.spill_error = f"spilling to {self.spill_dir} failed: {exc}"
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._segment(object_id))
        self.metrics.spilled_bytes += self.store.size_of(object_id)
        self.table.state_changed(object_id, "SPILLED", object_id not in self.copy_of)

    def _restore(self, object_id: ObjectID) -> None:
        try:
            segment.copy_file(self._spill_file(object_id), self._segment(object_id))
            os.unlink(self._spill_file(object_id))
        except OSError as exc:
            log.error("restoring %s failed: %s", object_id.hex(), exc)
            why = f"restoring it from {self.spill_dir} failed: {exc}"
            self._remember_lost(object_id, why)  # asked for later: said lost, not awaited
            self.execute(self.store.lost(object_id, why))
            return
        self.metrics.restored_bytes += self.store.size_of(object_id)
        self.table.state_changed(object_id, "SEALED", object_id not in self.copy_of)
        self.execute(self.store.restored(object_id))
        if self.creating:  # restored, it can be spilled again
            self._retry_creations()

    def _delete(self, object_id: ObjectID) -> None:
        primary = self.copy_of.pop(object_id, None) is None
        self.table.deleted(object_id, primary)
        for path in (self._segment(object_id), self._spill_file(object_id)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._forward_releases(self.remote.release_holder(object_id))  # nested refs it held
        holds_at = self.holds_at.pop(object_id, None)
        if holds_at is not None:  # ... or held for it by another node (a promoted result)
            self.release_holder(object_id, holds_at)
        for node_id in self.copies.pop(object_id, ()):
            self.links.send(node_id, m.ObjectsFreed([object_id]))
        actor_id = self.lives.pop(object_id, None)
        if actor_id is not None:
            self.end_actor(actor_id)

    # -- control plane and shutdown ------------------------------------------------------------

    async def locate_unknown(self, plane: ControlPlane | None) -> None:
        """Objects awaited here whose location nobody told us: look them up in the table.

        The rare path (a ref that lost its location hint, e.g. an actor's constructor
        argument still being computed when the actor was created); called each heartbeat.
        """
        waiting = [oid for oid in self.unlocated
                   if not self.store.contains(oid) and self.store.state(oid) is None
                   and oid not in self.pulls and self.store.waiting_on(oid)]
        self.unlocated = set(waiting)
        if plane is None or not waiting:
            return
        try:
            found = await self.loop.run_in_executor(None, plane.object_locations, waiting)
        except Exception as exc:  # RtmlSystemError: Redis is down; next tick
            log.warning("object location lookup failed: %s", exc)
            return
        for object_id, nodes in found.items():
            others = [n for n in nodes if n != self.node_id and n not in self.dead_nodes]
            if others and not self.store.contains(object_id):
                self.unlocated.discard(object_id)
                self._pull(object_id, others[0])

    async def flush(self, plane: ControlPlane | None) -> None:
        """Write this tick's object-table changes: one pipelined call, in a thread."""
        puts, removes, drops = self.table.drain()
        if plane is None or (not puts and not removes and not drops):
            return
        try:
            await self.loop.run_in_executor(None, plane.write_objects, puts, removes, drops)
        except Exception as exc:  # RtmlSystemError: Redis is down; retry next tick
            log.warning("object table update failed (%s); retrying next heartbeat", exc)
            self.table.requeue(puts, removes, drops)

    def _own(self, future: asyncio.Future[Any]) -> None:
        self.background.add(future)
        future.add_done_callback(self.background.discard)

    def shutdown(self, plane: ControlPlane | None) -> None:
        """Stop serving pulls, remove every segment of this node, forget its records."""
        if self.transfer is not None:
            self.transfer.stop(0.5)
        private.remove_store_dir(self.store_dir)
        if plane is None:
            return
        recorded = self.table.recorded | self.table.removes
        mine = [oid for oid in recorded if oid not in self.copy_of]
        drops = {oid: [self.table.here] for oid in recorded if oid in self.copy_of}
        try:
            plane.write_objects({}, mine, drops)
        except Exception as exc:  # Redis may already be stopped with the cluster
            log.info("could not remove %d object record(s) at shutdown: %s", len(mine), exc)


def _owner_died(owner: ClientID) -> str:
    return f"its owner {owner.hex()} died before the value existed"
