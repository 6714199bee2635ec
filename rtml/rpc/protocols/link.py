"""The link protocol: one node manager and another, over TCP (object bytes move over
gRPC, beside it).

    node manager --AddHolds / ReleaseHolds--> the node holding an object's primary copy
    primary node --ObjectsFreed--> nodes holding copies: drop them
    node manager --LinkFence--> <--LinkFenced: everything sent before it is handled
"""

from __future__ import annotations

from rtml.rpc.protocols.base import Msg


class ObjectsFreed(Msg, tag=69):
    """Primary node -> nodes holding copies: the objects were deleted; drop the copies."""
    object_ids: list[bytes]


class LinkFence(Msg, tag=72):
    """Node manager -> node manager: answer with LinkFenced once everything sent
    before it on this link is handled."""
    req_id: int


class LinkFenced(Msg, tag=73):
    req_id: int


Message = (
    ObjectsFreed | LinkFence | LinkFenced
)
"""Every message of this protocol."""
