"""Typed wire messages of every rtml protocol.

Each message is a msgspec ``Struct`` encoded as a msgpack array whose first
element is its integer tag, so decoding is a single C call into the right
class. ``PROTOCOL_VERSION`` is checked in the ``Hello`` handshake; bump it
whenever a message changes shape.

Messages are plain data (bytes, numbers, strings, and lists and dicts of them), so they
can form no reference cycle: they are kept out of the cyclic collector's sight
(``gc=False``). A burst of calls keeps thousands alive, and tracking them made the
driver's collections cost ~4 us per call. The sequences a task carries are tuples, not
lists, for the same reason: a list is always tracked, and an empty tuple is shared.

Protocols (one connection each, all opening with ``Hello``):

    client (driver/worker) -> node manager   leases, object store, cancel
    owner -> worker                          PushTask / TaskResult
    client, node manager -> head service     jobs, nodes, actors, cluster state
    node manager -> node manager (TCP)       holds on objects whose primary copy is there,
                                             frees of copies (object bytes move over gRPC)
"""

from __future__ import annotations

import msgspec

PROTOCOL_VERSION = 3


class Msg(msgspec.Struct, array_like=True, tag=True, omit_defaults=False, gc=False):
    """Base of all wire messages."""


# -- handshake ---------------------------------------------------------------------------------

class Hello(Msg, tag=1):
    token: str
    version: int
    role: str  # "driver" | "worker" | "node" | "cli"
    client_id: bytes
    pid: int
    job_id: bytes = b""
    sys_paths: list[str] = []
    node_id: bytes = b""  # the node the connecting process runs on


class HelloReply(Msg, tag=2):
    ok: bool
    error: str = ""
    node_id: bytes = b""
    info: dict[str, str] = {}


# -- values ------------------------------------------------------------------------------------

class Payload(msgspec.Struct, array_like=True, gc=False):
    """A serialized value: pickle-5 in-band bytes plus its out-of-band buffers."""
    data: bytes
    buffers: tuple[bytes, ...] = ()
    is_error: bool = False


class TaskArg(msgspec.Struct, array_like=True, gc=False):
    """One argument: an inline value, or an object id the worker resolves itself."""
    value: Payload | None = None
    object_id: bytes = b""
    node_id: bytes = b""  # where the object's primary copy lives


class ReturnObject(msgspec.Struct, array_like=True, gc=False):
    object_id: bytes
    value: Payload | None  # None: the value is in the node's shared-memory store
    size: int = 0
    is_error: bool = False


# -- owner <-> worker --------------------------------------------------------------------------

class TaskSpec(msgspec.Struct, array_like=True, gc=False):
    task_id: bytes
    job_id: bytes
    name: str
    function_id: bytes  # hash of the exported function; empty for actor methods
    args: tuple[TaskArg, ...]
    kwarg_names: tuple[str, ...]
    num_returns: int
    owner_id: bytes
    actor_id: bytes = b""
    method: str = ""
    attempt: int = 0
    gpu_ids: tuple[int, ...] = ()  # the GPUs of the lease it runs on (CUDA_VISIBLE_DEVICES)
    owner_node: bytes = b""  # large results on another node are held there for this node


class PushTask(Msg, tag=10):
    spec: TaskSpec


class TaskResult(Msg, tag=11):
    task_id: bytes
    returns: tuple[ReturnObject, ...]
    start_ts: float
    end_ts: float
    worker_pid: int
    node_id: bytes
    cancelled: bool = False


# -- client -> node manager --------------------------------------------------------------------

class RequestLease(Msg, tag=20):
    req_id: int
    shape: dict[str, float]
    strategy: str = ""  # "" | "SPREAD" | "node:<hex id>" | "node:<hex id>:soft"
    preferred_node: bytes = b""  # holds the task's large arguments
    spilled: bool = False  # placed here by the head: grant here, never spill again


class LeaseGranted(Msg, tag=21):
    req_id: int
    lease_id: int
    worker_id: bytes
    address: str
    gpu_ids: tuple[int, ...] = ()


