"""The link protocol: one node manager and another, over TCP (object bytes move over
gRPC, beside it).

    node manager --AddHolds / ReleaseHolds--> the node holding an object's primary copy
    primary node --ObjectsFreed--> nodes holding copies: drop them
    node manager --LinkFence--> <--LinkFenced: everything sent before it is handled
    node manager --LocateObject--> the owner's node (a pull found nothing where the ref
                 said) <--ObjectLocated once it is sealed or placed somewhere, or never
"""

from __future__ import annotations

from rtml.ids import ClientID, NodeID, ObjectID
from rtml.rpc.protocols.base import Msg


class ObjectsFreed(Msg, tag=69):
    """Primary node -> nodes holding copies: the objects were deleted; drop the copies."""
    object_ids: list[ObjectID]


class LinkFence(Msg, tag=72):
    """Node manager -> node manager: answer with LinkFenced once everything sent
    before it on this link is handled."""
    req_id: int


class LinkFenced(Msg, tag=73):
    req_id: int


class LocateObject(Msg, tag=74):
    """Node manager -> the node a ref named: where is the object? Answered at once if the
    receiver knows, else when its owner (a client there) has it made, or dies."""
    req_id: int
    object_id: ObjectID
    owner_id: ClientID


class ObjectLocated(Msg, tag=75):
    req_id: int
    object_id: ObjectID
    node_id: NodeID  # where its primary copy is; empty with an error
    error: str = ""
    owner_died: bool = False  # the error: its owner died before it existed


Message = (
    ObjectsFreed | LinkFence | LinkFenced | LocateObject | ObjectLocated
)
"""Every message of this protocol."""
