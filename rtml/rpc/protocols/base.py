"""What every protocol shares: the message base class, the handshake, and the values
that travel inside messages (payloads, task arguments and returns, task and actor specs).

Each message is a msgspec ``Struct`` encoded as a msgpack array whose first
element is its integer tag, so decoding is a single C call into the right
class. ``PROTOCOL_VERSION`` is checked in the handshake; bump it whenever a message
changes shape.

Messages are plain data (bytes, numbers, strings, and lists and dicts of them), so they
can form no reference cycle: they are kept out of the cyclic collector's sight
(``gc=False``). A burst of calls keeps thousands alive, and tracking them made the
driver's collections cost ~4 us per call. The sequences a task carries are tuples, not
lists, for the same reason: a list is always tracked, and an empty tuple is shared.

Every connection opens with a handshake that proves both sides know the cluster token
without sending it (``rtml.rpc.auth``)::

    listener --Challenge(version, nonce S)-->  connector
    listener <--Hello(..., nonce C, proof = HMAC(token, client, S, C))--
    listener --HelloReply(..., proof = HMAC(token, server, C, S))-->
"""

from __future__ import annotations

from typing import Final

import msgspec

from rtml.ids import (
    NO_ACTOR,
    NO_CLIENT,
    NO_NODE,
    NO_OBJECT,
    UNKNOWN_JOB,
    ActorID,
    ClientID,
    JobID,
    NodeID,
    ObjectID,
    TaskID,
)

PROTOCOL_VERSION = 13

STREAMING: Final = -1
"""``TaskSpec.num_returns`` of a generator task: its items stream to the owner as
``GeneratorItem``s; its one return (index 1) is set when it ends (``completed()``)."""


class Msg(msgspec.Struct, array_like=True, tag=True, omit_defaults=False, gc=False):
    """Base of all wire messages."""


class Challenge(Msg, tag=3):
    """The listening side's first frame: its protocol version, a fresh nonce, and whether
    TLS follows (``rtml.rpc.tls``)."""
    version: int
    nonce: bytes
    tls: bool = False


class Hello(Msg, tag=1):
    version: int
    role: str  # "driver" | "worker" | "node" | "cli"
    client_id: ClientID
    pid: int
    job_id: JobID = UNKNOWN_JOB
    sys_paths: list[str] = []
    node_id: NodeID = NO_NODE  # the node the connecting process runs on
    nonce: bytes = b""  # the connecting side's, fresh for each connection
    proof: bytes = b""  # that it knows the token, for this Challenge and nonce


class HelloReply(Msg, tag=2):
    ok: bool
    error: str = ""
    node_id: NodeID = NO_NODE
    info: dict[str, str] = {}
    proof: bytes = b""  # that the listener knows the token too (empty on a refusal)


class Payload(msgspec.Struct, array_like=True, gc=False):
    """A serialized value: pickle-5 in-band bytes plus its out-of-band buffers."""
    data: bytes
    buffers: tuple[bytes, ...] = ()
    is_error: bool = False


class TaskArg(msgspec.Struct, array_like=True, gc=False):
    """One argument: an inline value, or an object id the worker resolves itself."""
    value: Payload | None = None
    object_id: ObjectID = NO_OBJECT
    node_id: NodeID = NO_NODE  # where the object's primary copy lives
    owner_id: ClientID = NO_CLIENT  # set when the caller borrows it: it may not exist yet


class ReturnObject(msgspec.Struct, array_like=True, gc=False):
    object_id: ObjectID
    value: Payload | None  # None: the value is in the node's shared-memory store
    size: int = 0
    is_error: bool = False
    contained: bool = False  # the value holds refs: held for it by the worker's node manager


class TaskSpec(msgspec.Struct, array_like=True, gc=False):
    task_id: TaskID
    job_id: JobID
    name: str
    function_id: bytes  # hash of the exported function; empty for actor methods
    args: tuple[TaskArg, ...]
    kwarg_names: tuple[str, ...]
    num_returns: int
    owner_id: ClientID
    actor_id: ActorID = NO_ACTOR
    method: str = ""
    attempt: int = 0
    gpu_ids: tuple[int, ...] = ()  # the GPUs of the lease it runs on (CUDA_VISIBLE_DEVICES)
    owner_node: NodeID = NO_NODE  # large results on another node are held there for this node
    resources: dict[str, float] | None = None  # its shape, unless the default 1 CPU
    concurrency_group: str = ""  # an actor call's ("": the actor's default group)
    max_calls: int = 0  # a task's: its worker exits after running its function this often
    capture_group: str = ""  # a placement group (hex) its own tasks and actors run in


class ActorSpec(msgspec.Struct, array_like=True, gc=False):
    actor_id: ActorID
    job_id: JobID
    owner_id: ClientID
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
    life_id: ObjectID = NO_OBJECT  # the object every handle holds (see ActorLives); "" if detached
    owner_node: NodeID = NO_NODE  # where the owner, and so the life object, is
    concurrency_groups: dict[str, int] = {}  # name -> calls at once (beside the default)
    capture_group: str = ""  # as TaskSpec's: for the tasks and actors its methods make
    runtime_env: str = ""  # its runtime env, resolved (rtml.core.runtime_env); "" none


Handshake = Challenge | Hello | HelloReply
"""How every connection opens."""