class LeaseSpillback(Msg, tag=28):
    """Ask the node manager at ``address`` (node ``node_id``) for this lease instead."""
    req_id: int
    node_id: bytes
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


class SealObject(Msg, tag=30):
    object_id: bytes
    size: int
    holder: bytes
    actor_id: bytes = b""  # the object is this actor's life: the actor ends when it is freed


class AddHolds(Msg, tag=31):
    object_ids: list[bytes]
    holder: bytes
    node_id: bytes = b""  # the objects' primary node, if not the receiver


class ReleaseHolds(Msg, tag=32):
    object_ids: list[bytes]
    holder: bytes
    node_id: bytes = b""


class ReleaseHolder(Msg, tag=33):
    holder: bytes


class WaitObject(Msg, tag=34):
    req_id: int
    object_id: bytes
    owner_id: bytes
    node_id: bytes = b""  # where the primary copy lives (pulled from there if not here)


class ObjectAvailable(Msg, tag=35):
    req_id: int
    object_id: bytes
    error: str = ""


class CancelTask(Msg, tag=36):
    task_id: bytes
    worker_id: bytes
    force: bool
    recursive: bool = False  # also cancel the tasks it submitted


class StoreStats(Msg, tag=37):
    req_id: int


class StoreStatsReply(Msg, tag=38):
    req_id: int
    stats: dict[str, int]


# -- node manager -> worker --------------------------------------------------------------------

class CancelRunning(Msg, tag=40):
    task_id: bytes
    recursive: bool = False


class WorkerListening(Msg, tag=41):
    address: str  # unix socket, for owners on this node
    tcp_address: str  # for owners on other nodes


class WorkerOutput(Msg, tag=44):
    """Lines a worker printed, forwarded by its node manager to the job's drivers."""
    pid: int
    job_id: bytes
    text: str


class ActorSpec(msgspec.Struct, array_like=True, gc=False):
    actor_id: bytes
    job_id: bytes
    owner_id: bytes
    class_id: bytes
    class_name: str
    args: tuple[TaskArg, ...]
    kwarg_names: tuple[str, ...]
    shape: dict[str, float]  # needed to place the actor
    hold_shape: dict[str, float]  # held while it is alive
    max_restarts: int = 0
    max_task_retries: int = 0
    max_concurrency: int = 1
    is_async: bool = False
    name: str = ""
    namespace: str = ""
    detached: bool = False
    sys_paths: list[str] = []
    strategy: str = ""  # as RequestLease.strategy


class BecomeActor(Msg, tag=42):
    spec: ActorSpec
    gpu_ids: tuple[int, ...] = ()


class ActorReady(Msg, tag=43):
    actor_id: bytes
    error: str = ""  # the constructor's error, with its traceback


# -- head service ------------------------------------------------------------------------------

class RegisterNode(Msg, tag=50):
    node_id: bytes
    address: str  # host:port of the node manager (TCP)
    unix_path: str
    resources: dict[str, float]
    session_dir: str
    transfer_address: str = ""  # gRPC object transfer; sent later by NodeTransferReady


class NodeTransferReady(Msg, tag=64):
    node_id: bytes
    transfer_address: str


class NodeEntry(msgspec.Struct, array_like=True, gc=False):
    node_id: bytes
    address: str
    transfer_address: str
    alive: bool


class NodeTable(Msg, tag=65):
    """The head's node list, sent to every node manager when it changes."""
    nodes: list[NodeEntry]


class NodeDied(Msg, tag=66):
    """Sent to node managers and drivers: tasks, objects and actors there are gone."""
    node_id: bytes
    reason: str


class SpillLease(Msg, tag=67):
    """A node manager asks the global scheduler where a lease request should go."""
    req_id: int
    shape: dict[str, float]
    strategy: str
    preferred_node: bytes
    must_move: bool  # the origin cannot ever run it (infeasible there, or pinned elsewhere)


