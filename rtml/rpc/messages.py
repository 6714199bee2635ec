"""The wire messages of every rtml protocol, and their codec: what every connection
imports (``from rtml.rpc import messages as m``).

Each protocol is defined in its own module of ``rtml.rpc.protocols``, with its diagram:

    base   the message base, the handshake (Challenge / Hello / HelloReply), values inside messages
    task   owner <-> worker                 PushTask / TaskResult
    node   client (driver/worker) <-> node manager: leases, object store, cancel, and
           the node manager's orders to its workers
    link   node manager <-> node manager (TCP): holds, frees of copies, fences
    head   node managers and clients <-> head service: nodes, jobs, actors, placement

A message is decoded by its tag into its class, whichever protocol it belongs to.
"""

from __future__ import annotations

import msgspec

from rtml.rpc.protocols import base, head, link, node, task
from rtml.rpc.protocols.base import (
    PROTOCOL_VERSION,
    STREAMING,
    ActorSpec,
    Challenge,
    Hello,
    HelloReply,
    Msg,
    Payload,
    ReturnObject,
    TaskArg,
    TaskSpec,
)
from rtml.rpc.protocols.head import (
    OUT_OF_SCOPE,
    ActorExiting,
    ActorInfo,
    ActorStarted,
    ActorWorkerDied,
    ClusterInfo,
    CreateActor,
    FlushOutput,
    GetActorInfo,
    GetClusterInfo,
    HostedActor,
    KillActor,
    KillActorWorker,
    LeasePlaced,
    ListNamedActors,
    NamedActors,
    NodeDied,
    NodeEntry,
    NodeHeartbeat,
    NodeInfo,
    NodeTable,
    NodeTransferReady,
    OutputFlushed,
    RegisterJob,
    RegisterNode,
    Shutdown,
    SpillLease,
    StartActor,
)
from rtml.rpc.protocols.link import (
    LinkFence,
    LinkFenced,
    LocateObject,
    ObjectLocated,
    ObjectsFreed,
)
from rtml.rpc.protocols.node import (
    ActorReady,
    AddHolds,
    BecomeActor,
    CancelLeaseRequest,
    CancelRunning,
    CancelTask,
    CreateObject,
    FenceHolds,
    HoldsFenced,
    LeaseFailed,
    LeaseGranted,
    LeaseInfeasible,
    LeaseSpillback,
    ObjectAvailable,
    ObjectCreated,
    ReleaseHolder,
    ReleaseHolds,
    RequestLease,
    ReturnLease,
    SealObject,
    StoreStats,
    StoreStatsReply,
    WaitObject,
    WorkerBlocked,
    WorkerListening,
    WorkerOutput,
    WorkerUnblocked,
)
from rtml.rpc.protocols.task import (
    CancelCall,
    FunctionWanted,
    GeneratorItem,
    PushFunction,
    PushTask,
    TaskResult,
)

__all__ = [
    "ActorExiting", "ActorInfo",
    "ActorReady",
    "ActorSpec",
    "ActorStarted",
    "ActorWorkerDied",
    "AddHolds",
    "BecomeActor",
    "CancelCall",
    "CancelLeaseRequest",
    "CancelRunning",
    "CancelTask",
    "Challenge",
    "ClusterInfo",
    "CreateActor",
    "CreateObject",
    "FlushOutput",
    "FunctionWanted", "GeneratorItem",
    "FenceHolds",
    "GetActorInfo",
    "GetClusterInfo",
    "Hello",
    "HelloReply",
    "HostedActor",
    "HoldsFenced",
    "KillActor",
    "KillActorWorker",
    "LeaseFailed",
    "LeaseGranted",
    "LeaseInfeasible",
    "LeasePlaced", "ListNamedActors", "NamedActors",
    "LeaseSpillback",
    "LinkFence",
    "LinkFenced",
    "LocateObject",
    "Msg",
    "NodeDied",
    "NodeEntry",
    "NodeInfo",
    "NodeHeartbeat",
    "NodeTable",
    "NodeTransferReady",
    "OutputFlushed",
    "OUT_OF_SCOPE",
    "ObjectAvailable",
    "ObjectCreated",
    "ObjectLocated",
    "ObjectsFreed",
    "PROTOCOL_VERSION",
    "STREAMING",
    "Payload",
    "PushFunction",
    "PushTask",
    "RegisterJob",
    "RegisterNode",
    "ReleaseHolder",
    "ReleaseHolds",
    "RequestLease",
    "ReturnLease",
    "ReturnObject",
    "SealObject",
    "Shutdown",
    "SpillLease",
    "StartActor",
    "StoreStats",
    "StoreStatsReply",
    "TaskArg",
    "TaskResult",
    "TaskSpec",
    "WaitObject",
    "WorkerBlocked",
    "WorkerListening",
    "WorkerOutput",
    "WorkerUnblocked",
    "decode",
    "encode",
]

Message = base.Handshake | task.Message | node.Message | link.Message | head.Message

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
encode = _encoder.encode
decode = _decoder.decode
