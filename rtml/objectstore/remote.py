"""Holds of this node's processes on objects whose primary copy lives on another node.

Sans-I/O. The node manager stands in for its local holders at the primary
node: the primary counts one hold per node, this core counts the local holders
behind it, and says when the node-level hold must be added or dropped::

    client AddHolds(ids, holder, node=A) --> add() --> {A: ids newly held here}
                                                         --> AddHolds(ids, holder=this node) to A
    client ReleaseHolds / ReleaseHolder  --> release() / release_holder()
                                         --> {A: ids no longer held here}
                                                         --> ReleaseHolds(ids, holder=this node) to A
    node A died --> node_died(A) --> ids forgotten, with their holders
                                     (a copy here may become the primary, held by them)
"""

from __future__ import annotations

from collections.abc import Iterable

from rtml.ids import NodeID, ObjectID


class RemoteHolds:
    """Local holders of remote-primary objects, grouped by the objects' primary node."""

    def __init__(self) -> None:
        self._primary: dict[ObjectID, NodeID] = {}  # object id -> primary node
        self._holders: dict[ObjectID, set[bytes]] = {}  # object id -> local holders
        self._held_by: dict[bytes, set[ObjectID]] = {}  # holder -> object ids

    def __len__(self) -> int:
        """Objects held here for local holders."""
        return len(self._holders)

    def holds(self, object_id: ObjectID, holder: bytes) -> bool:
        return holder in self._holders.get(object_id, ())

    def primary_of(self, object_id: ObjectID) -> NodeID | None:
        return self._primary.get(object_id)

    def add(self, object_ids: Iterable[ObjectID], holder: bytes,
            node_id: NodeID) -> dict[NodeID, list[ObjectID]]:
        """``holder`` holds each object (primary on ``node_id``); returns the first holds."""
        first: list[ObjectID] = []
        for object_id in object_ids:
            holders = self._holders.get(object_id)
            if holders is None:
                holders = self._holders[object_id] = set()
                self._primary[object_id] = node_id
                first.append(object_id)
            holders.add(holder)
            self._held_by.setdefault(holder, set()).add(object_id)
        return {node_id: first} if first else {}

    def release(self, object_ids: Iterable[ObjectID], holder: bytes
                ) -> dict[NodeID, list[ObjectID]]:
        """``holder`` drops each object; returns, per primary node, those no longer held."""
        last: dict[NodeID, list[ObjectID]] = {}
        held = self._held_by.get(holder, set())
        for object_id in object_ids:
            holders = self._holders.get(object_id)
            if holders is None or holder not in holders:
                continue
            holders.discard(holder)
            held.discard(object_id)
            if not holders:
                del self._holders[object_id]
                last.setdefault(self._primary.pop(object_id), []).append(object_id)
        if not held:
            self._held_by.pop(holder, None)
        return last

    def release_holder(self, holder: bytes) -> dict[NodeID, list[ObjectID]]:
        """Drop every hold of ``holder`` (a client that left, a freed container)."""
        return self.release(list(self._held_by.get(holder, ())), holder)

    def node_died(self, node_id: NodeID) -> dict[ObjectID, set[bytes]]:
        """Forget the objects whose primary was on ``node_id``; returns their local holders,
        by object id."""
        gone = [oid for oid, primary in self._primary.items() if primary == node_id]
        holders_of: dict[ObjectID, set[bytes]] = {}
        for object_id in gone:
            del self._primary[object_id]
            holders = holders_of[object_id] = self._holders.pop(object_id, set())
            for holder in holders:
                held = self._held_by.get(holder)
                if held is not None:
                    held.discard(object_id)
                    if not held:
                        del self._held_by[holder]
        return holders_of
