"""The node protocol: a client (driver or worker, or an owner on another node over TCP)
and a node manager.

    client --RequestLease--> node manager --LeaseGranted | LeaseSpillback | LeaseFailed |
                                            LeaseInfeasible
    client --ReturnLease / CancelLeaseRequest / WorkerBlocked / WorkerUnblocked-->
    client --CreateObject--> <--ObjectCreated (room for it, spilling others; or why not)
    client --SealObject / AddHolds / ReleaseHolds / ReleaseHolder / FenceHolds-->
           <--HoldsFenced
    client --WaitObject--> <--ObjectAvailable      client --StoreStats--> <--StoreStatsReply
    client --CancelTask-->                          (the node manager kills or interrupts)
    worker --WorkerListening / ActorReady / WorkerOutput--> node manager
    worker <--CancelRunning / BecomeActor-- node manager
    worker <--CountTasks-- node manager (each heartbeat, only while it serves metrics)
           --TaskCounts-->
    client --ListLogs--> <--LogFiles               client --ReadLog--> <--LogChunk
           (the node's log files, read from an offset: rtml.node.logs)
"""

from __future__ import annotations

import msgspec

from rtml.ids import (
    NO_ACTOR,
    NO_NODE,
    ActorID,
    ClientID,
    JobID,
    NodeID,
    ObjectID,
    TaskID,
    WorkerID,
)
from rtml.rpc.protocols.base import ActorSpec, Msg


class RequestLease(Msg, tag=20):
    req_id: int
    shape: dict[str, float]
    strategy: str = ""  # "" | "SPREAD" | "node:<hex id>" | "node:<hex id>:soft"
    preferred_node: NodeID = NO_NODE  # holds the task's large arguments
    spilled: bool = False  # placed here by the head: grant here, never spill again
    runtime_env: str = ""  # the tasks' runtime env (rtml.core.runtime_env): its own workers


class LeaseGranted(Msg, tag=21):
    req_id: int
    lease_id: int
    worker_id: WorkerID
    address: str
    gpu_ids: tuple[int, ...] = ()


class LeaseSpillback(Msg, tag=28):
    """Ask the node manager at ``address`` (node ``node_id``) for this lease instead."""
    req_id: int
    node_id: NodeID
    address: str


class LeaseFailed(Msg, tag=22):
    req_id: int
    reason: str


class ReturnLease(Msg, tag=23):
    lease_id: int


class CancelLeaseRequest(Msg, tag=24):
    req_id: int


class LeaseInfeasible(Msg, tag=27):
    """No node has the resources for this shape; the request stays pending."""
    req_id: int
    shape: dict[str, float]


class WorkerBlocked(Msg, tag=25):
    pass


class WorkerUnblocked(Msg, tag=26):
    pass


class CreateObject(Msg, tag=45):
    """Room in the store for an object about to be written into shared memory."""
    req_id: int
    object_id: ObjectID
    size: int


class ObjectCreated(Msg, tag=46):
    req_id: int
    error: str = ""  # no room: why (the store is full, or spilling to disk failed)
    out_of_disk: bool = False  # the error: spilling to disk failed
    free: int = 0  # room left in the store after this one's (a hint for the next)


class SealObject(Msg, tag=30):
    object_id: ObjectID
    size: int
    holder: bytes  # a client, or the node standing in for an owner on another node
    actor_id: ActorID = NO_ACTOR  # the object is this actor's life: the actor ends when it is freed
    holds_at: NodeID = NO_NODE  # the node holding the refs inside it, if not this one


class AddHolds(Msg, tag=31):
    object_ids: list[ObjectID]
    holder: bytes  # a client, a node (for its clients) or an object (the refs in it)
    node_id: NodeID = NO_NODE  # the objects' primary node, if not the receiver


class ReleaseHolds(Msg, tag=32):
    object_ids: list[ObjectID]
    holder: bytes  # a client, a node (for its clients) or an object (the refs in it)
    node_id: NodeID = NO_NODE