class LeasePlaced(Msg, tag=68):
    """The global scheduler's answer: a node (possibly the origin itself), or an error."""
    req_id: int
    node_id: bytes
    address: str
    error: str = ""
    infeasible: bool = False  # no node fits yet: an answer follows when one joins


class NodeHeartbeat(Msg, tag=51):
    node_id: bytes
    available: dict[str, float]
    pending_shapes: list[dict[str, float]] = []


class RegisterJob(Msg, tag=52):
    job_id: bytes
    pid: int
    namespace: str
    cwd: str


class CreateActor(Msg, tag=53):
    req_id: int  # 0: no reply wanted
    spec: ActorSpec
    get_if_exists: bool = False


class GetActorInfo(Msg, tag=54):
    req_id: int
    actor_id: bytes
    name: str = ""
    namespace: str = ""
    wait_ready: bool = True
    stale_address: str = ""  # wait for an address other than this one (a restart)


class ActorInfo(Msg, tag=55):
    req_id: int
    actor_id: bytes
    state: str  # PENDING | ALIVE | RESTARTING | DEAD | MISSING
    address: str = ""
    error: str = ""
    spec: ActorSpec | None = None
    tcp_address: str = ""
    node_id: bytes = b""


class KillActor(Msg, tag=56):
    actor_id: bytes
    no_restart: bool = True
    reason: str = ""  # why, for its callers' ActorDiedError (default: rtml.kill())


OUT_OF_SCOPE = "all its handles went out of scope"
"""The reason an actor ends when its life object is freed (see rtml.core.actors)."""


class StartActor(Msg, tag=57):
    spec: ActorSpec


class ActorStarted(Msg, tag=58):
    actor_id: bytes
    worker_id: bytes
    address: str
    error: str = ""
    tcp_address: str = ""
    node_id: bytes = b""


class ActorWorkerDied(Msg, tag=59):
    actor_id: bytes
    reason: str


class KillActorWorker(Msg, tag=60):
    actor_id: bytes


class GetClusterInfo(Msg, tag=61):
    req_id: int


class ClusterInfo(Msg, tag=62):
    req_id: int
    nodes: list[dict[str, object]]


class Shutdown(Msg, tag=63):
    pass


class ObjectsFreed(Msg, tag=69):
    """Primary node -> nodes holding copies: the objects were deleted; drop the copies."""
    object_ids: list[bytes]


class FenceHolds(Msg, tag=70):
    """Client -> its node manager: answer once the holds it forwarded to these nodes
    are in place there (a worker asks before it sends a result that lets its owner
    release what the worker borrowed)."""
    req_id: int
    node_ids: list[bytes]


class HoldsFenced(Msg, tag=71):
    req_id: int


class LinkFence(Msg, tag=72):
    """Node manager -> node manager: answer with LinkFenced once everything sent
    before it on this link is handled."""
    req_id: int


class LinkFenced(Msg, tag=73):
    req_id: int


Message = (
    Hello | HelloReply | PushTask | TaskResult | RequestLease | LeaseGranted | LeaseFailed
    | ReturnLease | CancelLeaseRequest | LeaseInfeasible | WorkerBlocked | WorkerUnblocked | SealObject | AddHolds
    | ReleaseHolds | ReleaseHolder | WaitObject | ObjectAvailable | CancelTask | StoreStats
    | StoreStatsReply | CancelRunning | WorkerListening | WorkerOutput | BecomeActor | ActorReady
    | RegisterNode | NodeHeartbeat | RegisterJob | CreateActor | GetActorInfo | ActorInfo
    | KillActor | StartActor | ActorStarted | ActorWorkerDied | KillActorWorker
    | GetClusterInfo | ClusterInfo | Shutdown | LeaseSpillback | NodeTransferReady | NodeTable
    | NodeDied | SpillLease | LeasePlaced | ObjectsFreed | FenceHolds | HoldsFenced
    | LinkFence | LinkFenced
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
encode = _encoder.encode
decode = _decoder.decode
