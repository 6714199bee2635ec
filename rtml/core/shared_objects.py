"""This process's use of its node's shared-memory object store.

    write(id, value, holder) -> CreateObject --> node manager  (room asked for, in parallel)
                              segment file written -> SealObject --> node manager
    promote(id, payload, ...) an inline value copied into a segment, sealed
    read(id, owner, ...)      mapped zero-copy; if absent: await_present, then mapped
    await_present(id, ...)    WaitObject --> node manager (restored, pulled or awaited)
                              <-- ObjectAvailable, or the error saying why it cannot be

The node manager keeps what is sealed until its holders release it (see DESIGN.md,
"Ownership"); this class only writes, seals and reads.
"""

from __future__ import annotations

import os
from typing import Any

from rtml import objectstore
from rtml.config import STORE_FULL_TIMEOUT
from rtml.core.links import Answer, ClientLinks
from rtml.core.serialization import Serialized, deserialize
from rtml.exceptions import (
    ObjectLostError,
    ObjectStoreFullError,
    OutOfDiskError,
    OwnerDiedError,
    RtmlSystemError,
)
from rtml.ids import NO_NODE, ActorID, ClientID, NodeID, ObjectID
from rtml.rpc import messages as m


class SharedObjects:
    """Writes, seals, maps and awaits objects in this node's shared memory."""

    def __init__(self, links: ClientLinks) -> None:
        self.links = links
        self._room = 0  # the node's free store bytes, as its last CreateObject answer said

    def path(self, object_id: ObjectID) -> str:
        return objectstore.segment_path(self.links.store_dir, object_id)

    def exists(self, object_id: ObjectID) -> bool:
        """Whether a copy of the object is on this node now."""
        return os.path.exists(self.path(object_id))

    def write(self, object_id: ObjectID, ser: Serialized, holder: bytes) -> int:
        """Write a value into this node's shared-memory store on behalf of ``holder``, and
        seal it once the node manager has made room for it. Asked first; written while
        the answer comes when the last answer left room for it twice over (so a store
        near full is never overrun), else once it is granted. Raises
        ObjectStoreFullError (OutOfDiskError if spilling failed) when it cannot, and
        leaves nothing behind then."""
        links = self.links
        if links.nm.closed:
            raise links.nm_gone()
        answer = Answer()
        req_id = links.ask(links.nm, lambda rid: m.CreateObject(rid, object_id, ser.size),
                           answer)
        path = self.path(object_id)
        written = False
        if 2 * ser.size > self._room:
            self._room_granted(req_id, answer, path, written)
        try:
            size = objectstore.write_segment(path, ser.inband, ser.buffers)
            written = True
        except FileExistsError:  # an earlier attempt of the same task wrote it
            size = objectstore.existing_size(path)
        if not answer.done.is_set():
            self._room_granted(req_id, answer, path, written)
        links.nm.send(m.SealObject(object_id, size, holder))
        return size

    def _room_granted(self, req_id: int, answer: Answer, path: str, written: bool) -> None:
        """Wait for the answer to a CreateObject; raise its error (removing what was
        written) if the room was not granted."""
        links = self.links
        if not links.reactor.wait_serving(answer.done, STORE_FULL_TIMEOUT + 30, spin=True):
            links.forget_reply(req_id)
            answer.msg = RtmlSystemError(f"the node manager at {links.config.nm_address} did "
                                         f"not answer a request for room in its object store")
        reply = answer.msg
        if isinstance(reply, m.ObjectCreated) and not reply.error:
            self._room = reply.free
            return
        if written:
            os.unlink(path)
        if isinstance(reply, RtmlSystemError):
            raise reply
        raise (OutOfDiskError if reply.out_of_disk else ObjectStoreFullError)(reply.error)

    def promote(self, object_id: ObjectID, payload: m.Payload, life_of: ActorID,
                holds_at: NodeID) -> bool:
        """Copy an owned inline value into shared memory so other processes can read it;
        ``life_of``: the actor it is the life object of, if any; ``holds_at``: the node
        holding the refs inside it, if it has any. False if a copy was there already."""
        try:
            size = objectstore.write_segment(self.path(object_id), payload.data,
                                             payload.buffers)
        except FileExistsError:
            return False
        self.links.nm.send(m.SealObject(object_id, size, self.links.client_id, life_of,
                                        holds_at))
        return True

    def read(self, object_id: ObjectID, owner: ClientID, deadline: float | None,
             node_id: NodeID = NO_NODE) -> Any:
        """Map an object from shared memory (zero-copy), restoring, pulling or awaiting it.

        ``node_id``: where its primary copy lives, if not on this node.
        """
        path = self.path(object_id)
        try:
            inband, buffers = objectstore.read_segment(path)
        except FileNotFoundError:
            self.await_present(object_id, owner, deadline, node_id)
            inband, buffers = objectstore.read_segment(path)
        return deserialize(inband, buffers)

    def await_present(self, object_id: ObjectID, owner: ClientID, deadline: float | None,
                      node_id: NodeID = NO_NODE) -> None:
        """Ask the node manager to make an object present here; block until it is."""
        links = self.links
        if links.nm.closed:
            raise links.nm_gone()
        answer = Answer()
        req_id = links.ask(links.nm, lambda rid: m.WaitObject(rid, object_id, owner, node_id),
                           answer)
        try:
            links.block(answer.done, deadline, [object_id])
        except BaseException:
            links.forget_reply(req_id)
            raise
        raise_unavailable(object_id, answer.msg)


def raise_unavailable(object_id: ObjectID, answer: m.ObjectAvailable | RtmlSystemError) -> None:
    """Raise the error a node manager's answer to WaitObject carries, if any (or the error
    of a node manager that went away)."""
    if isinstance(answer, RtmlSystemError):
        raise answer
    if answer.owner_died:
        raise OwnerDiedError(f"object {object_id.hex()} cannot be made: {answer.error}")
    if answer.error:
        raise ObjectLostError(f"object {object_id.hex()} is lost: {answer.error}")