class ReleaseHolder(Msg, tag=33):
    holder: bytes  # a client, a node (for its clients) or an object (the refs in it)
    node_id: NodeID = NO_NODE  # the node whose manager holds for ``holder``, if not the receiver


class WaitObject(Msg, tag=34):
    req_id: int
    object_id: ObjectID
    owner_id: ClientID
    node_id: NodeID = NO_NODE  # where the primary copy lives (pulled from there if not here)


class ObjectAvailable(Msg, tag=35):
    req_id: int
    object_id: ObjectID
    error: str = ""
    owner_died: bool = False  # the error: its owner died before the value existed


class CancelTask(Msg, tag=36):
    task_id: TaskID
    worker_id: WorkerID
    force: bool
    recursive: bool = False  # also cancel the tasks it submitted


class StoreStats(Msg, tag=37):
    req_id: int


class StoreStatsReply(Msg, tag=38):
    req_id: int
    stats: dict[str, int]


class FenceHolds(Msg, tag=70):
    """Client -> its node manager: answer once the holds it forwarded to these nodes
    are in place there (a worker asks before it sends a result that lets its owner
    release what the worker borrowed)."""
    req_id: int
    node_ids: list[NodeID]


class HoldsFenced(Msg, tag=71):
    req_id: int


class CancelRunning(Msg, tag=40):
    task_id: TaskID
    recursive: bool = False


class WorkerListening(Msg, tag=41):
    address: str  # unix socket, for owners on this node
    tcp_address: str  # for owners on other nodes


class WorkerOutput(Msg, tag=44):
    """Lines a worker printed, forwarded by its node manager to the job's drivers."""
    pid: int
    job_id: JobID
    text: str


class BecomeActor(Msg, tag=42):
    spec: ActorSpec
    gpu_ids: tuple[int, ...] = ()
    restarts: int = 0  # as StartActor's


class ActorReady(Msg, tag=43):
    actor_id: ActorID
    error: str = ""  # the constructor's error, with its traceback


class CountTasks(Msg, tag=100):
    """The node manager asks a worker for its task counters (for its metrics)."""


class TaskCounts(Msg, tag=101):
    """A worker's task counters since it started: calls it began, and those that ended
    with a value or with an error (began - finished - failed: running)."""
    started: int
    finished: int
    failed: int


class LogFile(msgspec.Struct, array_like=True, gc=False):
    name: str  # a file name in the session's logs directory
    size: int
    mtime: float
    pid: int = 0  # a worker's file: the worker's pid, when its node manager knows it
    actor_id: bytes = b""  # ... and the actor it ran, if any


class ListLogs(Msg, tag=102):
    req_id: int


class LogFiles(Msg, tag=103):
    req_id: int
    files: list[LogFile]
    node_id: bytes = b""


class ReadLog(Msg, tag=104):
    """Read ``name`` (a file of the node's logs directory) from ``offset`` (negative: that
    many bytes before its end), at most ``max_bytes``."""
    req_id: int
    name: str
    offset: int = 0
    max_bytes: int = 1 << 20


class LogChunk(Msg, tag=105):
    req_id: int
    data: bytes = b""
    offset: int = 0  # where ``data`` starts in the file
    size: int = 0  # the file's size when read
    error: str = ""  # why nothing was read (no such file, a name outside the logs)


Message = (
    RequestLease | LeaseGranted | LeaseSpillback | LeaseFailed | ReturnLease |
    CancelLeaseRequest | LeaseInfeasible | WorkerBlocked | WorkerUnblocked | CreateObject |
    ObjectCreated | SealObject |
    AddHolds | ReleaseHolds | ReleaseHolder | WaitObject | ObjectAvailable | CancelTask |
    StoreStats | StoreStatsReply | FenceHolds | HoldsFenced | CancelRunning |
    WorkerListening | WorkerOutput | BecomeActor | ActorReady | CountTasks | TaskCounts |
    ListLogs | LogFiles | ReadLog | LogChunk
)
"""Every message of this protocol."""
