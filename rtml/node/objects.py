"""The object manager of one node: the store core's asyncio shell, and objects of other nodes.

    clients --SealObject/AddHolds/ReleaseHolds/WaitObject--> ObjectManager
        objects whose primary copy is here -> StoreCore -> Spill/Restore/Delete, Notify*
        objects whose primary is on node A -> RemoteHolds -> AddHolds/ReleaseHolds
                                              (holder = this node) --TCP--> A's manager
    WaitObject for an object on node A --> one pull per object (gRPC, in a thread)
        --> segment in this node's /dev/shm --> sealed here as a copy, held by COPY
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
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rtml.control_plane import ControlPlane, location_field
from rtml.exceptions import ObjectLostError, RtmlSystemError
from rtml.node.links import NodeLinks
from rtml.objectstore import segment
from rtml.objectstore.remote import RemoteHolds
from rtml.objectstore.store import Delete, NotifyLost, NotifyReady, Restore, Spill, StoreCore
from rtml.rpc import messages as m

log = logging.getLogger(__name__)

COPY = b"copy"
"""The holder of a copy pulled from another node, until that node frees the object."""

GONE_CLIENTS_KEPT = 10_000
"""Disconnected client ids remembered, so late seals on their behalf hold nothing."""


class ObjectTableBatch:
    """Object-table changes waiting for the next flush to the control plane.

    Sans-I/O: the manager notes seals, copies, state changes and deletes as they
    happen (a dict update each) and drains a batch once per heartbeat tick.
    ``recorded`` is every id written or about to be written, so a state change
    of an object that was deleted meanwhile cannot resurrect a partial record.
    """

    def __init__(self, node_id: bytes) -> None:
        self.node_id = node_id
        self.here = location_field(node_id)
        self.puts: dict[bytes, dict[str, Any]] = {}
        self.removes: set[bytes] = set()
        self.dropped: set[bytes] = set()  # copies dropped here (the record may live on)
        self.recorded: set[bytes] = set()

    def sealed(self, object_id: bytes, size: int, owner: bytes) -> None:
        """A new object was sealed here; ``owner`` is its first holder (a hint)."""
        self.removes.discard(object_id)
        self.recorded.add(object_id)
        self.puts[object_id] = {"node_id": self.node_id, self.here: "SEALED", "size": size,
                                "state": "SEALED", "owner": owner}

    def copied(self, object_id: bytes) -> None:
        """A copy of another node's object now lives here too."""
        self.dropped.discard(object_id)
        self.recorded.add(object_id)
        self.puts[object_id] = {self.here: "SEALED"}

    def state_changed(self, object_id: bytes, state: str, primary: bool) -> None:
        """The object moved between shared memory (SEALED) and disk (SPILLED)."""
        if object_id in self.recorded:
            info = self.puts.setdefault(object_id, {})
            info[self.here] = state
            if primary:
                info["state"] = state

    def deleted(self, object_id: bytes, primary: bool) -> None:
        if object_id in self.recorded:
            self.recorded.discard(object_id)
            self.puts.pop(object_id, None)
            (self.removes if primary else self.dropped).add(object_id)

    def drain(self) -> tuple[dict[bytes, dict[str, Any]], list[bytes], dict[bytes, list[str]]]:
        """The pending (puts, removes, dropped location fields), now owned by the caller."""
        puts, removes = self.puts, list(self.removes)
        drops = {object_id: [self.here] for object_id in self.dropped}
        self.puts, self.removes, self.dropped = {}, set(), set()
        return puts, removes, drops

    def requeue(self, puts: dict[bytes, dict[str, Any]], removes: list[bytes],
                drops: dict[bytes, list[str]]) -> None:
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

    def __init__(self, node_id: bytes, namespace: str, spill_dir: str, capacity: int,
                 token: str, links: NodeLinks, end_actor: Callable[[bytes], None]) -> None:
        self.node_id = node_id
        self.end_actor = end_actor  # an actor's life object was freed here: it ends
        self.lives: dict[bytes, bytes] = {}  # life object -> its actor
        self.holds_at: dict[bytes, bytes] = {}  # our object -> the node holding its refs
        self.namespace = namespace
        self.spill_dir = spill_dir
        self.token = token
        self.links = links
        self.store = StoreCore(capacity)
        self.remote = RemoteHolds()
        self.table = ObjectTableBatch(node_id)
        self.waiters: dict[int, tuple[Any, int]] = {}
        self._waiter_ids = 0
        self._collect_scheduled = False
        self.gone_clients: dict[bytes, None] = {}  # insertion-ordered, bounded
        self.transfer_addresses: dict[bytes, str] = {}
        self.dead_nodes: set[bytes] = set()
        self.pulls: dict[bytes, bytes] = {}  # object id -> node pulled from
        self.unlocated: set[bytes] = set()  # awaited here, location unknown: ask the table
        self.pulls_started = 0
        self.awaiting_address: dict[bytes, set[bytes]] = {}  # node -> objects to pull
        self.copies: dict[bytes, set[bytes]] = {}  # our object -> nodes holding a copy
        self.copy_of: dict[bytes, bytes] = {}  # our copy -> its primary node
        self.background: set[asyncio.Future[Any]] = set()
        self.transfer: Any = None
        self.loop = asyncio.get_running_loop()

    # -- client events -------------------------------------------------------------------------

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
            self.table.sealed(msg.object_id, msg.size, msg.holder)
        self.execute(commands)

    def add_holds(self, msg: m.AddHolds) -> None:
        if msg.node_id and msg.node_id != self.node_id:
            for node_id, first in self.remote.add(msg.object_ids, msg.holder,
                                                  msg.node_id).items():
                self.links.send(node_id, m.AddHolds(first, self.node_id))
        else:
            self.execute(self.store.add_holds(msg.object_ids, msg.holder))

    def release_holds(self, msg: m.ReleaseHolds) -> None:
        if msg.node_id and msg.node_id != self.node_id:
            self._forward_releases(self.remote.release(msg.object_ids, msg.holder))
        else:
            self.execute(self.store.release_holds(msg.object_ids, msg.holder))
        self.schedule_collect()

    def release_holder(self, holder: bytes, node_id: bytes = b"") -> None:
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

    def _forward_releases(self, last: dict[bytes, list[bytes]]) -> None:
        for node_id, object_ids in last.items():
            if node_id not in self.dead_nodes:
                self.links.send(node_id, m.ReleaseHolds(object_ids, self.node_id))

    def wait(self, peer: Any, waiters: set[int], msg: m.WaitObject) -> None:
        """Tell ``peer`` when the object can be mapped here, pulling it if it lives elsewhere."""
        self._waiter_ids += 1
        waiter_id = self._waiter_ids
        self.waiters[waiter_id] = (peer, msg.req_id)
        waiters.add(waiter_id)
        commands = self.store.wait(msg.object_id, waiter_id)
        self.execute(commands)
        if waiter_id in self.waiters and not self.store.contains(msg.object_id):
            primary = msg.node_id or self.remote.primary_of(msg.object_id) or b""
            if primary and primary != self.node_id:
                self._pull(msg.object_id, primary)
            elif not primary:
                self.unlocated.add(msg.object_id)

    def client_gone(self, client_id: bytes, waiters: set[int]) -> None:
        for waiter_id in waiters:
            self.waiters.pop(waiter_id, None)
            self.store.cancel_waiter(waiter_id)
        self.gone_clients[client_id] = None
        if len(self.gone_clients) > GONE_CLIENTS_KEPT:
            del self.gone_clients[next(iter(self.gone_clients))]
        self.release_holder(client_id)

    # -- other nodes ---------------------------------------------------------------------------

    def node_table(self, nodes: list[m.NodeEntry]) -> None:
        for entry in nodes:
            self.links.address_known(entry.node_id, entry.address)
            if entry.transfer_address:
                self.transfer_addresses[entry.node_id] = entry.transfer_address
                for object_id in self.awaiting_address.pop(entry.node_id, ()):
                    self._start_pull(object_id, entry.node_id, entry.transfer_address)

    def node_died(self, node_id: bytes, reason: str) -> None:
        """Objects whose primary was there are lost; its holds on ours are dropped."""
        self.dead_nodes.add(node_id)
        self.links.forget(node_id)
        why = f"its node {node_id.hex()} died ({reason})"
        lost = set(self.remote.node_died(node_id)) | self.awaiting_address.pop(node_id, set())
        lost |= {oid for oid, source in self.pulls.items() if source == node_id}
        for object_id in lost:
            self.pulls.pop(object_id, None)
            self.execute(self.store.fail_waiters(object_id, why))
        for holders in self.copies.values():
            holders.discard(node_id)
        self.release_holder(node_id)

    def objects_freed(self, object_ids: list[bytes]) -> None:
        """The primary node deleted these objects: drop our copies."""
        for object_id in object_ids:
            self.copy_of.pop(object_id, None)
        self.execute(self.store.release_holds(object_ids, COPY))
        self.schedule_collect()

    # -- pulls -----------------------------------------------------------------------------------

    def _pull(self, object_id: bytes, node_id: bytes) -> None:
        if object_id in self.pulls:
            return  # one transfer per object, however many wait for it
        if node_id in self.dead_nodes:
            self.execute(self.store.fail_waiters(
                object_id, f"its node {node_id.hex()} is dead"))
            return
        address = self.transfer_addresses.get(node_id)
        self.pulls[object_id] = node_id
        if address is None:
            self.awaiting_address.setdefault(node_id, set()).add(object_id)
        else:
            self._start_pull(object_id, node_id, address)

    def _start_pull(self, object_id: bytes, node_id: bytes, address: str) -> None:
        from rtml.objectstore import transfer  # imports gRPC: only nodes that pull pay

        self.pulls_started += 1
        path = segment.segment_path(self.namespace, object_id)
        future = self.loop.run_in_executor(None, transfer.pull, address, self.token,
                                           object_id, path, self.node_id)
        self._own(future)
        future.add_done_callback(lambda f: self._pulled(object_id, node_id, f))

    def _pulled(self, object_id: bytes, node_id: bytes, future: asyncio.Future[int]) -> None:
        if self.pulls.get(object_id) != node_id:
            return  # the source died meanwhile; the waiters were told
        del self.pulls[object_id]
        try:
            size = future.result()
        except (ObjectLostError, RtmlSystemError) as exc:
            log.warning("pulling %s from %s failed: %s", object_id.hex(), node_id.hex(), exc)
            self.execute(self.store.fail_waiters(object_id, str(exc)))
            return
        self.copy_of[object_id] = node_id
        self.table.copied(object_id)
        self.execute(self.store.seal(object_id, size, COPY))

    # -- serving pulls (called on gRPC threads) ------------------------------------------------

    def locate(self, object_id: bytes) -> str | None:
        """The file holding our copy of ``object_id`` (shm or spilled), or None."""
        for path in (segment.segment_path(self.namespace, object_id),
                     segment.spill_path(self.spill_dir, object_id)):
            if os.path.exists(path):
                return path
        return None

    def _served(self, object_id: bytes, requester: bytes) -> None:
        self.loop.call_soon_threadsafe(self._note_copy, object_id, requester)

    def _note_copy(self, object_id: bytes, requester: bytes) -> None:
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

                self.transfer = TransferServer(host, self.token, self.locate, self._served)
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

    def execute(self, commands: list[Any]) -> None:
        for command in commands:
            if isinstance(command, NotifyReady):
                self._notify(command.waiter_ids, "")
            elif isinstance(command, NotifyLost):
                self._notify(command.waiter_ids, command.reason)
            elif isinstance(command, Spill):
                self._spill(command.object_id)
            elif isinstance(command, Restore):
                self._restore(command.object_id)
            elif isinstance(command, Delete):
                self._delete(command.object_id)

    def _notify(self, waiter_ids: tuple[int, ...], error: str) -> None:
        for waiter_id in waiter_ids:
            entry = self.waiters.pop(waiter_id, None)
            if entry is not None:
                peer, req_id = entry
                peer.send(m.ObjectAvailable(req_id, b"", error))

    def _segment(self, object_id: bytes) -> str:
        return segment.segment_path(self.namespace, object_id)

    def _spill_file(self, object_id: bytes) -> str:
        return segment.spill_path(self.spill_dir, object_id)

    def _spill(self, object_id: bytes) -> None:
        try:
            segment.copy_file(self._segment(object_id), self._spill_file(object_id))
            os.unlink(self._segment(object_id))
        except OSError as exc:
            log.error("spilling %s failed: %s", object_id.hex(), exc)
            self.execute(self.store.lost(object_id, f"spill failed: {exc}"))
            return
        self.table.state_changed(object_id, "SPILLED", object_id not in self.copy_of)

    def _restore(self, object_id: bytes) -> None:
        try:
            segment.copy_file(self._spill_file(object_id), self._segment(object_id))
            os.unlink(self._spill_file(object_id))
        except OSError as exc:
            log.error("restoring %s failed: %s", object_id.hex(), exc)
            self.execute(self.store.lost(object_id, f"restore failed: {exc}"))
            return
        self.table.state_changed(object_id, "SEALED", object_id not in self.copy_of)
        self.execute(self.store.restored(object_id))

    def _delete(self, object_id: bytes) -> None:
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
        for path in Path("/dev/shm").glob(f"rtml-{self.namespace}-*"):
            path.unlink(missing_ok=True)
        if plane is None:
            return
        recorded = self.table.recorded | self.table.removes
        mine = [oid for oid in recorded if oid not in self.copy_of]
        drops = {oid: [self.table.here] for oid in recorded if oid in self.copy_of}
        try:
            plane.write_objects({}, mine, drops)
        except Exception as exc:  # Redis may already be stopped with the cluster
            log.info("could not remove %d object record(s) at shutdown: %s", len(mine), exc)
